"""Softmax attention over a fixed pattern in O(T·keys per query) time and memory: the ``blocked`` engine of the
pattern kinds (:mod:`~lightning_modules.attention.patterned`). No T × T score or mask is ever formed.

A pattern kind describes where each query's keys lie as a :class:`Layout`, a cover of its pattern by up to four
parts; the pairs a part holds are then filtered by the pattern's own ``visible(i, j)``::

    band      query block β = [βb, βb + b) sees the keys [a_β, a_β + L)          (B, h, T/b, b, L) scores
    columns   every query sees the keys C = {c_1, …, c_m}, gathered into each block's keys   (…, b, L + m)
    stride    query i sees the keys j ≡ i (mod s), per residue class              (B, h, s, T/s, T/s)
    rows      the first g queries see every key (dense rows: Longformer's global queries)

    S_i   = [ q_i·k_j/√d_h  for j in band(i) ; C ; stride(i) ],  masked where ¬visible(i, j), j is padded,
            or an earlier part holds (i, j)
    out_i = softmax(S_i) · [ V_band(i) ; V_C ; V_stride(i) ]                                  (B, h, T, d_h)

Without a stride and without autograd or dropout, the blocks are the batch of one ``scaled_dot_product_attention``
call (its fused kernel); otherwise batched matrix products and one softmax over the parts' scores (on CPU their
backward is faster than the fused kernel's on blocks this small). Each pair is counted once, so the result
is the dense engine's softmax(Q Kᵀ/√d_h + log M) V up to float summation order. Cost: O(T·(L + m + T/s)·d_h)
time and memory, forward and backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

Visible = Callable[[Tensor, Tensor], Tensor]


@dataclass
class Layout:
    """Where the keys of each query lie (module docstring); every visible pair must lie in one of the parts."""

    block: int  # b: queries per block
    starts: Tensor  # (⌈T/b⌉,) a_β: the first key of block β's band (may lie outside [0, T): masked there)
    span: int  # L: keys per band
    columns: Optional[Tensor] = None  # (m,) keys any query may see beyond its band
    stride: Optional[int] = None  # s: query i may also see every key j ≡ i (mod s)
    rows: int = 0  # g: the queries 0 … g − 1 see every key visible to them (dense)


def blocked_attention(
    q: Tensor, k: Tensor, v: Tensor, layout: Layout, visible: Visible, mask: Optional[Tensor], dropout_p: float
) -> Tensor:
    """softmax(Q Kᵀ/√d_h + log M) V over M = visible ∧ real keys: q, k, v (B, h, T, d_h) → (B, h, T, d_h)."""
    bsz, h, t, dh = q.shape
    qb, kb, vb, allowed = _blocks(q, k, v, layout, visible, mask)  # (B, h, nb, b | L + m, d_h), (B|1, 1, nb, b, L+m)
    nb, b, keys = qb.shape[2], qb.shape[3], kb.shape[3]
    # An additive mask of the lowest float, not −∞: a row without visible keys (a padded query) stays finite.
    bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, torch.finfo(q.dtype).min)
    training = dropout_p > 0 or (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)))
    if layout.stride is None and not training:  # one fused kernel, the blocks as its batch
        out = F.scaled_dot_product_attention(
            qb.reshape(bsz, h * nb, b, dh),
            kb.flatten(1, 2),
            vb.flatten(1, 2),
            attn_mask=bias.expand(bias.shape[0], h, nb, b, keys).reshape(-1, h * nb, b, keys),
        )  # (B, h·nb, b, d_h)
        out = out.view(bsz, h, nb * b, dh)[:, :, :t]
    elif layout.stride is None:  # batched products: their backward beats the fused CPU kernel's on small blocks
        p = torch.softmax((qb @ kb.transpose(-1, -2)) * dh**-0.5 + bias, -1)  # (B, h, nb, b, L + m)
        p = F.dropout(p, dropout_p) if dropout_p else p
        out = (p @ vb).view(bsz, h, nb * b, dh)[:, :, :t]  # (B, h, T, d_h)
    else:  # two parts, one softmax over their concatenated scores
        scores = ((qb @ kb.transpose(-1, -2)) * dh**-0.5 + bias).view(bsz, h, nb * b, keys)[:, :, :t]
        strided, mix = _strided(q, k, v, layout, visible, mask)  # (B, h, T, T/s)
        p = torch.softmax(torch.cat([scores, strided], -1), -1)  # (B, h, T, L + m + T/s)
        p = F.dropout(p, dropout_p) if dropout_p else p
        near, far = p.split([keys, strided.shape[-1]], -1)
        near = F.pad(near, (0, 0, 0, nb * b - t)).view(bsz, h, nb, b, keys)
        out = (near @ vb).view(bsz, h, nb * b, dh)[:, :, :t] + mix(far)  # (B, h, T, d_h)
    if layout.rows:  # the dense rows replace their blocked rows
        i, j = torch.arange(layout.rows, device=q.device), torch.arange(t, device=q.device)
        seen = visible(i[:, None], j[None, :])  # (g, T)
        seen = seen if mask is None else seen & mask[:, None, None, :]
        top = F.scaled_dot_product_attention(q[:, :, : layout.rows], k, v, attn_mask=seen, dropout_p=dropout_p)
        out = torch.cat([top, out[:, :, layout.rows :]], 2)
    return out


# ------------------------------------------------------------------------------ the parts
def _masked(scores: Tensor, allowed: Tensor) -> Tensor:
    # The dtype's lowest finite value, not −∞: a row with no visible key (a padded query) stays finite, so no NaN
    # reaches the next layer through a padded position's value.
    return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)


def _in_band(layout: Layout, i: Tensor, j: Tensor) -> Tensor:
    """Does key j lie in the band of query i's block (broadcast)."""
    start = layout.starts[i // layout.block]
    return (start <= j) & (j < start + layout.span)


def _blocks(q: Tensor, k: Tensor, v: Tensor, layout: Layout, visible: Visible, mask: Optional[Tensor]):
    """Query blocks and the keys each reaches, its band then the columns: qb (B, h, nb, b, d_h), kb and vb
    (B, h, nb, L + m, d_h), and which pairs count, (B or 1, 1, nb, b, L + m)."""
    bsz, h, t, dh = q.shape
    b, nb = layout.block, layout.starts.shape[0]
    rows = torch.arange(nb * b, device=q.device).view(nb, b, 1)  # query positions
    keys = layout.starts[:, None] + torch.arange(layout.span, device=q.device)  # (nb, L) key positions
    allowed = visible(rows, keys[:, None, :]) & ((keys >= 0) & (keys < t))[:, None]  # (nb, b, L)
    if layout.columns is not None and len(layout.columns):
        cols = layout.columns.expand(nb, -1)  # (nb, m)
        extra = visible(rows, cols[:, None, :]) & ~_in_band(layout, rows, cols[:, None, :])  # (nb, b, m)
        keys, allowed = torch.cat([keys, cols], 1), torch.cat([allowed, extra], 2)  # (nb, L + m), (nb, b, L + m)
    index = keys.clamp(0, t - 1)
    if mask is not None:
        allowed = allowed & mask[:, index][:, :, None, :]  # (B, nb, b, L + m)
    width, index = keys.shape[1], index.flatten()
    kb = k.index_select(2, index).view(bsz, h, nb, width, dh)  # (B, h, nb, L + m, d_h)
    vb = v.index_select(2, index).view(bsz, h, nb, width, dh)
    qb = F.pad(q, (0, 0, 0, nb * b - t)).view(bsz, h, nb, b, dh)  # (B, h, nb, b, d_h)
    return qb, kb, vb, allowed[:, None] if mask is not None else allowed[None, None]


def _strided(q: Tensor, k: Tensor, v: Tensor, layout: Layout, visible: Visible, mask: Optional[Tensor]):
    """The keys j ≡ i (mod s) that neither the band nor the columns hold, per residue class: scores
    (B, h, T, T/s) and mix: probabilities (B, h, T, T/s) → (B, h, T, d_h)."""
    bsz, h, t, dh = q.shape
    s = layout.stride
    m = -(-t // s)  # positions per residue class

    def classes(x: Tensor) -> Tensor:  # (B, h, T, d_h) → (B, h, s, m, d_h): row a of class r is position a·s + r
        return F.pad(x, (0, 0, 0, m * s - t)).view(bsz, h, m, s, dh).transpose(2, 3)

    i = torch.arange(t, device=q.device)[:, None]  # (T, 1)
    keys = torch.arange(m, device=q.device)[None, :] * s + i % s  # (T, m): the keys j ≡ i (mod s)
    allowed = (keys < t) & visible(i, keys) & ~_in_band(layout, i, keys)
    if layout.columns is not None and len(layout.columns):
        column = torch.zeros(m * s, dtype=torch.bool, device=q.device)
        column[layout.columns] = True
        allowed = allowed & ~column[keys]
    if mask is not None:
        allowed = (allowed & mask[:, keys.clamp(0, t - 1)])[:, None]  # (B, 1, T, m)
    vs = classes(v)
    scores = classes(q) @ classes(k).transpose(-1, -2) / math.sqrt(dh)  # (B, h, s, m, m)
    scores = _masked(scores.transpose(2, 3).reshape(bsz, h, m * s, m)[:, :, :t], allowed)  # (B, h, T, m)

    def mix(p: Tensor) -> Tensor:
        p = F.pad(p, (0, 0, 0, m * s - t)).view(bsz, h, m, s, m).transpose(2, 3)  # (B, h, s, m, m)
        return (p @ vs).transpose(2, 3).reshape(bsz, h, m * s, dh)[:, :, :t]  # (B, h, T, d_h)

    return scores, mix
