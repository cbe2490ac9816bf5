"""Sliding-window attention (Longformer, Beltagy et al. 2020; Mistral's causal window), ``kind: local``, with
optional global tokens. Each query sees ``window`` = w positions of the n = ``max_len`` grid::

    causal:      W_i = { j : i − w < j ≤ i }                            the last w positions (Mistral)
    non-causal:  W_i = [s_i, s_i + w),  s_i = clamp(i − ⌊w/2⌋, 0, n − w)   w positions centred on i, shifted
                                                                          inside [0, n) at the edges
    globals:     G = { 0, …, g − 1 } (g = ``n_global``): every query sees them and (non-causal) they see
                 every key (causal: every query j ≥ g sees them; a global query sees what causality allows)
    head_i = softmax(Q_i K_iᵀ / √d_h + log M) V_i,  M_ij = j ∈ W_i ∪ G (∨ i ∈ G)      O(T·(w + g)·d)

Every query sees exactly w positions (plus the globals), so w ≥ n is full attention, and the useful work is
4·B·h·T·w·d_h flops forward (non-causal, T = n). Windows are placed on the n-position grid, never on the batch's
length T, so appending padding moves no window. Engines: :mod:`~lightning_modules.attention.patterned`.

Incremental decoding (causal): a ring of the last w keys and values, plus the g global ones: a fixed-size state
of (w + g) rows per head whatever the position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor

from foundation.errors import require
from lightning_modules.attention.base import kind_options, register_attention
from lightning_modules.attention.blocked import Layout
from lightning_modules.attention.patterned import PatternAttention


@dataclass
class LocalOptions:
    # Positions each query sees (w ≥ max_len: full attention).
    window: int = 64
    # The first n_global positions are global tokens (Longformer's; 0: none).
    n_global: int = 0
    # auto | blocked | dense | flex | compiled (lightning_modules/attention/patterned.py).
    engine: Literal["auto", "blocked", "dense", "flex", "compiled"] = "auto"


@register_attention("local")
class LocalAttention(PatternAttention):
    Options = LocalOptions

    def __init__(self, model: DictConfig, layer: int = 0, shared: Any = None) -> None:
        super().__init__(model, layer, shared)
        opts = kind_options(model.attention)
        self.window, self.n_global = int(opts.window), int(opts.n_global)

    @classmethod
    def check(cls, model: DictConfig) -> None:
        opts, n = kind_options(model.attention), model.max_len
        require(
            1 <= opts.window <= n,
            f"model.attention.options.window: {opts.window} must be in "
            f"[1, model.max_len={n}] (window = max_len is full attention)",
        )
        require(
            0 <= opts.n_global <= n,
            f"model.attention.options.n_global: {opts.n_global} must be in [0, model.max_len={n}]",
        )

    def visible(self, i: Tensor, j: Tensor) -> Tensor:
        w, g = self.window, self.n_global
        if self.causal:
            return (j <= i) & ((i - j < w) | (j < g))  # the last w positions, and the globals
        start = torch.clamp(i - w // 2, min=0, max=max(self.max_len - w, 0))
        return ((start <= j) & (j < start + w)) | (j < g) | (i < g)  # the window, globals both ways

    def layout(self, t: int, device: Any) -> Layout:
        """Blocks of b queries see a band of w + b − 1 keys (the union of their windows), the globals as columns,
        and (non-causal) the global queries every key as dense rows: O(T·(w + b + g) + g·T) pairs."""
        w, g, b = self.window, self.n_global, min(self.QUERY_BLOCK, t)
        first = torch.arange(0, t, b, device=device)  # (T/b,) each block's first query
        if self.causal:  # query i sees (i − w, i]
            starts = first - w + 1
        else:  # s_i is non-decreasing and grows by at most 1 per position
            starts = torch.clamp(first - w // 2, min=0, max=max(self.max_len - w, 0))
        layout = self.band(t, b, starts, w + b - 1)
        layout.columns = torch.arange(min(g, t), device=device) if g else None
        layout.rows = 0 if self.causal else min(g, t)
        return layout

    # ------------------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int, capacity: int, device: Any = None, dtype: Any = None) -> dict:
        """``ring_k``, ``ring_v`` (B, h, w, d_h) with ``ring_position`` (w,) (−1: empty), ``global_k``,
        ``global_v`` (B, h, g, d_h); ``t`` the next position. Capacity unused: the size is fixed."""
        if not self.causal:
            return super().init_state(batch_size, capacity, device, dtype)

        def zeros(rows: int) -> Tensor:
            return torch.zeros(batch_size, self.n_heads, rows, self.d_head, device=device, dtype=dtype)

        return {
            "t": 0,
            "ring_k": zeros(self.window),
            "ring_v": zeros(self.window),
            "ring_position": torch.full((self.window,), -1, device=device, dtype=torch.long),
            "global_k": zeros(self.n_global),
            "global_v": zeros(self.n_global),
        }

    def step(self, x: Tensor, state: dict) -> tuple[Tensor, dict]:
        """Position t attends to the globals 0 … min(g, t+1) − 1 and the ring's positions t − w < p ≤ t that are
        not global: x (B, 1, d) → ((B, 1, d), state), updated in place."""
        t = state["t"]
        if t >= self.max_len:
            raise ValueError(f"decoding position {t} exceeds the state's capacity of {self.max_len} tokens")
        q = self.heads(self.q_proj(x))  # (B, h, 1, d_h)
        k, v = self.keys_values(x)  # (B, h, 1, d_h) each
        slot = t % self.window  # the oldest position leaves the ring
        state["ring_k"][:, :, slot], state["ring_v"][:, :, slot] = k[:, :, 0], v[:, :, 0]
        state["ring_position"][slot] = t
        if t < self.n_global:
            state["global_k"][:, :, t], state["global_v"][:, :, t] = k[:, :, 0], v[:, :, 0]
        seen = min(t + 1, self.n_global)
        local = state["ring_position"] >= self.n_global  # globals are counted once, from their rows
        keys = torch.cat([state["global_k"][:, :, :seen], state["ring_k"][:, :, local]], 2)  # (B, h, ≤ g + w, d_h)
        values = torch.cat([state["global_v"][:, :, :seen], state["ring_v"][:, :, local]], 2)
        out = F.scaled_dot_product_attention(q, keys, values)  # (B, h, 1, d_h)
        state["t"] = t + 1
        return self.merge_step(out), state
