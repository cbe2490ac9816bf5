"""Causal Linformer (``kind: linformer``, ``causal: true``), causal by construction.

The sequence is cut into blocks of w = ⌈n/k⌉ tokens; slot j compresses block j only (block-diagonal E, or the
conv/pool window j). Query i, in block b = ⌊i/w⌋, attends in one softmax to the slots of the completed blocks
j < b (every token of which is ≤ bw − 1 < i) and exactly, causally, to the keys bw … i of its own block::

    scores_i = [ q_i s_jᵀ / √d_h  for j < b ]  ⧺  [ q_i k_tᵀ / √d_h  for bw ≤ t ≤ i ]
    out_i    = softmax(scores_i) · [ F-slots j < b ; v_t for bw ≤ t ≤ i ]      O(T(k + w)d)

Every key of the prefix enters exactly once (compressed or exact); nothing at a position > i does.
Two engines compute it (``engine``): ``reference`` (:meth:`CausalLinformer.blockwise`) runs rows of queries through
chunked SDPA calls with an additive mask (what ``auto`` runs on a CPU); ``fused`` (``auto`` on CUDA,
:meth:`CausalLinformer.flex_blockwise`) is one FlexAttention call over the keys [K ; E-slots] with a block mask that
lists only the tiles holding visible pairs: compiled on a GPU, one Triton kernel forward and one backward.
Incremental decoding (:meth:`CausalLinformer.step`) keeps a fixed-size state per layer and head: the completed
slots (≤ k) and the current block's keys/values (≤ w), so a token costs O((k + w)·d) whatever its position.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_modules.attention.flex import compiled_flex_attention, flex_cannot_run
from lightning_modules.attention.linformer.bidirectional import Linformer
from lightning_modules.attention.linformer.projections import blocks

# The library's function: a call that finds it replaced (lightning_modules.analysis.recorded_attention, which reads
# the probabilities of the SDPA calls) runs the reference engine, whose calls it can read.
_SDPA = F.scaled_dot_product_attention


def _bias(
    batch: int,
    t: int,
    w: int,
    u: int,
    dtype: torch.dtype,
    device: torch.device,
    mask: Optional[Tensor] = None,
    real_slots: Optional[Tensor] = None,
) -> Tensor:
    """The additive mask of :meth:`CausalLinformer.blockwise`, (B, nr, 1, u, u + nb − 1) over the keys
    [the row's own u positions ; slots]: query i sees the real keys of its own block up to i and the slots
    j < ⌊i/w⌋ (non-empty: ``real_slots`` (B, nb − 1)); ``mask`` (B, T), None: no padding."""
    nb, nr = -(-t // w), -(-t // u)
    # Visibility, without the head axis: (B, nr, u, u + nb - 1).
    position = torch.arange(nr * u, device=device).view(nr, u)  # (nr, u)
    block = position // w
    own = block[:, :, None] == block[:, None, :]  # (nr, u, u)
    local_ok = own & (position[:, None, :] <= position[:, :, None])  # own block, key ≤ query
    slot_ok = torch.arange(nb - 1, device=device) < block[..., None]  # j < b: (nr, u, nb-1)
    if mask is not None:
        local_ok = local_ok & blocks(mask[..., None], u)[:, :, None, :, 0]  # (B, nr, u, u)
        slot_ok = slot_ok & real_slots[:, None, None, :]  # (B, nr, u, nb-1)
    visible = torch.cat([local_ok.expand(batch, nr, u, u), slot_ok.expand(batch, nr, u, nb - 1)], -1)
    # Additive, with two floors: keys of the row's other blocks are outside query i's key set
    # (the dtype's lowest value), hidden keys of its set [own block ; slots] get half of it.
    # A query without any visible key (only an all-padding prefix) then averages its set's values,
    # finite, instead of SDPA's zeros (or NaN in an explicit softmax). Adding a score to half the
    # lowest value never reaches −inf, and in fp32/bf16 leaves it unchanged.
    lowest = torch.finfo(dtype).min
    bias = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, lowest / 2)
    bias[..., :u].masked_fill_(~own, lowest)
    return bias[:, :, None]


@functools.lru_cache(maxsize=32)
def _unpadded_bias(
    batch: int, t: int, w: int, u: int, dtype: torch.dtype, device: torch.device, inference: bool
) -> Tensor:
    """:func:`_bias` without padding, cached per shape, dtype and device (every layer of that w, every step use
    the same one instead of building it again); ``inference`` keys apart the tensors built in inference mode,
    which autograd may not save for a training step."""
    return _bias(batch, t, w, u, dtype, device)


def _rows(x: Tensor, a: int, z: int, u: int, slots: Optional[Tensor] = None) -> Tensor:
    """Positions a … z − 1 of x (B, h, T, d_h), a row of u each (the last one zero-padded), then ``slots``
    (B, h, s, d_h) after every row → (B·m, h, u + s, d_h), m = ⌈(z − a)/u⌉."""
    m = -(-(z - a) // u)
    xr = x[:, :, a:z]
    if z - a < m * u:
        xr = F.pad(xr, (0, 0, 0, m * u - (z - a)))
    xr = xr.unflatten(2, (m, u)).transpose(1, 2)  # (B, m, h, u, d_h)
    if slots is not None:
        xr = torch.cat([xr, slots[:, None].expand(-1, m, -1, -1, -1)], -2)
    return xr.flatten(0, 1)


def blockwise_context_matrix(chunks: list[Tensor], length: int, window: int) -> Tensor:
    """Causal Linformer's context-mapping matrix P̃ from the probabilities of its SDPA calls, one per chunk.

    Chunk c: (B·m_c, h, u, u + s_c), its row r (of sequence b: index b·m_c + r) holding the u queries of one
    row of positions against [the same u positions ; slots 0 … s_c − 1] (w = ``window``, nb = ⌈T/w⌉,
    T = ``length``, :meth:`CausalLinformer.blockwise`) →
    P̃ (B, h, T, nb − 1 + T): query i keeps its slot weights in columns 0 … nb − 2 and puts its weight on key t
    at column nb − 1 + t (zero outside its row, where the layer's mask already leaves only its own block), so
    that out_i = Σ_j P̃_ij [F-slots ; V]_j. Memory O(B·h·T²): for analysis, not training.
    """
    u, slots = chunks[0].shape[-2], -(-length // window) - 1
    nr = -(-length // u)
    batch = sum(c.shape[0] for c in chunks) // nr
    p = chunks[0].new_zeros(batch, chunks[0].shape[1], nr * u, slots + nr * u)  # (B, h, nr·u, nb-1+nr·u)
    row = 0
    for chunk in chunks:
        pr = chunk.unflatten(0, (batch, -1))  # (B, m, h, u, u + s)
        for r in range(pr.shape[1]):
            q0 = (row + r) * u  # the row's first query
            p[:, :, q0 : q0 + u, : chunk.shape[-1] - u] = pr[:, r, :, :, u:]  # its slot weights
            p[:, :, q0 : q0 + u, slots + q0 : slots + q0 + u] = pr[:, r, :, :, :u]  # its own positions
        row += pr.shape[1]
    return p[:, :, :length, : slots + length]


# ------------------------------------------------------------------------------ the fused engine's block mask
def _tiles(t: int, w: int, slots: int, tile: int) -> tuple[list[list[int]], list[list[int]]]:
    """Per query tile (rows r·tile …), the tiles of the key columns [keys ; slots] (T + slots of them) that hold a
    pair visible to one of its queries: (partial, full), full where every pair is visible and the tile lies inside
    both lengths (FlexAttention skips the mask there). Query i sees the keys ⌊i/w⌋w … i and the slot columns
    T … T + ⌊i/w⌋ − 1; a tile of queries qa … qb, the key range ⌊qa/w⌋w … qb and T … T + min(⌊qb/w⌋, slots) − 1.
    O(T/tile · (w + slots)/tile)."""
    partial: list[list[int]] = []
    full: list[list[int]] = []
    for qa in range(0, t, tile):
        qb = min(qa + tile, t) - 1
        ranges = [(qa // w * w, qb)] + ([(t, t + min(qb // w, slots) - 1)] if min(qb // w, slots) > 0 else [])
        touched = sorted({c for lo, hi in ranges for c in range(lo // tile, hi // tile + 1)})
        inside = [c for c in touched if qa + tile <= t and (c + 1) * tile <= t + slots]
        every = [c for c in inside if _every_pair_visible(qa, qb, c * tile, (c + 1) * tile - 1, t, w)]
        partial.append([c for c in touched if c not in every])
        full.append(every)
    return partial, full


def _every_pair_visible(qa: int, qb: int, ka: int, kb: int, t: int, w: int) -> bool:
    """Queries qa … qb see every key column ka … kb: its keys (< T) lie in their one block at or before qa, its
    slots (≥ T) all precede ⌊qa/w⌋."""
    last_key = min(kb, t - 1)
    keys = ka >= t or (qa // w == qb // w == ka // w == last_key // w and last_key <= qa)
    return keys and (kb < t or kb - t < qa // w)


class _Layout(NamedTuple):
    """What the fused engine's block mask needs at one (T, w, slots, tile), on the device: each query's block, each
    key column's block (a slot's: its own index) and slot flag, and the tile lists (:func:`_tiles`) as FlexAttention
    takes them: counts (1, 1, R) and indices (1, 1, R, C), partial, full, and both together."""

    query_block: Tensor  # (T,)
    key_block: Tensor  # (T + slots,)
    slot: Tensor  # (T + slots,) bool
    partial: tuple[Tensor, Tensor]
    full: tuple[Tensor, Tensor]
    listed: tuple[Tensor, Tensor]


def _tile_tensors(lists: list[list[int]], columns: int, device: torch.device) -> tuple[Tensor, Tensor]:
    counts = torch.tensor([len(row) for row in lists], dtype=torch.int32)
    indices = torch.zeros(len(lists), max(columns, 1), dtype=torch.int32)
    for r, row in enumerate(lists):
        indices[r, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return counts[None, None].to(device), indices[None, None].to(device)


@functools.lru_cache(maxsize=32)
def _layout(t: int, w: int, slots: int, tile: int, device: torch.device, inference: bool) -> _Layout:
    """The :class:`_Layout` of one shape, built once (every layer of that w, every step); ``inference`` keys apart
    the tensors built in inference mode, which autograd may not save for a training step."""
    partial, full = _tiles(t, w, slots, tile)
    columns = -(-(t + slots) // tile)
    position = torch.arange(t + slots, device=device)
    slot = position >= t
    return _Layout(
        position[:t] // w,
        torch.where(slot, position - t, position // w),
        slot,
        _tile_tensors(partial, columns, device),
        _tile_tensors(full, columns, device),
        _tile_tensors([sorted(p + f) for p, f in zip(partial, full)], columns, device),
    )


def _visible(layout: _Layout, real: Optional[Tensor]) -> Callable[..., Tensor]:
    """FlexAttention's mask_mod(b, h, i, j) over the key columns [keys ; slots]: key j of query i's own block with
    j ≤ i, or slot j − T of a block before query i's; with padding (``real`` (B, T + slots): real keys, non-empty
    slots) only real ones. Positions and blocks are captured tensors, so one compiled kernel serves every w."""
    query_block, key_block, slot = layout.query_block, layout.key_block, layout.slot

    def visible(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        own = (j <= i) & (key_block[j] == query_block[i])
        past = slot[j] & (key_block[j] < query_block[i])
        return own | past if real is None else (own | past) & real[b, j]

    return visible


# Built eagerly (and cached) even inside a compiled model: traced, a mask_mod whose captured tensors are made in the
# graph fails to lower or gives wrong outputs (torch 2.13, measured on a CPU); made outside, they are kernel inputs.
@torch.compiler.disable
def block_mask(t: int, w: int, slots: int, device: torch.device, real: Optional[Tensor] = None, tile: int = 128):
    """The fused engine's ``BlockMask`` over queries × [keys ; slots] in tiles of ``tile``: without padding the listed
    tiles split into partial and full (built once per shape); with it (``real`` (B, T + slots)) every listed tile
    partial, its mask_mod deciding each pair."""
    from torch.nn.attention.flex_attention import BlockMask

    inference = torch.is_inference_mode_enabled()
    if real is None:
        return _unpadded_block_mask(t, w, slots, tile, device, inference)
    layout = _layout(t, w, slots, tile, device, inference)
    return BlockMask.from_kv_blocks(
        *layout.listed, BLOCK_SIZE=tile, mask_mod=_visible(layout, real), seq_lengths=(t, t + slots)
    )


@functools.lru_cache(maxsize=32)
def _unpadded_block_mask(t: int, w: int, slots: int, tile: int, device: torch.device, inference: bool):
    """:func:`block_mask` without padding, built once per shape."""
    from torch.nn.attention.flex_attention import BlockMask

    layout = _layout(t, w, slots, tile, device, inference)
    return BlockMask.from_kv_blocks(
        *layout.partial, *layout.full, BLOCK_SIZE=tile, mask_mod=_visible(layout, None), seq_lengths=(t, t + slots)
    )


class CausalLinformer(Linformer):
    context_label = "P̃ = softmax over [past slots ; own block]"
    FLEX_TILE = 128  # FlexAttention's tile (queries × keys) of the fused engine's block mask

    def context_matrix(self, calls: list[Tensor], length: int) -> Tensor:
        """P̃ (B, h, T, nb − 1 + T) from the layer's calls, one per chunk of rows (:func:`blockwise_context_matrix`)."""
        return blockwise_context_matrix(calls, length, self.bank.window(self.layer))

    def attend_qkv(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        if self.runs_flex(q, dropout_p) and self.attend_checked(q, k, v, mask):
            return self.flex_blockwise(q, k, v, mask)  # (B, h, T, d_h): one FlexAttention call
        return self.blockwise(q, k, v, mask, dropout_p)  # (B, h, T, d_h): rows through chunked SDPA calls

    def auto_fuses(self, device: torch.device) -> bool:
        """``engine: auto`` runs FlexAttention on CUDA only, where it is compiled; on a CPU it would run eagerly."""
        return device.type == "cuda"

    def runs_flex(self, q: Tensor, dropout_p: float) -> bool:
        """The fused engine's call (:meth:`fused`), unless FlexAttention cannot run it
        (:func:`~lightning_modules.attention.flex.flex_cannot_run`: the count of FLOPs is then the reference's) or
        ``scaled_dot_product_attention`` is replaced (analysis reads the reference's calls)."""
        return self.fused(q) and not flex_cannot_run(q, dropout_p) and F.scaled_dot_product_attention is _SDPA

    def attend_checked(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> bool:
        """The fused engine's check (:meth:`fused_agrees`) on the call's first sequence: one FlexAttention call
        against the reference's rows."""
        first = [t[:1] for t in (q, k, v)]
        m = None if mask is None else mask[:1]
        return self.fused_agrees(
            q, lambda: (self.flex_blockwise(*first, m),), lambda: (self.blockwise(*[t.clone() for t in first], m, 0.0),)
        )

    def flex_blockwise(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], attention: Optional[Callable] = None
    ) -> Tensor:
        """Causal Linformer (module docstring) as one FlexAttention call: q, k, v (B, h, T, d_h) → (B, h, T, d_h).

        The slots are :meth:`blockwise`'s; queries attend over [K ; E-slots] and [V ; F-slots] (B, h, T + nb − 1,
        d_h) under :func:`block_mask`: query i sees the (real) keys of its own block up to i and the (non-empty)
        slots j < ⌊i/w⌋. Compiled, Flex visits only the tiles holding such pairs: O(T·(w + k + tile)·d) work and no
        mask in memory; a query with no visible key (padding only) gets zeros. ``attention``: the FlexAttention
        function (default compiled on CUDA, eager elsewhere).
        """
        t, w = q.shape[2], self.bank.window(self.layer)
        past = (-(-t // w) - 1) * w  # tokens in completed-able blocks
        past_mask = None if mask is None else mask[:, :past]
        sk = self.bank.compress(self.layer, 0, k[:, :, :past], past_mask)  # (B, h, nb-1, d_h)
        sv = self.bank.compress(self.layer, 1, v[:, :, :past], past_mask)
        keys, values = torch.cat([k, sk.to(k.dtype)], 2), torch.cat([v, sv.to(v.dtype)], 2)  # (B, h, T+nb-1, d_h)
        real = None if mask is None else torch.cat([mask, self.bank.nonempty_slots(self.layer, past_mask)], 1)
        blocked = block_mask(t, w, sk.shape[2], q.device, real, self.FLEX_TILE)
        if attention is None:
            from torch.nn.attention.flex_attention import flex_attention

            attention = compiled_flex_attention() if q.device.type == "cuda" else flex_attention
        return attention(q, keys, values, block_mask=blocked)

    def blockwise(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], p: float) -> Tensor:
        """Causal Linformer (module docstring): q, k, v (B, h, T, d_h) → (B, h, T, d_h).

        Blocks b = 0 … nb − 1 (nb = ⌈T/w⌉); slots of blocks 0 … nb − 2 (the last block is nobody's past).
        Queries go in rows of u = g·w consecutive positions (g whole blocks; nr = ⌈T/u⌉ rows, the tail
        zero-padded), m rows per ``scaled_dot_product_attention`` call (:meth:`rows_per_call`): queries
        (B·m, h, u, d_h) against [the row's own u keys ; the slots its call can see] (B·m, h, u + s, d_h),
        s = min(nb − 1, g·r₁ − 1) for a call ending before row r₁, with an additive mask that leaves query i
        the real keys of its own block up to i and the slots j < ⌊i/w⌋ (non-empty). Each row repeats its
        call's s slots: rows of u ≥ 2d_h queries (g = ⌈2d_h/w⌉) keep that repeat no larger than the scores a
        hand-written softmax would hold, and the calls' growing prefixes skip about half of the slot scores
        a single call over every slot would mask. Without autograd the output of a call is written over
        its own rows of q, which no later call reads: no (B, h, T, d_h) tensor beyond q, k and v is held.
        """
        batch, t, w = q.shape[0], q.shape[2], self.bank.window(self.layer)
        nb, u = -(-t // w), w * -(-2 * self.d_head // w)
        nr, g = -(-t // u), u // w
        m = self.rows_per_call(t, u, nb)
        past = (nb - 1) * w  # tokens in completed-able blocks
        past_mask = None if mask is None else mask[:, :past]
        sk = self.bank.compress(self.layer, 0, k[:, :, :past], past_mask)  # (B, h, nb-1, d_h)
        sv = self.bank.compress(self.layer, 1, v[:, :, :past], past_mask)
        if mask is None:  # the same for every layer of this w and every step: built once
            bias = _unpadded_bias(batch, t, w, u, q.dtype, q.device, torch.is_inference_mode_enabled())
        else:
            bias = _bias(batch, t, w, u, q.dtype, q.device, mask, self.bank.nonempty_slots(self.layer, past_mask))
        in_place = not (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, sk, sv)))
        pieces = []
        for r0 in range(0, nr, m):
            r1 = min(r0 + m, nr)
            a, z, s = r0 * u, min(r1 * u, t), min(nb - 1, g * r1 - 1)
            out = F.scaled_dot_product_attention(
                _rows(q, a, z, u),
                _rows(k, a, z, u, sk[:, :, :s]),
                _rows(v, a, z, u, sv[:, :, :s]),
                attn_mask=bias[:, r0:r1, ..., : u + s].flatten(0, 1),
                dropout_p=p,
            )  # (B·(r1-r0), h, u, d_h)
            out = out.unflatten(0, (batch, r1 - r0)).transpose(1, 2).flatten(2, 3)[:, :, : z - a]
            if in_place:
                q[:, :, a:z] = out
            else:
                pieces.append(out)
        return q if in_place else torch.cat(pieces, 2)

    @staticmethod
    def rows_per_call(t: int, u: int, nb: int) -> int:
        """Rows of u queries per SDPA call: at most 512 queries, and few enough that a call's keys and values
        (m rows of u + nb − 1 at most) stay within T/4 rows each, a quarter of K's."""
        return max(1, min(512 // u, t // (4 * (u + nb - 1))))

    # ------------------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int, capacity: int, device: Any = None, dtype: Any = None) -> dict:
        """Fixed size whatever the position (capacity unused; the bank's n bounds it): ``slot_k``, ``slot_v``
        (B, h, slots, d_h), the current block's ``block_k``, ``block_v`` (B, h, w, d_h); ``t`` the next position."""
        slots, w = self.bank.slots(self.layer), self.bank.window(self.layer)

        def zeros(rows: int) -> Tensor:
            return torch.zeros(batch_size, self.n_heads, rows, self.d_head, device=device, dtype=dtype)

        return {"t": 0, "slot_k": zeros(slots), "slot_v": zeros(slots), "block_k": zeros(w), "block_v": zeros(w)}

    def step(self, x: Tensor, state: dict) -> tuple[Tensor, dict]:
        """Attend to the j = ⌊t/w⌋ completed slots and the r + 1 = t − jw + 1 keys of the current block; when
        the block completes, compress it into slot j. x (B, 1, d) → ((B, 1, d), state), updated in place."""
        t = state["t"]
        if t >= self.bank.max_len:
            raise ValueError(f"decoding position {t} exceeds the state's capacity of {self.bank.max_len} tokens")
        q = self.heads(self.q_proj(x))  # (B, h, 1, d_h)
        k, v = self.keys_values(x)
        w = self.bank.window(self.layer)
        j, r = divmod(t, w)
        state["block_k"][:, :, r], state["block_v"][:, :, r] = k[:, :, 0], v[:, :, 0]
        keys = torch.cat([state["slot_k"][:, :, :j], state["block_k"][:, :, : r + 1]], 2)  # (B, h, j+r+1, d_h)
        values = torch.cat([state["slot_v"][:, :, :j], state["block_v"][:, :, : r + 1]], 2)
        if r == w - 1 and j < self.bank.slots(self.layer):
            state["slot_k"][:, :, j] = self.bank.compress_block(self.layer, 0, state["block_k"], j)
            state["slot_v"][:, :, j] = self.bank.compress_block(self.layer, 1, state["block_v"], j)
        out = F.scaled_dot_product_attention(q, keys, values)  # (B, h, 1, d_h)
        state["t"] = t + 1
        return self.merge_step(out), state
