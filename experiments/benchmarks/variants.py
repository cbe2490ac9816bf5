"""What the bench knows of each attention kind, kept beside the bench and out of the model: the variants it times
at Linformer's budget (``bench --variants``, :data:`BENCH_VARIANTS`) and the public library it races
(``bench --levels libraries`` and ``--levels parity``, :data:`REFERENCES`), with how that library's layer is
built and matched to the project's.

Budget: at Linformer's k, each query attends to about k slots at sequence length n, as Linformer's queries do
(``docs/head_to_head.md``, "Budget matching"). One section per kind below; a new kind adds its function to
:data:`BENCH_VARIANTS` (and, where it has a public implementation, its :class:`Reference` to :data:`REFERENCES`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from lightning_modules.attention.base import SelfAttention

# The library's layer, x (B, n, d) → (B, n, d); whether both layers compute the same function (their outputs are
# then compared); the modules holding the library layer's parameters beyond the project's layer.
Matched = tuple[Callable[[Tensor], Tensor], bool, tuple[nn.Module, ...]]


@dataclass(frozen=True)
class Reference:
    """A kind's public implementation and how the race matches it to the project's layer."""

    variant: str  # the bench variant that races the library
    package: str  # its pip name
    module: str  # its import name
    # (n, k) → the ``model.attention`` dict of the project's side
    attention: Callable[[int, int], dict]
    # (the project's layer, the imported library, n, k) → the library's layer matched to it
    layer: Callable[[SelfAttention, Any, int, int], Matched]


def _of(kind: str, **options: Any) -> dict:
    return {"kind": kind, "options": options}


def _merged(ours: SelfAttention, out: Tensor) -> Tensor:
    """(B, h, n, d_h) → (B, n, d) through the project layer's W_o."""
    b, _, t, _ = out.shape
    return ours.out_proj(out.transpose(1, 2).reshape(b, t, ours.d_model))


