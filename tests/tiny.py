"""The tiny model every fast test trains: seconds on a CPU."""

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


def small_model(attention: dict) -> dict:
    """A 2-layer model of width 16 at n = 16 around the given attention node."""
    return {
        "max_len": 16,
        "d_model": 16,
        "n_heads": 2,
        "n_layers": 2,
        "d_ff": 32,
        "dropout": 0.0,
        "attention": attention,
    }
