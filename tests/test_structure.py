"""The house's structure as specifications: kinds are plug-ins, and no code leans on private Optuna or Lightning.

A new projection kind or attention kind is one class registered by name: these tests register one from inside
the test and train it one step through ``train()``, with nothing else changed.
"""

import ast
import math
import re
from pathlib import Path

import pytest
import torch

from foundation.errors import ConfigError
from lightning_modules.attention import ATTENTION_KINDS, SelfAttention, register_attention
from lightning_modules.attention.linformer.projections import PROJECTION_KINDS, ProjectionKind, register_projection
from training import config as run_config
from training.train import train

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("foundation", "lightning_modules", "datamodules", "training", "sweeps", "experiments", "tests")
PRIVATE_IMPORT = re.compile(
    r"^\s*(from|import)\s+(optuna|lightning|pytorch_lightning)[\w.]*\._\w*"
    r"|^\s*from\s+(optuna|lightning)[\w.]*\s+import\s+.*\b_[A-Za-z]",
    re.MULTILINE,
)


def test_no_module_imports_a_private_optuna_or_lightning_module():
    offenders = [
        f"{path.relative_to(ROOT)}: {m.group(0).strip()}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for m in PRIVATE_IMPORT.finditer(path.read_text())
    ]
    assert offenders == []


def test_the_private_import_check_would_catch_one():
    assert PRIVATE_IMPORT.search("from optuna.storages._heartbeat import BaseHeartbeat")
    assert PRIVATE_IMPORT.search("from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher")
    assert not PRIVATE_IMPORT.search("from optuna.storages import RetryHeartbeatStaleTrialCallback")


def dct_rows(k: int, n: int) -> torch.Tensor:
    """The first k rows of the orthonormal DCT-II matrix of size n: E_jt = c_j cos(π (t + ½) j / n)."""
    t, j = torch.arange(n, dtype=torch.float64), torch.arange(k, dtype=torch.float64)[:, None]
    scale = torch.full((k, 1), math.sqrt(2.0 / n), dtype=torch.float64)
    scale[0] = math.sqrt(1.0 / n)
    return (scale * torch.cos(math.pi * (t + 0.5) * j / n)).float()


@pytest.fixture
def dct_projection():
    """A fixed projection kind, registered for the test only: E = the k lowest DCT-II frequencies."""

    @register_projection("dct")
    class DCT(ProjectionKind):
        trainable = False  # fixed: a buffer, saved with the checkpoint

        def draw(self, shape, init, fan_in, k, std):
            if len(shape) != 4:
                raise ValueError("the dct projection is dense (no causal or windowed form)")
            sides, groups, k, n = shape
            return dct_rows(k, n).expand(sides, groups, k, n).clone()

    yield DCT
    del PROJECTION_KINDS["dct"]