def _around(ours: SelfAttention, core: Callable[[Tensor, Tensor, Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """A library's attention core (Q, K, V each (B, h, n, d_h) → (B, h, n, d_h)) between the project layer's
    projections: x → W_o core(Q, K, V)."""
    return lambda x: _merged(ours, core(*ours.queries_keys_values(x)))


# ------------------------------------------------------------------------------ linformer
def _linformer_variants(k: int, n: int) -> dict[str, dict]:
    """One variant per sharing mode and projection kind, the causal form, and k falling from k in the first layer
    to k/4 in the last (``nonuniform``: equals ``learned`` for one layer)."""
    return {
        "learned": _of("linformer", k=k),  # E_i, F_i per head (Eq. 7)
        "headwise": _of("linformer", k=k, share="headwise"),
        "kv": _of("linformer", k=k, share="kv"),
        "layerwise": _of("linformer", k=k, share="layerwise"),
        "random": _of("linformer", k=k, projection="random"),
        "conv": _of("linformer", k=k, projection="conv"),
        "pool": _of("linformer", k=k, projection="pool"),
        "causal": {**_of("linformer", k=k), "causal": True},
        "nonuniform": _of("linformer", k_schedule={"kind": "linear", "first": k, "last": max(1, k // 4)}),
    }


def _linformer_attention(n: int, k: int) -> dict:
    """One E and one F per layer shared by the heads, keys and values projected before they are compressed."""
    att = _linformer_variants(min(k, n), n)["headwise"]
    att["options"]["order"] = "project_first"
    return att


def _linformer_layer(ours: SelfAttention, library: Any, n: int, k: int) -> Matched:
    """lucidrains' ``linformer.LinformerSelfAttention(k=k)`` with the project layer's weights, E and F (its Q/K/V
    biases zeroed here: the library has none)."""
    theirs = library.LinformerSelfAttention(dim=ours.d_model, seq_len=n, k=min(k, n), heads=ours.n_heads)
    e, f = ours.shared.matrices(0, n)  # (1, k, n) each: one E and one F for every head
    with torch.no_grad():
        for mine, its in ((ours.q_proj, theirs.to_q), (ours.k_proj, theirs.to_k), (ours.v_proj, theirs.to_v)):
            mine.bias.zero_()
            its.weight.copy_(mine.weight)
        theirs.to_out.load_state_dict(ours.out_proj.state_dict())
        theirs.proj_k.copy_(e[0].T)
        theirs.proj_v.copy_(f[0].T)
    return theirs, True, (theirs,)  # the project's layer owns its E and F


# ------------------------------------------------------------------------------ local
def _local_variants(k: int, n: int) -> dict[str, dict]:
    """A window of k positions."""
    return {"local": _of("local", window=min(k, n))}


def _local_attention(n: int, k: int) -> dict:
    """A window of 2⌊k/2⌋ + 1: |i − j| ≤ ⌊k/2⌋, as the library's look-backward and look-forward windows."""
    return _of("local", window=min(n, 2 * max(1, k // 2) + 1))


def _local_layer(ours: SelfAttention, library: Any, n: int, k: int) -> Matched:
    """local-attention's ``LocalAttention(window_size=⌊k/2⌋, look_backward=1, look_forward=1,
    exact_windowsize=True)`` between the project layer's projections (the windows differ at the edges: not
    compared)."""
    core = library.LocalAttention(
        window_size=max(1, k // 2),
        causal=False,
        look_backward=1,
        look_forward=1,
        exact_windowsize=True,
        autopad=True,
    )
    return _around(ours, core), False, ()


# ------------------------------------------------------------------------------ lsh
def _lsh_variants(k: int, n: int) -> dict[str, dict]:
    """Buckets of k keys, one hash round."""
    return {"lsh": _of("lsh", bucket_size=min(k, n), n_hashes=1)}


def _lsh_attention(n: int, k: int) -> dict:
    """The bench variant ``lsh``."""
    return _lsh_variants(k, n)["lsh"]


def _lsh_layer(ours: SelfAttention, library: Any, n: int, k: int) -> Matched:
    """reformer-pytorch's ``LSHAttention(bucket_size=k, n_hashes=1, attend_across_buckets=False,
    allow_duplicate_attention=False)`` on the project layer's shared QK and V (it draws new rotations every call:
    not compared)."""
    core = library.LSHAttention(
        bucket_size=min(k, n),
        n_hashes=1,
        causal=False,
        attend_across_buckets=False,
        allow_duplicate_attention=False,
    )

    def theirs(x: Tensor) -> Tensor:
        q, v = ours.projected(x, "qv")  # (B, h, n, d_h): shared QK, as in the project's layer
        out = core(q.flatten(0, 1), v.flatten(0, 1))[0]  # (B·h, n, d_h)
        return _merged(ours, out.view_as(v))

    return theirs, False, ()


# ------------------------------------------------------------------------------ nystrom
def _nystrom_variants(k: int, n: int) -> dict[str, dict]:
    """k landmarks."""
    return {"nystrom": _of("nystrom", n_landmarks=min(k, n))}


def _nystrom_attention(n: int, k: int) -> dict:
    """The bench variant ``nystrom``."""
    return _nystrom_variants(k, n)["nystrom"]


def _nystrom_layer(ours: SelfAttention, library: Any, n: int, k: int) -> Matched:
    """nystrom-attention's ``NystromAttention(num_landmarks=k, residual=False)`` with the project layer's Q/K/V/O
    weights and iterations (its Q/K/V biases zeroed here: the library has none)."""
    theirs = library.NystromAttention(
        dim=ours.d_model,
        dim_head=ours.d_head,
        heads=ours.n_heads,
        num_landmarks=min(k, n),
        pinv_iterations=ours.pinv_iterations,
        residual=False,
    )
    with torch.no_grad():
        for proj in (ours.q_proj, ours.k_proj, ours.v_proj):
            proj.bias.zero_()
        theirs.to_qkv.weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.to_out[0].load_state_dict(ours.out_proj.state_dict())
    return theirs, True, (theirs,)


# ------------------------------------------------------------------------------ performer
def _performer_variants(k: int, n: int) -> dict[str, dict]:
    """k random features."""
    return {"performer": _of("performer", n_features=k)}


def _performer_attention(n: int, k: int) -> dict:
    """The bench variant ``performer``."""
    return _performer_variants(k, n)["performer"]


def _performer_layer(ours: SelfAttention, library: Any, n: int, k: int) -> Matched:
    """performer-pytorch's ``FastAttention(nb_features=k)`` with the project layer's features, between its
    projections."""
    core = library.FastAttention(dim_heads=ours.d_head, nb_features=k, causal=False)
    core.projection_matrix.copy_(ours.features)
    return _around(ours, core), True, (core,)


# ------------------------------------------------------------------------------ sparse
def _sparse_variants(k: int, n: int) -> dict[str, dict]:
    """``sparse``: the fixed pattern with Child et al.'s block l = √n and c = k/l − 1 summaries per block (at least
    1), so a query sees its l block positions and c·n/l summaries, ≈ (1 + c)·√n ≈ k keys; ``sparse_block``: the
    fixed pattern at a block of l = k whatever n and one summary per block, k + n/k keys (the block's part linear in
    n)."""
    block = max(1, min(n, round(math.sqrt(n))))
    summary = max(1, min(block, round(k / block - 1)))
    return {
        "sparse": _of("sparse", pattern="fixed", block=block, summary=summary),
        "sparse_block": _of("sparse", pattern="fixed", block=max(1, min(n, k)), summary=1),
    }


# kind → its bench variants at budget k and length n: variant name → ``model.attention`` dict
BENCH_VARIANTS: dict[str, Callable[[int, int], dict[str, dict]]] = {
    "linformer": _linformer_variants,
    "local": _local_variants,
    "lsh": _lsh_variants,
    "nystrom": _nystrom_variants,
    "performer": _performer_variants,
    "sparse": _sparse_variants,
}


# kind → the public implementation the bench races it against
REFERENCES: dict[str, Reference] = {
    "linformer": Reference("headwise", "linformer", "linformer", _linformer_attention, _linformer_layer),
    "local": Reference("local", "local-attention", "local_attention", _local_attention, _local_layer),
    "lsh": Reference("lsh", "reformer-pytorch", "reformer_pytorch", _lsh_attention, _lsh_layer),
    "nystrom": Reference("nystrom", "nystrom-attention", "nystrom_attention", _nystrom_attention, _nystrom_layer),
    "performer": Reference(
        "performer", "performer-pytorch", "performer_pytorch", _performer_attention, _performer_layer
    ),
}
