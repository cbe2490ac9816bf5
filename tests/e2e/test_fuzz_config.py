"""Property: whatever ``key=value`` overrides a user types, ``train --check`` ends in success (exit 0) or in one
``error:`` line with exit 2, never a traceback, and writes nothing either way; and whatever a study file holds,
``sweep --check`` ends in a valid study or one ``error:`` line with exit 2, writing nothing.

Random overrides over the schema's own keys (read from the structured config, so new keys are fuzzed as they are
added) with wrong types, edge numbers (0, −1, NaN, ±inf, 10³⁰), odd strings (``..``, ``/``, NUL, newlines,
unicode, YAML syntax), lists and mappings. ``--check`` runs every check a real run makes before its first write
(schema, rules, the Trainer's arguments, the model built on the meta device), so a config it accepts gets past
the point where a run directory is created. Bounded in the default suite; ``-m slow`` goes deeper.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from tiny import TINY_MODEL

from experiments import cli
from foundation.configfile import flatten
from sweeps.spec.schema import StudySpec
from training.config import CONFIG_DIR, RunConfig

KEYS = sorted(flatten(OmegaConf.to_container(OmegaConf.structured(RunConfig))))
KEYS += ["model.attention.options.k_schedule", "model.attention.options", "data.mqar", "nonsense.key"]

EDGE_NUMBERS = [
    0,
    1,
    -1,
    2,
    3,
    7,
    64,
    0.5,
    -0.5,
    1e-12,
    1e30,
    -1e30,
    2**31,
    2**63,
    float("nan"),
    float("inf"),
    float("-inf"),
]
ODD_TEXT = [
    "",
    " ",
    "..",
    "../..",
    "/",
    "/etc",
    "a\x00b",
    "a\nb",
    "\t",
    "é✓ユニ",
    "~",
    "$HOME",
    "null",
    "true",
    "[1, 2",
    "{a: 1",
    "&a [*a]",
    "*x",
    "%YAML",
    "- 1",
    "auto",
    "full",
    "linformer",
    "cpu",
    "gpu",
    "32-true",
    "bf16-mixed",
    "ddp_spawn",
    "layerwise",
    "keys",
    "compress_first",
    "learned",
    "conv",
    "pool",
    "random",
    "geometric",
    "linear",
]


def render(value) -> str:
    """An override's value as a user could type it: YAML flow syntax, strings double-quoted (JSON escapes are
    YAML escapes, so NUL and newlines reach the loader as characters)."""
    if isinstance(value, float) and value != value:
        return ".nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return ".inf" if value > 0 else "-.inf"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value)


scalars = st.one_of(
    st.sampled_from(EDGE_NUMBERS),
    st.integers(-(10**6), 10**6),
    st.booleans(),
    st.none(),
    st.sampled_from(ODD_TEXT),
    st.text(max_size=12),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=4),
    st.dictionaries(st.sampled_from(["a", "k", "window", "kind", "first", "last"]), scalars, max_size=2),
)
raw = st.sampled_from(
    [
        "[1,2",
        "{a: 1",
        "&a [*a, *a]",
        "a: b: c",
        "!!python/object:os.system",
        "'",
        '"',
        "|",
        "${oc.env:HOME}",
        "${model.d_model}",
    ]
)
override = st.tuples(st.sampled_from(KEYS), st.one_of(values.map(render), raw)).map(lambda kv: f"{kv[0]}={kv[1]}")

TINY = [
    *TINY_MODEL,
    "trainer.accelerator=cpu",
]


def snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def check_property(root: Path, overrides: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    before = snapshot(root)
    argv = [
        "train",
        str(CONFIG_DIR / "base.yaml"),
        *TINY,
        f"output_dir={root / 'runs'}",
        f"data.cache_dir={root / 'cache'}",
        *overrides,
        "--check",
    ]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error:") or "Traceback" in line]
    assert code in (0, 2), (overrides, code, err.getvalue()[-2000:])
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: ") and "\n" not in lines[0], (overrides, lines)
    else:
        assert lines == [] and "config OK" in out.getvalue(), (overrides, err.getvalue())
    assert snapshot(root) == before, (overrides, "something was written")


FAST = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    derandomize=os.environ.get("FUZZ_RANDOM") is None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FAST
@given(overrides=st.lists(override, min_size=1, max_size=4))
def test_any_overrides_end_in_success_or_one_error_line_and_write_nothing(tmp_path, overrides):
    check_property(tmp_path, overrides)


@pytest.mark.slow
@settings(
    max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(overrides=st.lists(override, min_size=1, max_size=6))
def test_any_overrides_deep(tmp_path, overrides):
    check_property(tmp_path, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.devices=[0,1]"],  # a list of indices with the CPU accelerator: Lightning's rule
        ["model.attention.options={window: 4}"],  # options of a kind that takes none
        ["optim.betas=[0.9, .nan]"],
        ['experiment="a\\u0000b"'],
        ["model.attention.options.k_schedule={first: 0, last: 0}"],
        ["model.attention.options.k_schedule={kind: geometric, first: 0, last: 5}"],  # a division by zero, once
        ["model.attention.options.k_schedule={kind: geometric, first: -4, last: 5}"],  # a complex power, once
    ],
)
def test_known_hard_cases(tmp_path, overrides):
    check_property(tmp_path, overrides)


# --------------------------------------------------------------------------------------- study files
STUDY_KEYS = sorted(flatten(OmegaConf.to_container(OmegaConf.structured(StudySpec))))
STUDY_KEYS += [
    "space.seed.type",
    "space.seed.choices",
    "space.seed.low",
    "space.seed.high",
    "space.seed.step",
    "space.seed.when",
    "space.optim.lr.type",
    "space.optim.lr.choices",
    "space.optim.lr.low",
    "space.optim.lr.high",
    "space.optim.lr.log",
    "space.model.dropout.choices",
    "space.arm.choices",
    "objective",
    "overrides.model.d_model",
    "overrides.trainer.max_steps",
    "presets.cpu.budget.n_trials",
    "presets",
    "nonsense",
]


def good_study(root: Path) -> dict:
    overrides = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in TINY)}
    return {
        "study": "fuzzed",
        "base": str(CONFIG_DIR / "base.yaml"),
        "overrides": {**overrides, "output_dir": str(root / "runs"), "data.cache_dir": str(root / "cache")},
        "space": {"seed": {"type": "categorical", "choices": [0, 1]}},
        "sampler": {"kind": "grid"},
    }


def put(study: dict, dotted: str, value) -> None:
    """Set ``dotted`` in the nested study mapping (overrides keep dotted keys of their own: the first part after
    ``overrides.`` names the whole key), replacing whatever is in the way."""
    if dotted.startswith("overrides."):
        study["overrides"][dotted.removeprefix("overrides.")] = value
        return
    parts = dotted.split(".")
    if parts[0] == "space" and len(parts) > 2:  # space.<param with dots>.<field>
        parts = ["space", ".".join(parts[1:-1]), parts[-1]]
    node = study
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


study_change = st.tuples(st.sampled_from(STUDY_KEYS), values)


def check_study_property(root: Path, changes: list) -> None:
    study = good_study(root)
    for key, value in changes:
        put(study, key, value)
    path = root / "study.yaml"
    path.write_text(yaml.safe_dump(study, allow_unicode=True))
    out, err = io.StringIO(), io.StringIO()
    before = snapshot(root)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["sweep", str(path), "--check"])
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error:") or "Traceback" in line]
    assert code in (0, 2), (changes, code, err.getvalue()[-2000:])
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: ") and "\n" not in lines[0], (changes, lines)
    else:
        assert lines == [] and "study OK" in out.getvalue(), (changes, err.getvalue())
    assert snapshot(root) == before, (changes, "something was written")


@settings(
    max_examples=int(os.environ.get("FUZZ_STUDY_EXAMPLES", "40")),
    deadline=None,
    derandomize=os.environ.get("FUZZ_RANDOM") is None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(changes=st.lists(study_change, min_size=1, max_size=3))
def test_any_study_file_ends_in_a_valid_study_or_one_error_line_and_writes_nothing(tmp_path, changes):
    check_study_property(tmp_path, changes)


@pytest.mark.slow
@settings(
    max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(changes=st.lists(study_change, min_size=1, max_size=5))
def test_any_study_file_deep(tmp_path, changes):
    check_study_property(tmp_path, changes)