def test_a_projection_kind_registered_in_a_test_trains_one_step_through_train(dct_projection, tiny_overrides):
    cfg = run_config.load(
        tiny_overrides.config,
        [
            *tiny_overrides.args,
            "model.attention.options.projection=dct",
            "trainer.max_steps=1",
            "trainer.val_check_interval=1",
        ],
    )
    metrics = train(cfg)
    assert metrics["global_step"] == 1 and math.isfinite(metrics["val/loss"])
    assert metrics["projection_parameters"] == 0  # fixed: nothing to learn
    state = torch.load(Path(metrics["run_dir"]) / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    stored = [v for k, v in state.items() if k.startswith("encoder.shared.weight_")]
    assert stored and all(torch.equal(w[0, 0], dct_rows(8, 32)) for w in stored)  # saved, never redrawn


def test_an_unregistered_projection_kind_is_one_config_line():
    with pytest.raises(
        ConfigError, match=r"^model.attention.options.projection: unknown projection kind 'dct' \(allowed: "
    ):
        run_config.load(run_config.CONFIG_DIR / "base.yaml", ["model.attention.options.projection=dct"])


@pytest.fixture(params=["attend_qkv", "attend"])
def mean_attention(request):
    """An attention kind registered for the test only: every query averages the real tokens' values, written
    through either hook of the base class (Q, K, V from one product; or X and Q, K and V made by the kind)."""

    def mean(q, v, mask):  # (B, h, T, d_h) each → (B, h, T, d_h)
        m = v.new_ones(v.shape[0], v.shape[2]) if mask is None else mask.to(v.dtype)  # (B, T)
        weights = m[:, None, None, :] / m.sum(-1)[:, None, None, None]  # (B, 1, 1, T)
        return (weights @ v).expand_as(q)

    if request.param == "attend_qkv":

        @register_attention("mean")
        class MeanAttention(SelfAttention):
            has_causal_form = False

            def attend_qkv(self, q, k, v, mask, dropout_p):
                return mean(q, v, mask)

    else:

        @register_attention("mean")
        class MeanAttention(SelfAttention):
            has_causal_form = False

            def attend(self, x, q, mask, dropout_p):
                return mean(q, self.keys_values(x)[1], mask)

    yield MeanAttention
    del ATTENTION_KINDS["mean"]


def test_an_attention_kind_registered_in_a_test_trains_one_step_through_train(mean_attention, tiny_overrides):
    cfg = run_config.load(
        tiny_overrides.config,
        [*tiny_overrides.args, "model.attention.kind=mean", "trainer.max_steps=1", "trainer.val_check_interval=1"],
    )
    metrics = train(cfg)
    assert metrics["global_step"] == 1 and math.isfinite(metrics["val/loss"])
    with pytest.raises(ConfigError, match="^model.attention.causal: kind 'mean' has no causal form"):
        run_config.load(
            tiny_overrides.config,
            [*tiny_overrides.args, "task=clm", "model.attention.kind=mean", "model.attention.causal=true"],
        )


def test_one_product_for_q_k_v_equals_the_three_projections_and_their_gradients():
    from lightning_modules.attention import build_attention

    torch.manual_seed(0)
    layer = build_attention({"max_len": 8, "d_model": 16, "n_heads": 2, "attention": {"kind": "full"}})
    x = torch.randn(2, 8, 16, requires_grad=True)
    fused = layer.queries_keys_values(x)
    apart = (layer.heads(layer.q_proj(x)), *layer.keys_values(x))
    for a, b in zip(fused, apart):
        torch.testing.assert_close(a, b)
    weights = [torch.randn_like(t) for t in fused]
    grads = [
        torch.autograd.grad(
            sum((t * w).sum() for t, w in zip(ts, weights)),
            [x, *(p for name, p in layer.named_parameters() if not name.startswith("out_proj"))],
        )
        for ts in (fused, apart)
    ]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_a_kinds_option_beside_the_kind_is_one_line_naming_where_it_belongs():
    for key, kind in (("k", "linformer"), ("share", "linformer"), ("window", "local"), ("n_features", "performer")):
        with pytest.raises(ConfigError) as err:
            run_config.load(run_config.CONFIG_DIR / "base.yaml", [f"model.attention.{key}=1"])
        assert str(err.value) == (
            f"model.attention.{key}: an option of kind '{kind}': write model.attention.options.{key}"
        )


def test_changing_the_kind_starts_from_the_new_kinds_options():
    """Options belong to the kind beside them: another kind drops them, the options it is given are kept."""
    cfg = run_config.load(run_config.CONFIG_DIR / "base.yaml", ["model.attention.kind=full"])
    assert cfg.model.attention.options == {}
    cfg = run_config.load(
        run_config.CONFIG_DIR / "base.yaml", ["model.attention.kind=local", "model.attention.options.window=4"]
    )
    assert cfg.model.attention.options == {"window": 4}
    cfg = run_config.load(run_config.CONFIG_DIR / "base.yaml", ["model.attention.options.k=8"])
    assert cfg.model.attention.options.k == 8 and cfg.model.attention.options.share == "none"
    with pytest.raises(ConfigError, match=r"^model.attention.options: kind 'full' takes no options, got \{'k': 8\}"):
        run_config.load(
            run_config.CONFIG_DIR / "base.yaml", ["model.attention.kind=full", "model.attention.options.k=8"]
        )


def test_full_attention_without_a_mask_equals_it_with_an_all_true_mask():
    from lightning_modules.attention import build_attention

    torch.manual_seed(0)
    layer = build_attention({"max_len": 8, "d_model": 16, "n_heads": 2, "attention": {"kind": "full", "causal": True}})
    x = torch.randn(2, 8, 16)
    torch.testing.assert_close(layer(x), layer(x, torch.ones(2, 8, dtype=torch.bool)), atol=1e-6, rtol=1e-6)


# The files outside lightning_modules/attention/ that name a kind: the schema's default kind, and the parity bench's
# table of how each kind's reference library builds its own layer (third-party code, kept beside the bench).
NAMES_KINDS = {
    "lightning_modules/config.py",
    "experiments/benchmarks/parity.py",
    # the bench's knowledge per kind (its variants at Linformer's budget, its library race), kept out of the model
    "experiments/benchmarks/variants.py",
}


def _string_constants(tree: ast.AST) -> list[ast.Constant]:
    """Every str constant of a module's code, docstrings left out (they describe, they do not branch)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_code_outside_the_attention_plug_ins_names_an_attention_kind():
    """What callers need from a kind is a method of the kind: no kind's name is a string value in code outside
    lightning_modules/attention/ (and the tests); messages may name one in an example."""
    root = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted(root.glob("[a-z]*/**/*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("lightning_modules/attention/", "tests/", ".venv/")) or rel in NAMES_KINDS:
            continue
        for node in _string_constants(ast.parse(path.read_text(encoding="utf-8"))):
            if node.value in ATTENTION_KINDS:  # a kind's name as a value: a switch or a table on kinds
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "attention kinds named outside the plug-ins:\n" + "\n".join(found)


# Linformer's E/F machinery by name: the layer's and the bank's attributes, the projection-kind registry and the E/F
# analysis. Code outside its plug-in reaches them through kind hooks only (build_shared, no_decay_parameters,
# projection_parameters, analyze_shared, spectrum_suggestions, ...), never by these names.
LINFORMER_NAMES = re.compile(
    r"\b(bank|ProjectionBank|ProjectionKind|PROJECTION_KINDS|register_projection|compressed_side|nonempty_slots"
    r"|block_weights|compress_block|distinct_projections|projection_operator|projection_report)\b"
)
LINFORMER_PLUG_IN = "lightning_modules/attention/linformer/"


def test_no_code_outside_the_linformer_plug_in_names_its_e_f_machinery():
    found = [
        f"{rel}:{lineno}: {m.group(0)}"
        for path in sorted(ROOT.glob("[a-z]*/**/*.py"))
        if not (rel := path.relative_to(ROOT).as_posix()).startswith((LINFORMER_PLUG_IN, "tests/"))
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for m in LINFORMER_NAMES.finditer(line)
    ]
    assert not found, "Linformer's names outside its plug-in:\n" + "\n".join(found)
    assert not (ROOT / "lightning_modules" / "projections.py").exists()


def test_the_linformer_name_check_would_catch_one():
    assert LINFORMER_NAMES.search('(no_decay if ".bank." in f".{name}" else decay)')
    assert LINFORMER_NAMES.search("from lightning_modules.projections import ProjectionBank")
    assert not LINFORMER_NAMES.search("self.shared = attention.build_shared(cfg)  # banked")


def test_the_parity_benchs_library_kind_exists_only_while_it_trains():
    """Importing the parity bench registers nothing: the registry lists the suite's kinds alone."""
    from experiments.benchmarks import parity
    from lightning_modules.attention import ATTENTION_KINDS

    assert parity.LIBRARY not in ATTENTION_KINDS
    with parity.library_kind():
        assert ATTENTION_KINDS[parity.LIBRARY] is parity.LibraryAttention
    assert parity.LIBRARY not in ATTENTION_KINDS


# ------------------------------------------------------------------------------ the tier of tests that start processes
# A test that starts a child process (a CLI run, a sweep worker, DDP ranks, loader workers) carries the marker
# ``processes`` (pyproject.toml), so ``make test-fast`` (-m "not processes") leaves out exactly those. The check reads
# each test module's code: what names subprocess, multiprocessing, Popen or sys.executable must carry the marker,
# module-wide (``pytestmark``) or on each test that reaches it, directly or through the module's own helpers and
# fixtures. A process started another way (a sweep command's workers) is marked by hand.
PROCESS_MODULES = {"subprocess", "multiprocessing"}
PROCESS_MARK = "mark.processes"


def _names_a_process(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Import) and any(a.name.split(".")[0] in PROCESS_MODULES for a in n.names):
            return True
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in PROCESS_MODULES:
            return True
        if isinstance(n, ast.Name) and (n.id in PROCESS_MODULES or n.id == "Popen"):
            return True
        if isinstance(n, ast.Attribute) and (
            n.attr == "Popen" or (n.attr == "executable" and isinstance(n.value, ast.Name) and n.value.id == "sys")
        ):
            return True
    return False


def process_tier_offenders(source: str) -> list[str]:
    """The tests of a module (its source) that start a child process without the marker ``processes``; a module
    that names one where no test is marked is an offender as a whole ("<module>")."""
    tree = ast.parse(source)
    if any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
        and PROCESS_MARK in ast.unparse(n.value)
        for n in tree.body
    ):
        return []
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    # The module's helpers and fixtures that start processes, through one another: grown to a fixed point.
    starting = {name for name, f in functions.items() if _names_a_process(f)}
    grown = True
    while grown:
        reached = {
            name
            for name, f in functions.items()
            if name not in starting
            and (
                any(isinstance(n, ast.Name) and n.id in starting for n in ast.walk(f))
                or any(a.arg in starting for a in f.args.args)  # a fixture it takes
            )
        }
        starting |= reached
        grown = bool(reached)
    marked = {name for name, f in functions.items() if any(PROCESS_MARK in ast.unparse(d) for d in f.decorator_list)}
    offenders = sorted(name for name in starting - marked if name.startswith("test_"))
    if not offenders and not (marked & {n for n in functions if n.startswith("test_")}):
        if any(_names_a_process(n) for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            offenders.append("<module>")
    return offenders


def test_every_test_that_starts_a_process_carries_the_processes_marker():
    found = [
        f"{path.relative_to(ROOT).as_posix()}: {name}"
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        for name in process_tier_offenders(path.read_text(encoding="utf-8"))
    ]
    assert not found, "tests that start a process without @pytest.mark.processes:\n" + "\n".join(found)


def test_the_process_tier_check_would_catch_one():
    helper = "import subprocess, sys\n\ndef launch():\n    return subprocess.Popen([sys.executable, '-c', 'pass'])\n\n"
    fixture = "@pytest.fixture\ndef child():\n    yield launch()\n\n"
    assert process_tier_offenders(helper + "def test_a():\n    launch().wait()\n") == ["test_a"]
    assert process_tier_offenders(helper + fixture + "def test_b(child):\n    child.wait()\n") == ["test_b"]
    assert process_tier_offenders("import multiprocessing\n\ndef test_c():\n    pass\n") == ["<module>"]
    assert process_tier_offenders("import sys\n\ndef test_d():\n    print(sys.executable)\n") == ["test_d"]
    marked = "@pytest.mark.processes\ndef test_a():\n    launch().wait()\n\ndef test_e():\n    pass\n"
    assert process_tier_offenders(helper + marked) == []
    assert (
        process_tier_offenders("pytestmark = pytest.mark.processes\n" + helper + "def test_a():\n    launch()\n") == []
    )
    assert process_tier_offenders("import sys\n\ndef test_f():\n    print(sys.argv)\n") == []


# -------------------------------------------------------------------------------------------- where a test file lies
# tests/ mirrors the packages: the tests of a module lie under its package's path in tests/ (lightning_modules/
# attention/local.py → tests/lightning_modules/attention/test_local.py), named after the module where one module is
# their subject. Cross-cutting tests lie at the top of tests/ (the house's structure, its security, its pages) or in
# tests/e2e/ (the commands end to end: hostile input, config fuzzing, crash safety, run folders). The helpers tests
# share lie at the top of tests/, on pytest's pythonpath. No test folder holds an __init__.py: pytest puts each test file's folder
# on sys.path (import mode prepend) and imports the file by its name, so no two test files share a name.
MIRRORED = tuple(p for p in PACKAGES if p != "tests")
CROSS_CUTTING = {"test_pages.py", "test_security.py", "test_structure.py"}
CROSS_CUTTING_FOLDERS = {"e2e"}
HELPERS = {"conftest.py", "kinds.py", "page_claims.py", "pg.py", "studies.py", "tiny.py"}


def layout_offenders(root: Path) -> list[str]:
    """The Python files under ``root``/tests that lie outside the layout: a test in a folder that mirrors no package
    (one holding modules) and is not cross-cutting, a test at the top of tests/ outside ``CROSS_CUTTING``, a helper
    anywhere but at the top of tests/ (and in ``HELPERS``), an __init__.py, a test file's name taken twice."""
    tests, found, first = root / "tests", [], {}
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests)
        folder = rel.parent.as_posix()
        where = f"tests/{rel.as_posix()}"
        if path.name == "__init__.py":
            found.append(f"{where}: an __init__.py (test folders are no packages: test file names are unique instead)")
        elif not path.name.startswith("test_"):
            if folder != "." or path.name not in HELPERS:
                found.append(f"{where}: a helper lies at the top of tests/ and is one of HELPERS")
        elif folder == ".":
            if path.name not in CROSS_CUTTING:
                found.append(f"{where}: a test at the top of tests/ is a cross-cutting one (CROSS_CUTTING)")
        elif folder not in CROSS_CUTTING_FOLDERS and not (
            rel.parts[0] in MIRRORED and any((root / folder).glob("*.py"))
        ):
            found.append(f"{where}: {folder}/ mirrors no package and is not a cross-cutting folder")
        if path.name.startswith("test_"):
            if path.name in first:
                found.append(f"{where}: {first[path.name]} has its name")
            first.setdefault(path.name, where)
    return found


