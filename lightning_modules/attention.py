"""Multi-head self-attention: full softmax attention and Linformer (Wang et al. 2020, Eq. 7).

Shapes: B batch, T sequence length (≤ n = max_len), d model width, h heads, d_h = d / h,
k_l the projected length of this layer, G ∈ {1, h} how many distinct E (or F) the layer has.

Full attention::

    head_i = softmax(Q_i K_iᵀ / √d_h) V_i                       (B, h, T, d_h)      O(T²d)

Linformer (Eq. 7), with E, F ∈ R^{k×n} cut to their first T columns::

    head_i = softmax(Q_i (E_i K_i)ᵀ / √d_h) (F_i V_i)            (B, h, T, d_h)      O(Tkd)

Padding: padded rows of K and V are zeroed *before* E/F (a padded position contributes nothing to
any slot), which makes appending padding leave real tokens' outputs unchanged. Short sequences use
the first T columns of E/F *without rescaling*: a sequence's slots are then the same sums whatever
padding or block length surrounds it; rescaling by n/T would make them depend on the batch's
padded length, and the model already sees every length it is trained on.

Two exact ways to evaluate E K, chosen by ``path``:

* ``projected``: K = X W_kᵀ + 1 b_kᵀ first, then E K (Eq. 7 as written): T·d² + G·k·T·d_h·h/G flops;
* ``input``: E K = (E X) W_kᵀ + (E 1) b_kᵀ — project the layer input along the sequence first,
  then apply W_k to only k rows: G·k·T·d + k·d² flops, far cheaper when E is shared by heads.
  With padding, E 1 becomes E m (m the 0/1 mask), i.e. E's columns at padded positions are zero.

``auto`` picks the cheaper one from these counts.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_modules.projections import ProjectionBank


def input_path_is_cheaper(groups: int, k: int, n: int, d_model: int) -> bool:
    """Flop count of both exact paths for one of E K or F V (multiply-adds, heads summed)."""
    projected = n * d_model * d_model + k * n * d_model
    first = groups * k * n * d_model + k * d_model * d_model
    return first < projected


class SelfAttention(nn.Module):
    """One parameterised self-attention layer.

    Args:
        d_model, n_heads: d and h.
        kind: ``full`` or ``linformer``.
        causal: full attention with ``is_causal`` (future keys masked).
        layer: index of this layer in the encoder (selects its matrices in ``bank``).
        bank: the model's :class:`ProjectionBank` (Linformer only).
        path: ``auto`` | ``input`` | ``projected`` (see module docstring).
        dropout: dropout on attention probabilities.
    """

    def __init__(self, d_model: int, n_heads: int, kind: str = "full", causal: bool = False,
                 layer: int = 0, bank: Optional[ProjectionBank] = None, path: str = "auto",
                 dropout: float = 0.0) -> None:
        super().__init__()
        if kind == "linformer" and bank is None:
            raise ValueError("linformer attention needs a ProjectionBank")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.kind, self.causal, self.layer, self.dropout = kind, causal, layer, dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        # A bank is shared by all layers: keep it out of this module's children so it is
        # registered (and counted, and synchronised by DDP) exactly once, by the encoder.
        self.__dict__["bank"] = bank
        if kind == "linformer":
            k = bank.ks[layer]
            self.path = path if path != "auto" else (
                "input" if input_path_is_cheaper(bank.groups, k, bank.max_len, d_model) else "projected")

    def _heads(self, x: Tensor) -> Tensor:
        """(B, T, d) → (B, h, T, d_h)."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """x: (B, T, d); mask: (B, T) bool, True at real tokens (None: no padding) → (B, T, d)."""
        b, t, _ = x.shape
        q = self._heads(self.q_proj(x))                                   # (B, h, T, d_h)
        p = self.dropout if self.training else 0.0
        if self.kind == "full":
            k, v = self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
            attn_mask = None
            if mask is not None:
                attn_mask = mask[:, None, None, :]                        # (B, 1, 1, T)
                if self.causal:
                    attn_mask = attn_mask & torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p,
                                                 is_causal=self.causal and mask is None)
        else:
            k, v = self._compressed_kv(x, mask)                           # (B, h, k, d_h) each
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)    # (B, h, T, d_h)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.d_model))

    def _compressed_kv(self, x: Tensor, mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """E K and F V, each (B, h, k_l, d_h), by the layer's exact path."""
        e, f = self.bank.matrices(self.layer, x.shape[1])                 # (G, k, T) each
        m = None if mask is None else mask.to(x.dtype)                    # (B, T)
        if self.path == "projected":
            k, v = self.k_proj(x), self.v_proj(x)                         # (B, T, d)
            if m is not None:
                k, v = k * m[..., None], v * m[..., None]
            # (1, G, k, T) @ (B, h, T, d_h) broadcasts G ∈ {1, h} against h.
            return e.unsqueeze(0) @ self._heads(k), f.unsqueeze(0) @ self._heads(v)
        xm = x if m is None else x * m[..., None]                         # (B, T, d)
        xe = e.unsqueeze(0) @ xm.unsqueeze(1)                             # (B, G, k, d)
        k = self._apply_linear(xe, self._slot_mass(e, m), self.k_proj)
        if f is not e:                                                    # E = F: compress once
            xe = f.unsqueeze(0) @ xm.unsqueeze(1)
        v = self._apply_linear(xe, self._slot_mass(f, m), self.v_proj)
        return k, v

    @staticmethod
    def _slot_mass(w: Tensor, m: Optional[Tensor]) -> Tensor:
        """E m: how much of the bias each slot receives, (B or 1, G, k, 1)."""
        if m is None:
            return w.sum(-1, keepdim=True).unsqueeze(0)
        return w.unsqueeze(0) @ m[:, None, :, None]                      # (B, G, k, 1)

    def _apply_linear(self, xe: Tensor, mass: Tensor, linear: nn.Linear) -> Tensor:
        """(E X) Wᵀ + (E m) bᵀ per head: (B, G, k, d) → (B, h, k, d_h)."""
        w = linear.weight.view(self.n_heads, self.d_head, self.d_model)  # (h, d_h, d)
        bias = linear.bias.view(self.n_heads, 1, self.d_head)            # (h, 1, d_h)
        return xe @ w.transpose(1, 2) + mass * bias
