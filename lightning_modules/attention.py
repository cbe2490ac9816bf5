"""Multi-head self-attention: full softmax attention and Linformer (Wang et al. 2020, Eq. 7) with its variants.

Shapes: B batch, T sequence length (≤ n = max_len), d model width, h heads, d_h = d / h,
k_l the projected length of this layer, G ∈ {1, h} how many distinct E (or F) the layer has,
w = ⌈n/k_l⌉ the window of windowed / causal projections. E, F and their kinds (dense, conv, pool)
live in :class:`~lightning_modules.projections.ProjectionBank`; this module holds the attention maths.

Full attention (``kind: full``; ``causal`` masks keys after the query)::

    head_i = softmax(Q_i K_iᵀ / √d_h) V_i                        (B, h, T, d_h)      O(T²d)

Linformer (Eq. 7, ``project: kv``), E K and F V being the bank's slots (k' = k_l dense, ⌈T/w⌉ windowed)::

    head_i = softmax(Q_i (E_i K_i)ᵀ / √d_h) (F_i V_i)             (B, h, T, d_h)      O(Tk'd)

A windowed slot with no real token in its window is masked out of the softmax.

Key-only / value-only (``project: k`` / ``v``): only one side passes through the rank-k sequence
bottleneck; P = E_m⁺E_m (the orthogonal projector onto E's row space on the real positions) lifts it
back to T rows, and attention is otherwise full::

    project k:  head_i = softmax(Q_i (P K_i)ᵀ / √d_h) V_i          O(T²d + Tk²): these isolate the
    project v:  head_i = softmax(Q_i K_iᵀ / √d_h) (P V_i)          approximation error, not speed.

With k ≥ the number of real tokens (any full-rank E), P = I and both equal full attention.

Causal Linformer (``causal: true``), causal by construction: the sequence is cut into blocks of w
tokens; slot j compresses block j only (block-diagonal E, or the conv/pool window j). Query i, in
block b = ⌊i/w⌋, attends in ONE softmax to the slots of the completed blocks j < b (every token of
which is ≤ bw − 1 < i) and exactly, causally, to the keys bw … i of its own block::

    scores_i = [ q_i s_jᵀ / √d_h  for j < b ]  ⧺  [ q_i k_tᵀ / √d_h  for bw ≤ t ≤ i ]
    out_i    = softmax(scores_i) · [ F-slots j < b ; v_t for bw ≤ t ≤ i ]      O(T(k + w)d)

Every key of the prefix enters exactly once (compressed or exact); nothing at a position > i
does. Incremental decoding (:meth:`SelfAttention.step`) keeps a fixed-size state per layer and head:
the completed slots (≤ k) and the current block's keys/values (≤ w), so a token costs O((k + w)·d)
whatever its position. Full causal attention offers the same API with a KV cache of T rows.

Padding: padded rows of K and V are zeroed *before* E/F (a padded position contributes nothing to
any slot) and padded keys are masked wherever attention is exact, so appending padding leaves real
tokens' outputs unchanged for every variant. Short sequences use the first T columns of E/F (first
⌈T/w⌉ windows) *without rescaling*: a sequence's slots are then the same sums whatever padding or
block length surrounds it; rescaling by n/T would make them depend on the batch's padded length, and
the model already sees every length it is trained on.

Two exact ways to evaluate E K for dense and pool projections (``path``; conv, causal and one-sided
variants use ``projected``: conv's per-channel weights do not commute with W_k, and the others need
every key row anyway):

* ``projected``: K = X W_kᵀ + 1 b_kᵀ first, then E K (Eq. 7 as written): T·d² + G·k·T·d_h·h/G flops;
* ``input``: E K = (E X) W_kᵀ + (E 1) b_kᵀ — project the layer input along the sequence first,
  then apply W_k to only k rows: G·k·T·d + k·d² flops, far cheaper when E is shared by heads.
  With padding, E 1 becomes E m (m the 0/1 mask), i.e. E's columns at padded positions are zero.

``auto`` picks the cheaper one from these counts.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_modules.projections import ProjectionBank, blocks


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
        causal: no output depends on a later position (full: ``is_causal``; linformer: blockwise,
            which needs a bank built with ``causal=True``).
        layer: index of this layer in the encoder (selects its matrices in ``bank``).
        bank: the model's :class:`ProjectionBank` (Linformer only); its ``projection`` and
            ``project`` select the variant.
        path: ``auto`` | ``input`` | ``projected`` (see module docstring).
        dropout: dropout on attention probabilities.
    """

    def __init__(self, d_model: int, n_heads: int, kind: str = "full", causal: bool = False,
                 layer: int = 0, bank: Optional[ProjectionBank] = None, path: str = "auto",
                 dropout: float = 0.0) -> None:
        super().__init__()
        if kind == "linformer" and bank is None:
            raise ValueError("linformer attention needs a ProjectionBank")
        if kind == "linformer" and bank.causal != causal:
            raise ValueError(f"causal={causal} but the ProjectionBank was built with causal={bank.causal}")
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
            self.path = self._choose_path(path)

    def _choose_path(self, path: str) -> str:
        bank = self.bank
        commutes = not bank.causal and bank.project == "kv" and bank.projection != "conv"
        if path == "input" and not commutes:
            raise ValueError("path 'input' needs a non-causal, two-sided dense or pool projection")
        if path != "auto":
            return path
        if not commutes:
            return "projected"
        groups = 1 if bank.blockwise else bank.groups
        cheaper = input_path_is_cheaper(groups, bank.slots(self.layer), bank.max_len, self.d_model)
        return "input" if cheaper else "projected"

    def _heads(self, x: Tensor) -> Tensor:
        """(B, T, d) → (B, h, T, d_h)."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """x: (B, T, d); mask: (B, T) bool, True at real tokens (None: no padding) → (B, T, d)."""
        b, t, _ = x.shape
        q = self._heads(self.q_proj(x))                                   # (B, h, T, d_h)
        p = self.dropout if self.training else 0.0
        key_mask = None if mask is None else mask[:, None, None, :]       # (B, 1, 1, T)
        if self.kind == "full":
            k, v = self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
            if key_mask is not None and self.causal:
                key_mask = key_mask & torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p,
                                                 is_causal=self.causal and mask is None)
        elif self.causal:
            k, v = self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
            out = self._blockwise_causal(q, k, v, mask, p)
        elif self.bank.project != "kv":
            k, v = self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
            if self.bank.project == "k":
                k = self.bank.lift(self.layer, 0, k, mask)                # P K, (B, h, T, d_h)
            else:
                v = self.bank.lift(self.layer, 1, v, mask)                # P V
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p)
        else:
            k, v = self._compressed_kv(x, mask)                           # (B, h, k', d_h) each
            real = self.bank.nonempty_slots(self.layer, mask)             # (B, k') or None
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p,
                                                 attn_mask=None if real is None else real[:, None, None, :])
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.d_model))

    def _compressed_kv(self, x: Tensor, mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """E K and F V, each (B, h, k', d_h), by the layer's exact path."""
        bank, layer = self.bank, self.layer
        if self.path == "projected":
            k, v = self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
            return bank.compress(layer, 0, k, mask), bank.compress(layer, 1, v, mask)
        ones = x.new_ones(1, 1, x.shape[1], 1)
        xe, mass = bank.compress(layer, 0, x.unsqueeze(1), mask), bank.compress(layer, 0, ones, mask)
        k = self._apply_linear(xe, mass, self.k_proj)                     # (B, G, k', d) → (B, h, k', d_h)
        if bank.sides == 2:                                               # E = F: compress once
            xe, mass = bank.compress(layer, 1, x.unsqueeze(1), mask), bank.compress(layer, 1, ones, mask)
        v = self._apply_linear(xe, mass, self.v_proj)
        return k, v

    def _apply_linear(self, xe: Tensor, mass: Tensor, linear: nn.Linear) -> Tensor:
        """(E X) Wᵀ + (E m) bᵀ per head: (B, G, k, d), mass (B or 1, G, k, 1) → (B, h, k, d_h)."""
        w = linear.weight.view(self.n_heads, self.d_head, self.d_model)  # (h, d_h, d)
        bias = linear.bias.view(self.n_heads, 1, self.d_head)            # (h, 1, d_h)
        return xe @ w.transpose(1, 2) + mass * bias

    def _blockwise_causal(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], p: float) -> Tensor:
        """Causal Linformer (module docstring): q, k, v (B, h, T, d_h) → (B, h, T, d_h).

        Blocks b = 0 … nb − 1 (nb = ⌈T/w⌉); slots of blocks 0 … nb − 2 (the last block is nobody's
        past). One ``scaled_dot_product_attention`` call over rows of u = g·w consecutive queries (g
        whole blocks, the tail zero-padded; nr = ⌈T/u⌉ rows per sequence): queries (B·nr, h, u, d_h)
        against keys and values [slots ; the row's own u positions] (B·nr, h, nb − 1 + u, d_h), with an
        additive mask (B·nr, 1, u, nb − 1 + u) that leaves query i the slots j < ⌊i/w⌋ (non-empty) and
        the real keys of its own block up to i. Every row repeats the slots: 2(nb − 1)d_h numbers,
        against the u(nb − 1) slot scores of its queries, so rows of u ≥ 2d_h queries (g = ⌈2d_h/w⌉)
        keep the repeat no larger than the scores a hand-written softmax would hold, for u − w extra
        (masked) local scores per query.
        """
        batch, t, w = q.shape[0], q.shape[2], self.bank.window(self.layer)
        nb, u = -(-t // w), w * -(-2 * self.d_head // w)
        nr = -(-t // u)
        past = (nb - 1) * w                                                # tokens in completed-able blocks
        past_mask = None if mask is None else mask[:, :past]
        sk = self.bank.compress(self.layer, 0, k[:, :, :past], past_mask)  # (B, h, nb-1, d_h)
        sv = self.bank.compress(self.layer, 1, v[:, :, :past], past_mask)

        def rows(x: Tensor, slots: Optional[Tensor] = None) -> Tensor:
            """(B, h, T, d_h) → (B·nr, h, u, d_h), preceded by the slots: (B·nr, h, nb-1+u, d_h)."""
            xr = blocks(x, u).transpose(1, 2)                              # (B, nr, h, u, d_h)
            if slots is not None:
                xr = torch.cat([slots[:, None].expand(-1, nr, -1, -1, -1), xr], -2)
            return xr.flatten(0, 1)

        # Visibility, without the head axis: (B, nr, u, nb-1+u).
        position = torch.arange(nr * u, device=q.device).view(nr, u)      # (nr, u)
        block = position // w
        own = block[:, :, None] == block[:, None, :]                       # (nr, u, u)
        slot_ok = torch.arange(nb - 1, device=q.device) < block[..., None]                # j < b: (nr, u, nb-1)
        local_ok = own & (position[:, None, :] <= position[:, :, None])    # own block, key ≤ query
        if mask is not None:
            slot_ok = slot_ok & self.bank.nonempty_slots(self.layer, past_mask)[:, None, None, :]  # (B, nr, u, nb-1)
            local_ok = local_ok & blocks(mask[..., None], u)[:, :, None, :, 0]                      # (B, nr, u, u)
        visible = torch.cat([slot_ok.expand(batch, nr, u, nb - 1), local_ok.expand(batch, nr, u, u)], -1)
        # Additive, with two floors: keys of the row's other blocks are outside query i's key set
        # (the dtype's lowest value), hidden keys of its set [all slots ; own block] get half of it.
        # A query without any visible key (only an all-padding prefix) then averages its set's values,
        # finite, instead of SDPA's zeros (or NaN in an explicit softmax). Adding a score to half the
        # lowest value never reaches −inf, and in fp32/bf16 leaves it unchanged.
        lowest = torch.finfo(q.dtype).min
        bias = q.new_zeros(visible.shape).masked_fill_(~visible, lowest / 2)
        bias[..., nb - 1:].masked_fill_(~own, lowest)
        out = F.scaled_dot_product_attention(rows(q), rows(k, sk), rows(v, sv), attn_mask=bias.flatten(0, 1)[:, None],
                                             dropout_p=p)                  # (B·nr, h, u, d_h)
        return out.unflatten(0, (batch, nr)).transpose(1, 2).flatten(2, 3)[:, :, :t]

    # ------------------------------------------------------------------------- incremental decoding
    def init_state(self, batch_size: int, capacity: int, device: Any = None, dtype: Any = None) -> dict:
        """Empty decoding state of this layer.

        Full causal attention: a KV cache ``k``, ``v`` of (B, h, capacity, d_h), capacity the most
        tokens it will hold. Causal Linformer, fixed size whatever the position (capacity unused; the
        bank's n bounds it): ``slot_k``, ``slot_v`` (B, h, slots, d_h) and the current block's
        ``block_k``, ``block_v`` (B, h, w, d_h). ``t`` is the next position.
        """
        if not self.causal:
            raise ValueError("incremental decoding needs causal attention (attention.causal=true)")

        def zeros(rows: int) -> Tensor:
            return torch.zeros(batch_size, self.n_heads, rows, self.d_head, device=device, dtype=dtype)

        if self.kind == "full":
            return {"t": 0, "k": zeros(capacity), "v": zeros(capacity)}
        slots, w = self.bank.slots(self.layer), self.bank.window(self.layer)
        return {"t": 0, "slot_k": zeros(slots), "slot_v": zeros(slots), "block_k": zeros(w), "block_v": zeros(w)}

    def step(self, x: Tensor, state: dict) -> tuple[Tensor, dict]:
        """The output at position t = state["t"] from its input x (B, 1, d) → ((B, 1, d), state).

        Equals ``forward`` at position t of the sequence fed so far (inference: no dropout). The
        state is updated in place. Causal Linformer: attend to the j = ⌊t/w⌋ completed slots and the
        r + 1 = t − jw + 1 keys of the current block; when the block completes, compress it into slot j.
        """
        t, b = state["t"], x.shape[0]
        limit = state["k"].shape[2] if self.kind == "full" else self.bank.max_len
        if t >= limit:
            raise ValueError(f"decoding position {t} exceeds the state's capacity of {limit} tokens")
        q, k, v = (self._heads(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))  # (B, h, 1, d_h)
        if self.kind == "full":
            state["k"][:, :, t], state["v"][:, :, t] = k[:, :, 0], v[:, :, 0]
            keys, values = state["k"][:, :, : t + 1], state["v"][:, :, : t + 1]
        else:
            w = self.bank.window(self.layer)
            j, r = divmod(t, w)
            state["block_k"][:, :, r], state["block_v"][:, :, r] = k[:, :, 0], v[:, :, 0]
            keys = torch.cat([state["slot_k"][:, :, :j], state["block_k"][:, :, : r + 1]], 2)
            values = torch.cat([state["slot_v"][:, :, :j], state["block_v"][:, :, : r + 1]], 2)
            if r == w - 1 and j < self.bank.slots(self.layer):
                state["slot_k"][:, :, j] = self.bank.compress_block(self.layer, 0, state["block_k"], j)
                state["slot_v"][:, :, j] = self.bank.compress_block(self.layer, 1, state["block_v"], j)
        out = F.scaled_dot_product_attention(q, keys, values)              # (B, h, 1, d_h)
        state["t"] = t + 1
        return self.out_proj(out.transpose(1, 2).reshape(b, 1, self.d_model)), state
