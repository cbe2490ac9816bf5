"""Reformer's LSH attention (Kitaev et al. 2020), ``kind: lsh``: shared-QK attention within hash buckets.

Shared QK: keys are the unit-normalised queries, k̂_j = q_j / ‖q_j‖ (W_k does not exist: ``k_proj`` is None).
Angular LSH with r = ``n_hashes`` rounds, each a random rotation R_r ∈ R^{d_h × nb/2}:

    h_r(x) = argmax [x R_r ; −x R_r]        nb = ⌈n / m⌉ buckets (even, or 1: no hashing), m = ``bucket_size``

Per round, the positions are sorted by (bucket, position) and cut into chunks of m; query i may see key j
when both share a bucket and j's chunk is i's or the one before (P_i^r; causal: also j ≤ i, and chunks are cut
within each bucket, :meth:`LSHAttention.chunk_index`). A query sees itself only when nothing else is visible
(its score is −5·10⁴), as in the paper. Rounds combine into one
softmax over P_i = ∪_r P_i^r, each pair counted once (N_ij = rounds with j ∈ P_i^r)::

    s_ij      = q_i · k̂_j / √d_h − log N_ij                          per round, j ∈ P_i^r
    out_i^r   = Σ_j softmax_j(s_ij) v_j,   L_i^r = logsumexp_j s_ij   (B, h, T, d_h), (B, h, T)
    out_i     = Σ_r softmax_r(L_i^r) out_i^r                          O(r·T·2m·d_h) time (causal 3m), O(r·T·m) memory

bucket_size ≥ n gives one bucket and one chunk: full shared-QK attention. R is a buffer drawn at construction
(saved, restored, never redrawn): outputs are then a function of the input, which the padding and checkpoint
contracts need (Reformer redraws it per call). Padding: a padded position goes to an extra bucket sorted after
every real one and is visible to no other position (it sees only itself), so real positions keep their sort
order, chunks and outputs.

No streaming form: a position's chunk depends on the sort of the whole sequence (causal decoding raises).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor

from foundation.errors import check_number, require
from lightning_modules.attention.base import SelfAttention, kind_options, register_attention

SELF_SCORE = -5e4  # a query's score for itself: below any real score, above a masked one (fits float16)


@dataclass
class LSHOptions:
    # r: hashing rounds (more rounds: fewer similar pairs missed, r times the work).
    n_hashes: int = 1
    # m: chunk length; nb = ⌈max_len / m⌉ buckets (rounded up to even; bucket_size = max_len: one bucket).
    bucket_size: int = 64


def n_buckets(max_len: int, bucket_size: int) -> int:
    nb = -(-max_len // bucket_size)
    return nb if nb == 1 else nb + nb % 2


@register_attention("lsh")
class LSHAttention(SelfAttention):
    Options = LSHOptions
    projections = "qv"  # shared QK: keys are normalised queries

    def __init__(self, model: DictConfig, layer: int = 0, shared: Any = None) -> None:
        super().__init__(model, layer, shared)
        opts = kind_options(model.attention)
        self.n_hashes, self.bucket_size = int(opts.n_hashes), int(opts.bucket_size)
        self.n_buckets = n_buckets(int(model.max_len), self.bucket_size)
        self.register_buffer("rotations", torch.randn(self.n_hashes, self.d_head, self.n_buckets // 2))

    @classmethod
    def check(cls, model: DictConfig) -> None:
        opts, n = kind_options(model.attention), model.max_len
        check_number("model.attention.options.n_hashes", opts.n_hashes, 1, 64, integer=True)
        require(
            1 <= opts.bucket_size <= n,
            f"model.attention.options.bucket_size: {opts.bucket_size} must be in "
            f"[1, model.max_len={n}] (bucket_size = max_len is one bucket)",
        )

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """K̂ = Q / ‖Q‖ (shared QK) and V, each (B, h, T, d_h)."""
        q, v = self.projected(x, "qv")
        return F.normalize(q, dim=-1), v

    def attend(self, x: Tensor, q: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        v = self.heads(self.v_proj(x))  # (B, h, T, d_h)
        return self.lsh_attention(q, v, mask, dropout_p)

    def buckets(self, q: Tensor, mask: Optional[Tensor]) -> Tensor:
        """h_r(q_i) for every round: q (B, h, T, d_h) → (B, h, r, T); padding in the extra bucket nb."""
        b, h, t, _ = q.shape
        if self.n_buckets == 1:
            found = q.new_zeros(b, h, self.n_hashes, t, dtype=torch.long)
        else:
            rotated = torch.einsum("bhtd,rdk->bhrtk", q, self.rotations.to(q.dtype))  # (B, h, r, T, nb/2)
            found = torch.cat([rotated, -rotated], -1).argmax(-1)  # (B, h, r, T)
        if mask is not None:
            found = found.masked_fill(~mask[:, None, None, :], self.n_buckets)
        return found

    def lsh_attention(self, q: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        """The module docstring's equations: q, v (B, h, T, d_h), mask (B, T) or None → (B, h, T, d_h)."""
        t, d = q.shape[2:]
        r, m = self.n_hashes, self.bucket_size
        nc = -(-t // m)  # chunks per round
        bucket = self.buckets(q, mask)  # (B, h, r, T)
        position = torch.arange(t, device=q.device)
        order = (bucket * t + position).argsort(-1)  # sort by (bucket, position): (B, h, r, T)
        rank = torch.empty_like(order).scatter_(-1, order, position.expand_as(order))  # each position's place
        chunk = self.chunk_index(bucket, rank)  # (B, h, r, T)
        back = 2 if self.causal else 1  # chunks before its own a query may reach

        # Sorted, padded to nc·m rows with dummies (position t: never visible) when m ∤ T, cut into chunks.
        def chunks(x: Tensor, fill: Any) -> Tensor:  # (B, h, r, T, …) → (B, h, r, nc, m, …)
            if nc * m > t:
                x = torch.cat([x, x.new_full((*x.shape[:3], nc * m - t, *x.shape[4:]), fill)], 3)
            return x.unflatten(3, (nc, m))

        def rows(x: Tensor) -> Tensor:  # (B, h, T, e) sorted per round
            index = order[..., None].expand(-1, -1, -1, -1, x.shape[-1])
            return x[:, :, None].expand(-1, -1, r, -1, -1).gather(3, index)

        def window(x: Tensor, fill: Any) -> Tensor:  # a chunk's keys: [`back` chunks before ; own]
            def earlier(s: int) -> Tensor:  # chunk c − s in place c
                return torch.cat([torch.full_like(x[:, :, :, :s], fill), x[:, :, :, :-s]], 3)

            return torch.cat([*(earlier(s) for s in range(back, 0, -1)), x], 4)  # (B, h, r, nc, (back+1)·m, …)

        q_pos = chunks(order, t)  # (B, h, r, nc, m) positions
        k_pos = window(q_pos, t)  # (B, h, r, nc, (back+1)·m)
        qs = chunks(rows(q), 0.0)  # (B, h, r, nc, m, d_h)
        ks, vs = window(F.normalize(qs, dim=-1), 0.0), window(chunks(rows(v), 0.0), 0.0)  # shared QK: unit keys

        # The product's output is not kept for its backward: the masks go in in place.
        scores = (qs * d**-0.5) @ ks.transpose(-1, -2)  # (B, h, r, nc, m, (back+1)·m)
        key = self.set_keys(bucket, chunk, mask)  # (B, h, r, T + 1)
        visible = self.in_set(key, q_pos, k_pos, slice(None))  # (B, h, r, nc, m, (back+1)·m)
        if self.causal:
            visible &= k_pos[..., None, :] <= q_pos[..., :, None]
        scores.masked_fill_(~visible, torch.finfo(scores.dtype).min)
        scores.masked_fill_((k_pos[..., None, :] == q_pos[..., :, None]) & visible, SELF_SCORE)  # itself
        if r > 1:  # − log N_ij: each pair once in the union
            repeats = sum(self.in_set(key, q_pos, k_pos, slice(rr, rr + 1)).to(scores.dtype) for rr in range(r))
            scores = scores - repeats.clamp(min=1).log()
        p = scores.softmax(-1)  # (B, h, r, nc, m, (back+1)·m)
        out = F.dropout(p, dropout_p) @ vs  # (B, h, r, nc, m, d_h)

        # Unsort each round, then combine rounds by their share of the union's softmax mass.
        out = out.flatten(3, 4)[:, :, :, :t].gather(3, rank[..., None].expand(-1, -1, -1, -1, d))  # (B, h, r, T, d_h)
        if r == 1:
            return out[:, :, 0]  # (B, h, T, d_h)
        # L_i^r = max_j s_ij − log max_j p_ij (the largest p is ≥ 1/w: no cancellation; one exp, in the softmax)
        lse = scores.amax(-1, keepdim=True) - p.amax(-1, keepdim=True).log()  # (B, h, r, nc, m, 1)
        weight = lse.flatten(3, 4)[:, :, :, :t].gather(3, rank[..., None]).softmax(2)  # (B, h, r, T, 1)
        return (weight * out).sum(2)  # (B, h, T, d_h)

    def chunk_index(self, bucket: Tensor, rank: Tensor) -> Tensor:
        """Each position's chunk per round (B, h, r, T). Non-causal: rank // m in the sorted sequence (the paper).
        Causal: rank within its bucket // m, which only earlier positions of the bucket decide: in the paper's
        chunking a future token's bucket shifts every later bucket's chunk boundaries, i.e. earlier queries'
        key sets (a leak)."""
        if not self.causal:
            return rank // self.bucket_size
        counts = torch.zeros(*bucket.shape[:3], self.n_buckets + 1, dtype=torch.long, device=bucket.device)
        counts.scatter_add_(-1, bucket, torch.ones_like(bucket))  # tokens per bucket: (B, h, r, nb + 1)
        first = counts.cumsum(-1) - counts  # where each bucket starts in the sort
        return (rank - first.gather(-1, bucket)) // self.bucket_size

    def set_keys(self, bucket: Tensor, chunk: Tensor, mask: Optional[Tensor]) -> Tensor:
        """κ (B, h, r, T + 1), int32, with κ_i − κ_j ∈ {0, 1} exactly when j ∈ P_i^r: same bucket and j's chunk i's
        or the one before (κ = bucket·(nc + 2) + chunk, chunks < nc). A padded position and the dummy T (which
        pads the last chunk) get keys below every real one and two apart: they meet only themselves."""
        t = bucket.shape[-1]
        nc = -(-t // self.bucket_size)
        key = bucket.to(torch.int32) * (nc + 2) + chunk.to(torch.int32)  # (B, h, r, T)
        alone = -4 - 2 * torch.arange(t + 1, device=key.device, dtype=torch.int32)  # (T + 1,): no partner
        if mask is not None:
            key = torch.where(mask[:, None, None, :], key, alone[:t])
        return torch.cat([key, alone[t:].expand(*key.shape[:3], 1)], -1)

    @staticmethod
    def in_set(key: Tensor, q_pos: Tensor, k_pos: Tensor, rounds: slice) -> Tensor:
        """j ∈ P_i^r in the given round(s) of the keys κ (B, h, r, T + 1) (:meth:`set_keys`), for the pairs of
        q_pos (B, h, r, nc, m) × k_pos (B, h, r, nc, w) → (…, m, w)."""
        table = key[:, :, rounds].expand(-1, -1, q_pos.shape[2], -1)

        def at(pos: Tensor) -> Tensor:
            return table.gather(3, pos.flatten(3)).view_as(pos)

        return ((at(q_pos)[..., :, None] - at(k_pos)[..., None, :]) >> 1) == 0  # a difference of 0 or 1
