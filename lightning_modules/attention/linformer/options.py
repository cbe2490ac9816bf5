"""Linformer's settings (``model.attention.options`` of ``kind: linformer``) and the k of every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from omegaconf import ListConfig

from lightning_modules.attention.base import kind_options


@dataclass
class KScheduleConfig:
    """Per-layer k from a named schedule: ``linear`` interpolates from ``first`` to ``last``,
    ``geometric`` does so in log space; values are rounded to integers."""

    kind: Literal["linear", "geometric"] = "linear"
    first: int = 64
    last: int = 16


@dataclass
class LinformerOptions:
    """Linformer's settings (``model.attention.options``)."""

    # int, or a list with one entry per layer; ignored when k_schedule is set.
    k: Any = 64
    k_schedule: Optional[KScheduleConfig] = None
    share: Literal["none", "headwise", "kv", "layerwise"] = "none"
    # A registered projection kind (projections.py): learned, random, conv, pool, ...
    projection: str = "learned"
    # Initial distribution of E/F (sets the attention temperature, so it is explicit):
    #   auto (default): each form's draw from its authors, resolved by init_draw():
    #     bidirectional (Eq. 7, the paper's model): normal, the draw the authors' trained model starts from;
    #     causal (the block form, which the authors never released): jl, the scale of the paper's Theorem 1,
    #     the only draw the authors give for it (docs/defaults.md says what each draw does on each form)
    #   normal: N(0, model.init_std^2) like every other weight (fairseq examples/linformer builds E/F as
    #     nn.Linear(n, k); RoBERTa's init_bert_params then re-draws every nn.Linear from N(0, 0.02^2), after the
    #     attention module's own xavier reset)
    #   xavier: U(±sqrt(3/(n + k))), that reset (multihead_linear_attention.py: xavier_uniform_(gain=1/sqrt(2)))
    #   jl: N(0, 1/k) (the paper's JL scale)   uniform: U(-1/sqrt(n), 1/sqrt(n))
    #   theorem2: E = delta R, F = exp(-delta) R with R ~ N(0, 1/k) (Theorem 2's proof)
    #   window: each slot the mean of its n/k positions (the pool projection as a start; a locality prior)
    init: Literal["auto", "normal", "xavier", "jl", "uniform", "theorem2", "window"] = "auto"
    delta: float = 1.0
    # Which side passes through the k-slot bottleneck: both (Eq. 7), keys only, values only.
    compress: Literal["both", "keys", "values"] = "both"
    # Evaluation order of E K (exact either way): compress_first applies E to the layer input before W_k,
    # project_first computes K = X W_k first (Eq. 7 as written); auto picks the cheaper by FLOP count.
    order: Literal["auto", "compress_first", "project_first"] = "auto"
    # How the layer computes it (the same function, different kernels; docs/gpu.md):
    #   reference: each side's products as written, the causal rows through chunked SDPA calls (bit for bit what
    #     every CPU run of the bidirectional form computed before auto ran fused there);
    #   fused: E K and F V from one input product and one batched product, then one SDPA call; the causal form as
    #     one FlexAttention call over [keys ; slots] (compiled on CUDA; where Flex cannot run, reference);
    #   auto (default): fused, except the causal form on a CPU (FlexAttention is compiled on CUDA only): reference.
    engine: Literal["auto", "reference", "fused"] = "auto"


def layer_ks(model: Any) -> list[int]:
    """k of every layer, from ``options.k`` (int or list) or ``options.k_schedule``."""
    opts, n_layers = kind_options(model.attention), model.n_layers
    if opts.k_schedule is not None:
        s = opts.k_schedule
        if n_layers == 1:
            return [int(s.first)]
        ts = [i / (n_layers - 1) for i in range(n_layers)]
        if s.kind == "linear":
            return [round(s.first + (s.last - s.first) * t) for t in ts]
        return [round(s.first * (s.last / s.first) ** t) for t in ts]
    k = opts.k
    if isinstance(k, (list, ListConfig)):
        return [int(v) for v in k]
    return [int(k)] * n_layers


def resolve_init(init: str, causal: bool) -> str:
    """The E/F draw that ``init`` stands for: itself, or for ``auto`` each form's (``normal`` bidirectional, ``jl``
    causal)."""
    if init != "auto":
        return init
    return "jl" if causal else "normal"


def init_draw(attention: Any) -> str:
    """The E/F draw a layer uses: ``options.init``, with ``auto`` resolved per form (:func:`resolve_init`)."""
    return resolve_init(kind_options(attention).init, attention.causal)
