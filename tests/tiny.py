"""The tiny model every fast test trains: seconds on a CPU."""

TINY_MODEL = [
    "model.max_len=32",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=2",
    "model.d_ff=64",
    "model.attention.k=8",
]
