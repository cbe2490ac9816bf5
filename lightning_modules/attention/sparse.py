"""Sparse Transformer attention (Child et al. 2019), ``kind: sparse``: the union of the paper's two factorised
patterns in one head (its "merged" form). With l = ``block``, s = ``stride`` (default l), c = ``summary``
(default 1), a query i sees::

    strided:  { j : |i − j| < l }  ∪  { j : (i − j) mod s = 0 }        a band and every s-th position
    fixed:    { j : ⌊j/l⌋ = ⌊i/l⌋ } ∪ { j : j mod l ≥ l − c }           its block and every block's last c
    causal:   the same sets ∩ { j ≤ i } (the paper's form)

    head_i = softmax(Q_i K_iᵀ / √d_h + log M) V_i                      O(T·(l + T/s)·d) or O(T·(l + cT/l)·d)

With l ≈ √n either pattern sees O(√n) keys per query. The pattern covers every pair (full attention) when
l ≥ n, or s = 1 (strided), or c = l (fixed). Positions are absolute, so appending padding changes no query's
set. Engines: :mod:`~lightning_modules.attention.patterned`.

Incremental decoding (causal): a KV cache of every position (the strided pattern reaches back to any residue,
the fixed one to every block's summary), the step attending only to the pattern's keys of row t.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
from omegaconf import DictConfig
from torch import Tensor

from foundation.errors import require
from lightning_modules.attention.base import kind_options, register_attention
from lightning_modules.attention.blocked import Layout
from lightning_modules.attention.patterned import PatternAttention


@dataclass
class SparseOptions:
    # fixed (the paper's choice for text) | strided (its choice for images).
    pattern: Literal["fixed", "strided"] = "fixed"
    # l: the band (strided) or block (fixed) length.
    block: int = 32
    # s: the step of the strided pattern's second set (default: l, as in the paper); strided only.
    stride: Optional[int] = None
    # c: the summary positions at the end of every block (default 1); fixed only.
    summary: Optional[int] = None
    # auto | blocked | dense | flex | compiled (lightning_modules/attention/patterned.py).
    engine: Literal["auto", "blocked", "dense", "flex", "compiled"] = "auto"


@register_attention("sparse")
class SparseAttention(PatternAttention):
    Options = SparseOptions

    def __init__(self, model: DictConfig, layer: int = 0, shared: Any = None) -> None:
        super().__init__(model, layer, shared)
        opts = kind_options(model.attention)
        self.pattern, self.block = str(opts.pattern), int(opts.block)
        self.stride = int(opts.stride) if opts.stride is not None else self.block
        self.summary = int(opts.summary) if opts.summary is not None else 1

    @classmethod
    def check(cls, model: DictConfig) -> None:
        opts, n = kind_options(model.attention), model.max_len
        require(
            1 <= opts.block <= n,
            f"model.attention.options.block: {opts.block} must be in "
            f"[1, model.max_len={n}] (block = max_len is full attention)",
        )
        if opts.pattern == "strided":
            require(
                opts.summary is None,
                f"model.attention.options.summary: {opts.summary} applies to pattern "
                "'fixed' only (pattern 'strided' uses block and stride)",
            )
            require(
                opts.stride is None or 1 <= opts.stride <= n,
                f"model.attention.options.stride: {opts.stride} must be in [1, model.max_len={n}]",
            )
        else:
            require(
                opts.stride is None,
                f"model.attention.options.stride: {opts.stride} applies to pattern "
                "'strided' only (pattern 'fixed' uses block and summary)",
            )
            require(
                opts.summary is None or 1 <= opts.summary <= opts.block,
                f"model.attention.options.summary: {opts.summary} must be in [1, block={opts.block}]",
            )

    def visible(self, i: Tensor, j: Tensor) -> Tensor:
        l, s, c = self.block, self.stride, self.summary
        if self.pattern == "strided":
            seen = ((i - j).abs() < l) | ((i - j) % s == 0)  # band ∪ every s-th position
        else:
            seen = (i // l == j // l) | (j % l >= l - c)  # own block ∪ the blocks' summaries
        return seen & (j <= i) if self.causal else seen

    def layout(self, t: int, device: Any) -> Layout:
        """fixed: blocks of whole l-blocks see their own keys (band) and the summaries (columns),
        O(T·(l + cT/l)) pairs; strided: blocks of b queries see the band of their |i − j| < l (band) and
        the keys of their residue mod s (stride), O(T·(b + 2l + T/s)) pairs."""
        l, s, c = self.block, self.stride, self.summary
        if self.pattern == "fixed":
            b = l * max(1, self.QUERY_BLOCK // (2 * l))  # whole l-blocks, small ones grouped
            layout = self.band(t, b, torch.arange(0, t, b, device=device), b)
            j = torch.arange(t, device=device)
            layout.columns = j[j % l >= l - c]
            return layout
        b = min(self.QUERY_BLOCK, t)
        first = torch.arange(0, t, b, device=device)
        layout = self.band(t, b, first - l + 1, b + l - 1 if self.causal else b + 2 * l - 2)
        layout.stride = s if s < t else None  # (i − j) mod s = 0 with |i − j| < s ≤ T is j = i, in the band
        return layout
