"""What the pattern kinds (``local``, ``sparse``) share: softmax attention restricted to a fixed set of pairs.

A pattern kind states one predicate, ``visible(i, j)`` (may query i see key j; causality included), written in
tensor ops that broadcast, so the same function is FlexAttention's ``mask_mod`` and, evaluated on index grids,
a dense boolean mask::

    M_ij   = visible(i, j) ∧ real_j                                  (B, 1, T, T) or a BlockMask
    head_i = softmax(Q_i K_iᵀ / √d_h + log M) V_i                    (B, h, T, d_h)

Engines (``options.engine``), all computing the same M:

* ``blocked``: :mod:`~lightning_modules.attention.blocked`: query blocks against the keys their pattern reaches
  (the kind's :meth:`PatternAttention.layout`), batched matrix products, O(T·keys per query) time and memory,
  backward and dropout everywhere; no T × T matrix;
* ``dense``: ``scaled_dot_product_attention`` with M materialised: O(T²) time and memory (the reference the
  tests hold the other engines to);
* ``flex``: FlexAttention (``torch.nn.attention.flex_attention``) eager, with a BlockMask built once per
  forward (not per head): skips empty 128×128 tiles only when compiled, so eager it is a check, not a speed-up;
* ``compiled``: ``torch.compile(flex_attention)``: O(pairs·d_h) work, the engine for long sequences on a GPU;
* ``auto`` (default): ``compiled`` on CUDA, ``blocked`` elsewhere.

A call runs ``blocked`` whatever the FlexAttention option when FlexAttention cannot run it: attention dropout in
training (Flex applies no dropout to probabilities), a backward pass on CPU (torch has no CPU FlexAttention
backward), or under :func:`~lightning_modules.flops.count_flops` (eager Flex cannot run under a
``FlopCounterMode``). Every engine's work is counted as the pattern's (:func:`~lightning_modules.flops.counted`):
4·d_h flops per visible pair and head forward, 10·d_h backward (the CPU flash kernels' convention).

Padding: a padded key is invisible to every query, so appending padding never changes a real token's output.
Incremental decoding (causal only): a KV cache of every position, the step attending to the keys
``visible(t, ·)`` selects; a kind whose pattern needs fewer keys keeps a smaller state (``local``: a ring).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor

from lightning_modules import flops
from lightning_modules.attention.base import SelfAttention, kind_options
from lightning_modules.attention.blocked import Layout, blocked_attention
from lightning_modules.attention.flex import compiled_flex_attention, flex_cannot_run


class PatternAttention(SelfAttention):
    """Softmax attention over the pairs ``visible(i, j)`` (module docstring); a kind defines :meth:`visible`."""

    QUERY_BLOCK = 64  # queries per block of the blocked engine
    ROWS_PER_COUNT = 1024  # query rows per chunk when counting visible pairs (bounds the count's memory)

    def __init__(self, model: DictConfig, layer: int = 0, shared: Any = None) -> None:
        super().__init__(model, layer, shared)
        self.max_len, self.engine = int(model.max_len), str(kind_options(model.attention).engine)

    def visible(self, i: Tensor, j: Tensor) -> Tensor:
        """May query i see key j (bool, broadcast of i and j; causality included, padding not)."""
        raise NotImplementedError

    def layout(self, t: int, device: Any) -> Layout:
        """Where the keys visible to each of T queries lie (:class:`~lightning_modules.attention.blocked.Layout`):
        every pair ``visible(i, j)`` with i, j < T lies in one of its parts."""
        raise NotImplementedError

    @staticmethod
    def band(t: int, block: int, first: Tensor, span: int) -> Layout:
        """A band layout of T queries in blocks of ``block``: block β sees the keys [first[β], first[β] + span);
        a band that would reach past T keys becomes one block of every key."""
        if span >= t:
            return Layout(block=t, starts=first.new_zeros(1), span=t)
        return Layout(block=block, starts=first, span=span)

    # ------------------------------------------------------------------------------ the attention
    def attend_qkv(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        return self.patterned(q, k, v, mask, dropout_p)  # (B, h, T, d_h)

    def patterned(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        """softmax(Q Kᵀ/√d_h + log M) V with M = visible ∧ real keys: q, k, v (B, h, T, d_h) → (B, h, T, d_h)."""
        engine = self.engine_for(q, dropout_p)
        if engine == "blocked":
            layout = self.layout(q.shape[2], q.device)  # once per forward, for every head

            def core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                return blocked_attention(q, k, v, layout, self.visible, mask, dropout_p)
        elif engine == "dense":

            def core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=self.dense_mask(q.shape[2], mask, q.device), dropout_p=dropout_p
                )
        else:
            from torch.nn.attention.flex_attention import flex_attention

            attention = compiled_flex_attention() if engine == "compiled" else flex_attention
            block_mask = self.block_mask(q.shape[2], mask, q.device)  # once per forward, for every head

            def core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                return attention(q, k, v, block_mask=block_mask)

        if not flops.counting():
            return core(q, k, v)
        pairs = self.visible_pairs(q.shape[2], mask, q.shape[0]) * self.n_heads * self.d_head
        return flops.counted(core, (q, k, v), forward=4 * pairs, backward=10 * pairs)

    def engine_for(self, q: Tensor, dropout_p: float) -> str:
        """The engine this call runs on (module docstring: the option, unless FlexAttention cannot run it)."""
        if self.engine in ("blocked", "dense"):
            return self.engine
        if self.engine == "auto" and q.device.type != "cuda":
            return "blocked"
        if flex_cannot_run(q, dropout_p):
            return "blocked"
        return "compiled" if self.engine == "auto" else self.engine

    # ------------------------------------------------------------------------------ the mask, two forms
    def mask_mod(self, mask: Optional[Tensor]):
        """FlexAttention's mask_mod(b, h, i, j): the pattern and, with a padding mask, real keys only."""
        if mask is None:
            return lambda b, h, i, j: self.visible(i, j)
        return lambda b, h, i, j: self.visible(i, j) & mask[b, j]

    def block_mask(self, t: int, mask: Optional[Tensor], device: Any):
        from torch.nn.attention.flex_attention import create_block_mask

        batch = None if mask is None else mask.shape[0]
        return create_block_mask(self.mask_mod(mask), batch, None, t, t, device=device)

    def dense_mask(self, t: int, mask: Optional[Tensor], device: Any) -> Tensor:
        """M as a bool tensor: (T, T) without padding, (B, 1, T, T) with it."""
        i = torch.arange(t, device=device)
        seen = self.visible(i[:, None], i[None, :])  # (T, T)
        return seen if mask is None else seen & mask[:, None, None, :]

    def visible_pairs(self, t: int, mask: Optional[Tensor], batch: int) -> int:
        """Σ over the batch of the (real query, real key) pairs M admits: the useful work, for the FLOP count."""
        j = torch.arange(t)
        real = None if mask is None else mask.cpu()
        total = 0
        for i in torch.arange(t).split(self.ROWS_PER_COUNT):
            seen = self.visible(i[:, None], j[None, :])  # (rows, T)
            if real is None:
                total += batch * int(seen.sum())
            else:  # real queries × real keys
                total += int((seen & real[:, i, None] & real[:, None, :]).sum())
        return total

    # ------------------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int, capacity: int, device: Any = None, dtype: Any = None) -> dict:
        """A KV cache of every position (:meth:`SelfAttention.kv_cache`)."""
        return self.kv_cache(batch_size, capacity, device, dtype)

    def step(self, x: Tensor, state: dict) -> tuple[Tensor, dict]:
        """Position t attends to the cached keys j ≤ t with visible(t, j): x (B, 1, d) → ((B, 1, d), state)."""
        q, t = self.cache_step(x, state)  # (B, h, 1, d_h)
        position = torch.arange(t + 1, device=x.device)
        keys = position[self.visible(torch.tensor(t, device=x.device), position)]  # the pattern's keys of row t
        out = F.scaled_dot_product_attention(q, state["k"][:, :, keys], state["v"][:, :, keys])  # (B, h, 1, d_h)
        state["t"] = t + 1
        return self.merge_step(out), state
