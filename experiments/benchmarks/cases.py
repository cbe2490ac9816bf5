"""What the bench runs: the two baselines, the attention variants, and one callable per case.

Every case is built from a model config dict through ``TransformerEncoder(model_cfg, vocab_size)``, the
constructor training uses; :data:`VARIANTS` holds the variants every kind offers at Linformer's budget
(:data:`experiments.benchmarks.variants.BENCH_VARIANTS`). A *layer* case is the self-attention of a one-layer
encoder applied to x ∈ R^{B×n×d} (with the module its kind shares); a *model* case is the whole encoder
(embeddings, attention, feed-forward) applied to token ids.

Baselines, both with the same weights layout as full attention:

* ``naive``: the paper's baseline, softmax(Q Kᵀ/√d_h) V with the (B, h, n, n) score matrix
  materialised (:class:`NaiveAttention`, written here for the bench only);
* ``sdpa``: ``scaled_dot_product_attention`` (``attention.kind: full``), what users run today;
  on CPU it picks a flash kernel whose memory is linear in n.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from experiments.benchmarks.variants import BENCH_VARIANTS
from lightning_modules.attention import ATTENTION_KINDS
from lightning_modules.encoder import TransformerEncoder

BASELINES = ("naive", "sdpa")
BASELINE_LABELS = {"naive": "naive softmax attention (the paper's baseline)", "sdpa": "scaled_dot_product_attention"}


# Variant name → attention config for projected length k at sequence length n (evaluation orders are added
# separately): the variants each kind offers at Linformer's budget (``variants.BENCH_VARIANTS``).
def _offered(kind: str, name: str, k: int, n: int) -> dict:
    return BENCH_VARIANTS[kind](k, n)[name]


VARIANTS: dict[str, Callable[[int, int], dict]] = {
    name: functools.partial(_offered, kind, name) for kind, offered in BENCH_VARIANTS.items() for name in offered(1, 1)
}
# The baselines' kind: every query weighs every key by softmax (full attention).
EXACT = next(kind for kind in ATTENTION_KINDS.values() if kind.exact)


ORDERS = ("auto", "compress_first", "project_first")


def engines_of(variant: str) -> tuple[str, ...]:
    """The values of ``options.engine`` the variant's kind offers (its Options' ``Literal``); ("auto",) for a kind
    without engines and for the baselines."""
    if variant in BASELINES:
        return ("auto",)
    options = ATTENTION_KINDS[VARIANTS[variant](1, 1)["kind"]].Options
    hints = typing.get_type_hints(options) if options is not None else {}
    return typing.get_args(hints["engine"]) if "engine" in hints else ("auto",)


@dataclass(frozen=True)
class Shape:
    """Sizes shared by every case of a bench run."""

    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    vocab: int
    batch: int
    dtype: torch.dtype
    device: torch.device


@dataclass
class Case:
    """One thing to time: ``run()`` does one forward (inference mode) or one forward+backward."""

    level: str  # layer | model
    mode: str  # fwd | fwdbwd
    variant: str  # a baseline or a VARIANTS name
    k: Optional[int]  # None for baselines
    order: str  # requested evaluation order of E K ("-" for baselines)
    order_used: str  # what the layer resolved it to
    engine: str  # requested options.engine ("auto" for a kind without)
    causal: bool
    n: int
    tokens: int  # B·n tokens per call
    run: Callable[[], Any]
    clear: Callable[[], None]  # drop gradients, so a memory probe starts from the weights alone
    held: Callable[[], int]  # bytes kept between calls: weights, buffers, inputs, gradients of the last call

    @property
    def key(self) -> tuple:
        """What identifies the case at every n (one curve of the scaling plot)."""
        return (self.level, self.mode, self.variant, self.k, self.order, self.engine, self.causal)


class NaiveAttention(nn.Module):
    """The paper's baseline: softmax(Q Kᵀ/√d_h) V materialising the (B, h, T, T) scores, O(T²) time
    and memory. Uses (and registers) the Q/K/V/O weights of a full-attention ``SelfAttention``."""

    def __init__(self, full: nn.Module) -> None:
        super().__init__()
        self.full = full

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        a, (b, t, d) = self.full, x.shape
        heads = lambda y: y.view(b, t, a.n_heads, a.d_head).transpose(1, 2)  # noqa: E731  (B, h, T, d_h)
        q = heads(a.q_proj(x)) * (1.0 / math.sqrt(a.d_head))
        k, v = heads(a.k_proj(x)), heads(a.v_proj(x))
        scores = q @ k.transpose(-2, -1)  # (B, h, T, T)
        # In place: the product does not keep its output for backward, so no second T×T copy.
        if a.causal:
            scores.masked_fill_(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        if mask is not None:
            scores.masked_fill_(~mask[:, None, None, :], float("-inf"))
        out = scores.softmax(-1) @ v  # (B, h, T, d_h)
        return a.out_proj(out.transpose(1, 2).reshape(b, t, d))


def attention_config(
    variant: str, k: Optional[int], order: str, n: int, causal: bool = False, engine: str = "auto"
) -> dict:
    """The ``model.attention`` dict of a case at length n (baselines: full attention with the given causality)."""
    if variant in BASELINES:
        return {"kind": EXACT.kind, "causal": causal, "dropout": 0.0}
    att = VARIANTS[variant](k, n)
    if "order" in {f.name for f in dataclasses.fields(ATTENTION_KINDS[att["kind"]].Options or object)}:
        att["options"]["order"] = order  # a kind with an evaluation order takes the one asked for
    if engine != "auto":
        att["options"]["engine"] = engine  # one of the kind's engines (engines_of)
    return {**att, "dropout": 0.0}


def model_config(
    level: str,
    variant: str,
    k: Optional[int],
    order: str,
    n: int,
    shape: Shape,
    causal: bool = False,
    engine: str = "auto",
) -> dict:
    return {
        "max_len": n,
        "d_model": shape.d_model,
        "n_heads": shape.n_heads,
        "n_layers": 1 if level == "layer" else shape.n_layers,
        "d_ff": shape.d_ff,
        "dropout": 0.0,
        "attention": attention_config(variant, k, order, n, causal, engine),
    }


def is_causal(variant: str) -> bool:
    return bool(VARIANTS[variant](1, 1).get("causal", False))


def _forward(level: str, encoder: TransformerEncoder, n: int, shape: Shape, train: bool) -> tuple[Callable, Tensor]:
    """The call a case times and its input: the first layer's attention on x ∈ R^{B×n×d} (``layer``), or the
    whole encoder on token ids (``model``)."""
    if level == "layer":
        # requires_grad: a layer inside a network also back-propagates into its input.
        x = torch.randn(shape.batch, n, shape.d_model, device=shape.device, dtype=shape.dtype, requires_grad=train)
        first = encoder.blocks[0].attn
        return (lambda: first(x)), x
    ids = torch.randint(0, shape.vocab, (shape.batch, n), device=shape.device)
    return (lambda: encoder(ids)), ids


def build(
    level: str,
    mode: str,
    variant: str,
    k: Optional[int],
    order: str,
    n: int,
    shape: Shape,
    causal: bool = False,
    seed: int = 0,
    engine: str = "auto",
) -> Case:
    """A ready-to-run case (its tensors allocated on ``shape.device``)."""
    causal = causal if variant in BASELINES else is_causal(variant)
    torch.manual_seed(seed)
    encoder = TransformerEncoder(model_config(level, variant, k, order, n, shape, causal, engine), shape.vocab)
    if variant == "naive":
        for block in encoder.blocks:
            block.attn = NaiveAttention(block.attn)
    encoder = encoder.to(device=shape.device, dtype=shape.dtype).train(mode == "fwdbwd")
    order_used = getattr(encoder.blocks[0].attn, "order", "-")
    train = mode == "fwdbwd"
    call, inputs = _forward(level, encoder, n, shape, train)
    leaves = [*encoder.parameters(), *([inputs] if level == "layer" else [])]

    def clear() -> None:
        for leaf in leaves:
            leaf.grad = None

    kept = [*encoder.parameters(), *encoder.buffers(), inputs]

    def held() -> int:
        grads = [leaf.grad for leaf in leaves if leaf.grad is not None]
        return sum(t.numel() * t.element_size() for t in (*kept, *grads))

    def run() -> Any:
        if not train:
            with torch.inference_mode():
                return call()
        clear()  # a training step starts without gradients (as after zero_grad(set_to_none=True))
        call().sum().backward()

    return Case(
        level,
        mode,
        variant,
        k,
        order if variant not in BASELINES else "-",
        order_used,
        engine,
        causal,
        n,
        shape.batch * n,
        run,
        clear,
        held,
    )
