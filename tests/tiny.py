"""The tiny model every fast test trains: seconds on a CPU."""

import os
from pathlib import Path

# The repository's root, wherever in tests/ the test that asks lies.
REPO = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict:
    """This process's environment for a child Python process that imports the project: the repository first on
    ``PYTHONPATH``, the entries already there kept (a machine whose packages are installed into a ``--target``
    folder named on ``PYTHONPATH``, as the GPU check installs optuna and omegaconf, would otherwise give the child
    none of them), and ``extra`` on top."""
    path = [str(REPO), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


TINY_MODEL = [
    "model.max_len=32",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=2",
    "model.d_ff=64",
    "model.attention.options.k=8",
]


def attention(kind: str = "linformer", causal: bool = False, dropout: float = 0.0, **options) -> dict:
    """A ``model.attention`` node: the kind, its causality and dropout, and the kind's own options."""
    return {"kind": kind, "causal": causal, "dropout": dropout, "options": options}


# Every kind but Linformer (whose variants tests/lightning_modules/attention/test_contract.py lists) at n = 16, by case name → (kind, options):
# each a real restriction of full attention, not its limit.
KINDS = {
    "full": ("full", {}),
    "local": ("local", {"window": 5, "n_global": 1}),
    "local_no_global": ("local", {"window": 4}),
    "sparse_fixed": ("sparse", {"pattern": "fixed", "block": 4, "summary": 1}),
    "sparse_strided": ("sparse", {"pattern": "strided", "block": 3, "stride": 5}),
    "lsh": ("lsh", {"bucket_size": 4, "n_hashes": 2}),
    "performer": ("performer", {"n_features": 8}),
    "nystrom": ("nystrom", {"n_landmarks": 4}),
    "no_context": ("no_context", {}),
}


def model(attention: dict, n: int = 16, d: int = 16, h: int = 2, layers: int = 2, d_ff: int = 32, **settings) -> dict:
    """A model config around the attention node: n positions, width d, h heads, ``layers`` blocks of feed-forward
    width d_ff, no dropout; ``settings`` any other ``model`` keys (norm, position, init_std, ...)."""
    return {
        "max_len": n,
        "d_model": d,
        "n_heads": h,
        "n_layers": layers,
        "d_ff": d_ff,
        "dropout": 0.0,
        "attention": attention,
        **settings,
    }


def randomise_biases(module) -> None:
    """Every bias drawn from N(0, 1): a padded position then carries a value unless the kind keeps it out."""
    import torch

    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.normal_()


def encoder(attention: dict, seed: int = 0, vocab: int = 40, random_biases: bool = False, **sizes):
    """A :class:`TransformerEncoder` of :func:`model` (``sizes``: its arguments) drawn from ``seed``, over ``vocab``
    token ids, in training mode; ``random_biases``: :func:`randomise_biases` applied."""
    import torch

    from lightning_modules.encoder import TransformerEncoder

    torch.manual_seed(seed)
    enc = TransformerEncoder(model(attention, **sizes), vocab_size=vocab)
    if random_biases:
        randomise_biases(enc)
    return enc


def layer(attention: dict, n: int = 16, d: int = 16, h: int = 2, shared=None):
    """One attention layer of width d, h heads, n positions (``build_attention``); ``shared`` the module its kind
    shares (None: the layer builds and owns its own)."""
    from lightning_modules.attention import build_attention

    return build_attention({"max_len": n, "d_model": d, "n_heads": h, "attention": attention}, shared=shared)


def data_cfg(tmp_path, **overrides):
    """A ``data`` config (the schema's defaults) caching under ``tmp_path/cache``, with ``overrides``."""
    from omegaconf import OmegaConf

    from datamodules.config import DataConfig

    return OmegaConf.merge(OmegaConf.structured(DataConfig), {"cache_dir": str(tmp_path / "cache"), **overrides})


def rank_r_stochastic(n: int, r: int, seed: int = 0):
    """A row-stochastic n×n matrix of rank r (float64): rows are mixtures of r probability vectors."""
    import torch

    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(n, r, generator=g, dtype=torch.float64).softmax(-1)
    bases = torch.randn(r, n, generator=g, dtype=torch.float64).softmax(-1)
    return mix @ bases


def run_of(experiment_folder: Path, version: int = 0) -> Path:
    """The ``version_<version>`` run directory that ``linformer-lab train`` wrote in ``experiment_folder``
    (``runs/<experiment>``): directly in it, or in the one folder its overrides name (``kind=full/version_0``)."""
    found = sorted(Path(experiment_folder).glob(f"version_{version}")) + sorted(
        Path(experiment_folder).glob(f"*/version_{version}")
    )
    assert len(found) == 1, found
    return found[0]
