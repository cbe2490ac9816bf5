"""Test session environment: Hugging Face libraries offline, their caches in a throwaway directory.

Set at import, before any test module imports ``datasets`` (which reads these variables on import).
"""

import atexit
import os
import shutil
import tempfile

_HF_HOME = tempfile.mkdtemp(prefix="linformer-lab-hf-")
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)
os.environ.update(
    # Sweeps in tests start at once and run their tiny arms whatever their control shows; test_preflight.py and
    # test_gate.py in tests/sweeps/run/ turn these on.
    LINFORMER_LAB_PREFLIGHT="0",
    LINFORMER_LAB_GATE="0",
    HF_DATASETS_OFFLINE="1",
    HF_HUB_OFFLINE="1",
    HF_HOME=_HF_HOME,
    HF_DATASETS_CACHE=os.path.join(_HF_HOME, "datasets"),
)

import importlib.util  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from pg import postgres_server, postgres_url  # noqa: E402,F401  (fixtures: a throwaway PostgreSQL server)
from tiny import REPO, TINY_MODEL  # noqa: E402

# The test folders mirror the packages and hold no __init__.py: pytest puts the folder of each test file it imports on
# sys.path (import mode prepend), where a folder beside it would pass for a module of its name that is not installed:
# tests/lightning_modules/attention/linformer/ for the reference library linformer (extra refs) once
# tests/lightning_modules/attention/ is there, an empty package where a test expects an ImportError. A folder name
# that no installed package answers (or only a folder of tests) is made to import nothing, before any test folder
# is on sys.path.
_TESTS = Path(__file__).resolve().parent
for _name in sorted({p.name for p in _TESTS.rglob("*") if p.is_dir() and p.name.isidentifier()} - {"__pycache__"}):
    _spec = importlib.util.find_spec(_name)
    if _spec is None or (
        _spec.origin is None and all(Path(p).resolve().is_relative_to(_TESTS) for p in _spec.submodule_search_locations)
    ):
        sys.modules.setdefault(_name, None)

# The cores shared among pytest-xdist's workers (`make test` starts one per core), at most two torch threads
# each: the tests' models are small, and on cores busy with other work one thread is faster (78 attention
# variants' forward and backward: 5 s with one, 23-25 s with two). LINFORMER_TEST_THREADS sets it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(int(os.environ.get("LINFORMER_TEST_THREADS", max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))))
CONFIGS = REPO / "experiments" / "configs"


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """One tokenizer/block cache for the whole session: tests share the tiny corpus' artefacts."""
    return tmp_path_factory.mktemp("data-cache")


@pytest.fixture
def tiny_overrides(tmp_path, monkeypatch, data_cache):
    """Shrink the base experiment to seconds: a tiny model, a few hundred texts, 6 steps, CPU. A run in this
    process may set this process's threads: they are restored afterwards."""
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    args = [
        "experiment=tiny",
        f"output_dir={tmp_path / 'runs'}",
        *TINY_MODEL,
        "data.max_texts=300",
        "data.batch_size=8",
        "data.tokenizer.vocab_size=300",
        f"data.cache_dir={data_cache}",
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "trainer.limit_val_batches=2",
        "trainer.log_every_n_steps=1",
        "trainer.accelerator=cpu",
        "optim.warmup_steps=2",
    ]
    yield types.SimpleNamespace(config=CONFIGS / "base.yaml", args=args)
    torch.set_num_threads(threads)


_PREPARED: set = set()


@pytest.fixture
def tiny(tiny_overrides, data_cache):
    """``tiny_overrides`` with its data prepared once in this process: workers that start together on an
    empty cache would each tokenize the corpus."""
    if data_cache not in _PREPARED:
        from training import config as run_config
        from training.train import build_datamodule

        datamodule = build_datamodule(run_config.load(tiny_overrides.config, tiny_overrides.args))
        datamodule.prepare_data()
        datamodule.setup("fit")
        _PREPARED.add(data_cache)
    return tiny_overrides
