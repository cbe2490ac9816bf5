"""Key-only / value-only Linformer (``compress: keys | values`` of ``kind: linformer``).

Only one side passes through the rank-k sequence bottleneck; P = E_m⁺E_m (the orthogonal projector onto E's
row space on the real positions, :meth:`~.projections.ProjectionBank.lift`) lifts it back to
T rows, and attention is otherwise full::

    compress keys:    head_i = softmax(Q_i (P K_i)ᵀ / √d_h) V_i       O(T²d + Tk²): these isolate the
    compress values:  head_i = softmax(Q_i K_iᵀ / √d_h) (P V_i)       approximation error, not speed.

With k ≥ the number of real tokens (any full-rank E), P = I and both equal full attention.
"""

from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from lightning_modules.attention.linformer.bidirectional import Linformer


class OneSidedLinformer(Linformer):
    context_label = "P = softmax(QKᵀ/√d)"
    quadratic = True

    def attend_qkv(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        if self.bank.compressed_side == "keys":
            k = self.bank.lift(self.layer, 0, k, mask)  # P K
        else:
            v = self.bank.lift(self.layer, 1, v, mask)  # P V
        visible = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout_p)