def test_every_test_file_lies_under_the_package_it_tests_or_among_the_cross_cutting_ones():
    assert layout_offenders(ROOT) == []


def test_the_layout_check_would_catch_one(tmp_path):
    for module in ("sweeps/spec/study.py", "training/train.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    for test in (
        "tiny.py",
        "test_structure.py",
        "e2e/test_hostile_input.py",
        "sweeps/spec/test_study.py",
        "sweeps/specs/test_grids.py",
        "test_loose.py",
        "sweeps/helpers.py",
        "sweeps/__init__.py",
        "training/test_study.py",
    ):
        (tmp_path / "tests" / test).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / test).write_text("")
    assert [line.split(":")[0] for line in layout_offenders(tmp_path)] == [
        "tests/sweeps/__init__.py",
        "tests/sweeps/helpers.py",
        "tests/sweeps/specs/test_grids.py",
        "tests/test_loose.py",
        "tests/training/test_study.py",
    ]


# --------------------------------------------------------------------------------------- functions and the README
MAX_FUNCTION_LINES = 59  # the house keeps a function under 60 lines, a test's included


def long_functions(source: str) -> list[str]:
    """The functions of ``source`` that span 60 lines or more (decorators aside), as ``name (N lines)``."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_no_function_of_ours_spans_60_lines_or_more():
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in long_functions(path.read_text())
    ]
    assert found == []


def test_the_long_function_check_would_catch_one():
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    assert long_functions(f"def fits():\n{body}") == []
    assert long_functions(f"def spills():\n{body}    return 0\n") == ["spills (60 lines)"]


def readme_layout_offenders(readme: str, root: Path) -> list[str]:
    """The file and folder names of the README's layout table (backticked ``name.py`` and ``name/``) that its row's
    folder does not hold (at any depth): a layout a newcomer cannot find."""
    found = []
    for row in re.findall(r"^\| `(\w+)/` \|([^\n]*)$", readme, re.MULTILINE):
        folder, text = root / row[0], row[1]
        for name in re.findall(r"`([\w*]+(?:\.py|/))`", text):
            kind = "folder" if name.endswith("/") else "file"
            matches = [p for p in folder.rglob(name.rstrip("/")) if p.is_dir() == (kind == "folder")]
            if "*" not in name and not matches:
                found.append(f"{row[0]}/: no {kind} {name}")
    return found


def test_the_readme_layout_names_what_the_tree_holds():
    assert readme_layout_offenders((ROOT / "README.md").read_text(), ROOT) == []


def test_the_readme_layout_check_would_catch_one(tmp_path):
    (tmp_path / "sweeps" / "spec").mkdir(parents=True)
    (tmp_path / "sweeps" / "spec" / "study.py").write_text("")
    readme = "| `sweeps/` | `spec/` with `study.py`, `sweep.py` and `report/` | `training` |\n"
    assert readme_layout_offenders(readme, tmp_path) == ["sweeps/: no file sweep.py", "sweeps/: no folder report/"]


# --------------------------------------------------------------------------------------- links between the documents
def page_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but ``-`` and ``_`` dropped, spaces to
    ``-``, ``-1``, ``-2`` … for a repeat; a heading inside a code fence is none."""
    seen: dict[str, int] = {}
    anchors, fenced = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
            slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def link_offenders(root: Path) -> list[str]:
    """Links ``page.md#anchor`` (in the README, docs, study and experiment files, code) and ``(#anchor)`` within a page
    whose page or heading does not exist."""
    pages = {p.name: p for p in [root / "README.md", *(root / "docs").glob("*.md")] if p.exists()}
    anchors = {name: page_anchors(p.read_text()) for name, p in pages.items()}
    files = [*pages.values(), *(root / "sweeps").rglob("*.yaml"), *(root / "experiments").rglob("*.yaml")]
    files += [p for package in PACKAGES if package != "tests" for p in (root / package).rglob("*.py")]
    found = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            links = re.findall(r"([\w./-]*\.md)#([^)\s`\"',]+)", line)
            if path.suffix == ".md":
                links += [(path.name, a) for a in re.findall(r"\]\(#([^)\s]+)\)", line)]
            for page, anchor in links:
                name = Path(page).name
                if anchor not in anchors.get(name, ()):
                    found.append(f"{path.relative_to(root)}:{number}: {page}#{anchor}")
    return found


def test_every_link_to_a_heading_names_one_that_exists():
    assert link_offenders(ROOT) == []


def test_the_link_check_would_catch_one(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Lab\n\n[ok](docs/a.md#the-b-part) [gone](docs/a.md#renamed) [up](#lab)\n")
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## The B part\n\n```\n# not a heading\n```\n[x](#not-a-heading)\n")
    assert link_offenders(tmp_path) == ["README.md:3: docs/a.md#renamed", "docs/a.md:8: a.md#not-a-heading"]
    assert page_anchors("# A\n## B\n## B\n") == {"a", "b", "b-1"}
