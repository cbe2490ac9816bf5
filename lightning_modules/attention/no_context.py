"""No context (``kind: no_context``): each position sees only itself, the control that cannot use context.

    out_i = W_o (W_v x_i + b_v)                                 (B, T, d)           O(T·d²)

Softmax attention over the one key {i} gives weight 1 to it, so this is any kind's output when a query sees
nothing but its own position: no output depends on another token, so a model built on it is a per-position
predictor (with the position's embedding), and its loss on [MASK]ed targets is the no-context level that a model
which uses its context must beat. There are no queries or keys (W_q, W_k are None), and no attention weights
for dropout to drop. It is causal whatever ``causal`` says, padding changes nothing, and decoding keeps no state.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor

from lightning_modules.attention.base import SelfAttention, register_attention


@register_attention("no_context")
class NoContextAttention(SelfAttention):
    projections = "v"  # no query meets a key

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """x: (B, T, d); mask unused (no position reads another) → (B, T, d)."""
        return self.out_proj(self.v_proj(x))  # W_o (W_v x_i + b_v), position by position

    def init_state(self, batch_size: int, capacity: int, device: Any = None, dtype: Any = None) -> dict:
        """Nothing to remember: only the next position ``t``."""
        if not self.causal:
            return super().init_state(batch_size, capacity, device, dtype)
        return {"t": 0}

    def step(self, x: Tensor, state: dict) -> tuple[Tensor, dict]:
        """x (B, 1, d) → ((B, 1, d), state): the same map as :meth:`forward`."""
        state["t"] += 1
        return self.forward(x), state
