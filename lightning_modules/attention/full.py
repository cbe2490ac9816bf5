"""Full softmax attention (``kind: full``), the Transformer's; ``causal`` masks keys after the query.

    head_i = softmax(Q_i K_iᵀ / √d_h) V_i                       (B, h, T, d_h)      O(T²d)

Evaluated by ``scaled_dot_product_attention`` (flash/efficient kernels when there is no padding mask).
Incremental decoding keeps a KV cache of T rows.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_modules.attention.base import SelfAttention, register_attention


@register_attention("full")
class FullAttention(SelfAttention):
    exact = True
    quadratic = True

    def attend_qkv(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        if mask is None:  # no padding: the fast kernels
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=self.causal)
        visible = mask[:, None, None, :]  # (B, 1, 1, T): real keys
        if self.causal:
            t = q.shape[2]
            visible = visible & torch.ones(t, t, dtype=torch.bool, device=q.device).tril()  # (B, 1, T, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout_p)

    def init_state(self, batch_size: int, capacity: int, device: Any = None, dtype: Any = None) -> dict:
        """A KV cache of every position (:meth:`SelfAttention.kv_cache`)."""
        return self.kv_cache(batch_size, capacity, device, dtype)

    def step(self, x: Tensor, state: dict) -> tuple[Tensor, dict]:
        """Position t attends to the cached keys 0 … t: x (B, 1, d) → ((B, 1, d), state)."""
        q, t = self.cache_step(x, state)  # (B, h, 1, d_h)
        out = F.scaled_dot_product_attention(q, state["k"][:, :, : t + 1], state["v"][:, :, : t + 1])
        state["t"] = t + 1
        return self.merge_step(out), state
