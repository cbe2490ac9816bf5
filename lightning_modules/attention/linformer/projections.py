"""Sequence-axis projections of Linformer (E for keys, F for values), their variants and their sharing.

A :class:`ProjectionBank` owns every distinct projection of a model and applies it. Notation: n =
``max_len``, T ≤ n the input length, k_l the projected length of layer l, h heads of width d_h, G ∈
{1, h} distinct matrices per layer and side, S ∈ {1, 2} sides (2: E ≠ F).

Kinds (``projection``), each a registered :class:`ProjectionKind` (:func:`register_projection`), all producing
slots s_j from the rows x_t of a (T, C) sequence:

* ``learned`` / ``random`` (dense, Eq. 7): s_j = Σ_t E_jt x_t with E ∈ R^{k×n} cut to its first T
  columns. ``random`` draws E exactly like ``learned`` (same ``init``, same RNG calls) and freezes it
  as a *buffer*: checkpoints carry it and a reload never redraws it.
* ``conv``: a depthwise convolution along the sequence, kernel = stride = w = ⌈n/k⌉, per-channel
  weights c ∈ R^{C×w} shared by all positions: s_j = Σ_{r<w} c_{·,r} ⊙ x_{jw+r}, i.e.
  ``F.conv1d(xᵀ, c[:, None, :], stride=w, groups=C)``. The sequence is zero-padded at the end to a
  multiple of w, so ⌈T/w⌉ slots come out (⌈n/w⌉ = k when k divides n; otherwise ⌈n/w⌉ ≤ k and the
  k − ⌈n/w⌉ slots a k·w padding would add hold nothing but padding and are dropped).
* ``pool``: the parameter-free mean over the same windows with a *fixed* divisor w,
  s_j = (1/w) Σ_{r<w} x_{jw+r} (a partly padded window is not re-normalised, so padding never
  changes a slot). ``share`` and ``init`` do not apply (no parameters).

Padding: rows of x at padded positions are zeroed before any compression, so a padded position adds
nothing to any slot. Windowed kinds can produce a slot whose window holds no real token;
:meth:`ProjectionBank.nonempty_slots` reports them so attention can mask them out of the softmax.

Causal variant (``causal=True``, blockwise, see ``attention/linformer/causal.py``): every kind compresses only within
blocks of w = ⌈n/k⌉ tokens; a dense E becomes block-diagonal, stored as per-slot weights
e_j ∈ R^w: s_j = Σ_r e_{j,r} x_{jw+r}. The last block is never compressed (no query comes after it),
so a dense causal matrix holds (⌈n/w⌉ − 1)·w ≈ n parameters instead of k·n.

Sharing modes (paper §4), parameters per stored matrix P_l = k_l·n (dense), (⌈n/w_l⌉ − 1)·w_l
(dense causal), w_l·d_h (conv, per head; ×h channels under ``none``), 0 (pool):

====================  =========================================  ==================================
share                 distinct matrices                          parameters (uniform k, dense)
====================  =========================================  ==================================
``none``              E_{l,h}, F_{l,h} per layer l and head h    2·L·h·n·k
``headwise``          E_l, F_l per layer, shared by its heads    2·L·n·k
``kv``                E_l = F_l per layer                        L·n·k
``layerwise``         one E = F for every layer, head and side   n·k
====================  =========================================  ==================================

For ``conv`` the same modes mean: ``none`` a different kernel per channel of every head and side
(c ∈ R^{d×w} per layer and side), ``headwise`` one kernel bank c ∈ R^{d_h×w} per layer and side
shared by the heads, ``kv`` the same for keys and values, ``layerwise`` one c ∈ R^{d_h×w} for all.
``compress: keys | values`` compresses one side only, so only E is stored (S = 1, counts halve).

Nonuniform k (one k_l per layer) works with every mode; under ``layerwise`` layer l uses the first
k_l rows of the single k_max × n matrix (count n·k_max). Blockwise kinds have one window per matrix,
so layerwise sharing with per-layer k is refused for ``conv`` and for causal dense projections
(the config check says so; ``pool`` has nothing to share and allows it).

Initialisation sets the attention temperature (a slot is a weighted sum of its window's rows), so
it is a named option applied identically to learned and random arms; ``fan_in`` is the number of
positions a slot sums (n dense, w windowed):

* ``normal`` (the bidirectional default; ``init: auto`` resolves per form, options.py): N(0, σ²) with
  σ = ``model.init_std``, the draw of every other weight of the model and the one the Linformer authors' trained
  model starts from: fairseq's ``examples/linformer`` builds E/F as ``nn.Linear(n, k, bias=False)``, and the
  RoBERTa model around them re-draws every ``nn.Linear`` from N(0, 0.02²) (``init_bert_params``, applied after the
  attention module's own reset); a dense slot's squared weight norm is n·σ² (0.2 at n = 512, σ = 0.02; 0.32 on the
  byte-MLM CPU base, n = 32, σ = 0.1);
* ``xavier``: U(±g·√(6/(fan_in + k))) with g = 1/√2, the reset of fairseq's attention module
  (``nn.init.xavier_uniform_(compress_k.weight, gain=1/√2)`` on the (k, n) E, overwritten in the trained model as
  said above); a dense slot's squared weight norm ≈ n/(n + k);
* ``jl`` (the causal block form's default): entries ~ N(0, 1/k), the Johnson–Lindenstrauss scale of the paper's
  Theorem 1 (a slot's squared weight norm ≈ n/k: at k ≪ n every slot is a large sum of all positions);
* ``uniform``: U(−1/√fan_in, 1/√fan_in), the default of ``nn.Linear(fan_in, k)``;
* ``theorem2``: R ~ N(0, 1/k), E = δR and F = e^{−δ}R, the scaling in the proof of Theorem 2
  (needs two stored sides);
* ``window``: E_jt = 1/w for the w = ⌈n/k⌉ positions t of slot j's window, 0 elsewhere: a dense E that starts as the
  ``pool`` projection at full length, and learns from there (windowed storage: every weight 1/w). A locality prior
  no other kind gets: an ablation of the start, not a default (docs/results.md, "Linformer on it").

Lifting back (``compress: keys | values``, :meth:`ProjectionBank.lift`): P x with P = E_m⁺E_m the orthogonal
projector onto the row space of E restricted to the real positions (E_m = E diag(m)).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

XAVIER_GAIN = 1.0 / math.sqrt(2.0)  # fairseq's Linformer: nn.init.xavier_uniform_(compress_k.weight, gain=1/√2)


def _draw(shape: tuple[int, ...], init: str, fan_in: int, k: int, std: float) -> Tensor:
    if init == "window":  # each slot the mean of its w = ⌈n/k⌉ positions: the pool projection, free to learn from there
        if shape[-2:] != (k, fan_in):  # windowed storage (causal blocks, conv kernels): every weight 1/w
            return torch.full(shape, 1.0 / fan_in)
        w, e = math.ceil(fan_in / k), torch.zeros(shape)
        for j in range(k):
            e[..., j, j * w : (j + 1) * w] = 1.0 / w  # E_jt = 1/w for t in slot j's window (rows past n/w stay 0)
        return e
    if init == "normal":  # N(0, std²): every other weight's draw (model.init_std)
        return torch.randn(shape) * std
    if init == "xavier":  # U(±gain·√(6/(fan_in + k))): on the dense (k, n) E exactly fairseq's draw
        bound = XAVIER_GAIN * math.sqrt(6.0 / (fan_in + k))
        return torch.empty(shape).uniform_(-bound, bound)
    if init == "uniform":
        bound = 1.0 / math.sqrt(fan_in)
        return torch.empty(shape).uniform_(-bound, bound)
    return torch.randn(shape) / math.sqrt(k)  # jl, and R of theorem2


class ProjectionKind:
    """How a projection kind stores and draws its weights; the bank does the rest (sharing, padding, causal).

    Flags: ``windowed`` (compresses windows of w = ⌈n/k⌉ rows instead of a dense k × n E), ``per_channel``
    (weights differ per channel, so E does not commute with W_k), ``parametric`` (holds weights at all) and
    ``trainable`` (parameters; otherwise frozen buffers, saved in checkpoints and never redrawn).
    """

    name = ""
    windowed = False
    per_channel = False
    parametric = True
    trainable = True

    def draw(self, shape: tuple[int, ...], init: str, fan_in: int, k: int, std: float) -> Tensor:
        """Initial weights of ``shape`` (dense (S, G, k, n); causal (S, G, slots, w, 1); per-channel
        (S, G, 1, w, d_h)); ``fan_in`` positions per slot, ``k`` slots, ``std`` the model's ``init_std``."""
        return _draw(shape, init, fan_in, k, std)

    def fixed_block(self, window: int, like: Tensor) -> Tensor:
        """Block weights of a kind without parameters, (1, 1, w, 1)."""
        raise NotImplementedError


PROJECTION_KINDS: dict[str, ProjectionKind] = {}


def register_projection(name: str):
    """Class decorator: make a :class:`ProjectionKind` subclass the projection kind ``name``
    (``model.attention.options.projection: name``)."""

    def register(cls: type[ProjectionKind]) -> type[ProjectionKind]:
        cls.name = name
        PROJECTION_KINDS[name] = cls()
        return cls

    return register


@register_projection("learned")
class Learned(ProjectionKind):
    """Dense E ∈ R^{k×n}, trained (Eq. 7)."""


@register_projection("random")
class Random(ProjectionKind):
    """Dense E drawn exactly like ``learned`` (same init, same RNG calls), frozen as a buffer."""

    trainable = False


@register_projection("conv")
class Conv(ProjectionKind):
    """Depthwise convolution along the sequence, kernel = stride = w, per-channel weights c ∈ R^{C×w}."""

    windowed = True
    per_channel = True


@register_projection("pool")
class Pool(ProjectionKind):
    """Mean over windows of w rows with the fixed divisor w; no parameters."""

    windowed = True
    parametric = False

    def fixed_block(self, window: int, like: Tensor) -> Tensor:
        return like.new_full((1, 1, window, 1), 1.0 / window)


def blocks(x: Tensor, w: int) -> Tensor:
    """(…, T, C) → (…, ⌈T/w⌉, w, C): consecutive windows of w rows, zero-padded at the end."""
    t = x.shape[-2]
    nb = -(-t // w)
    if nb * w != t:
        x = nn.functional.pad(x, (0, 0, 0, nb * w - t))
    return x.unflatten(-2, (nb, w))


class ProjectionBank(nn.Module):
    """All E/F projections of a model (see the module docstring for the maths).

    Storage, one tensor ``weight_i`` per stored matrix group (``weight_0`` only under ``layerwise``):

    * dense: (S, G, k_l, n);
    * dense causal: (S, G, ⌈n/w_l⌉ − 1, w_l, 1), per-slot weights of the block-diagonal E;
    * conv: (S, G, 1, w_l, d_h), per-channel weights shared by all slots;
    * pool: nothing (weights 1/w are built on the fly).

    Args:
        ks: k_l for each layer.
        max_len: n, the longest sequence; shorter inputs use the first T columns / windows.
        n_heads: h.
        share: none | headwise | kv | layerwise.
        projection: a registered projection kind (learned, random, conv, pool, ...).
        init: normal | xavier | jl | uniform | theorem2 | window; delta is δ of theorem2, std the σ of normal
            (``model.init_std``).
        compress: both (Eq. 7) | keys | values (one side only: a single stored side).
        causal: blockwise, block-diagonal storage (see ``attention/linformer/causal.py``).
        d_head: d_h, the channels of a conv kernel bank (needed for conv only).
    """

    def __init__(
        self,
        ks: Sequence[int],
        max_len: int,
        n_heads: int,
        share: str = "none",
        projection: str = "learned",
        init: str = "normal",
        delta: float = 1.0,
        std: float = 0.02,
        compress: str = "both",
        causal: bool = False,
        d_head: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.ks, self.max_len, self.share = list(ks), max_len, share
        self.projection, self.compressed_side, self.causal = projection, compress, causal
        self.kind = kind = PROJECTION_KINDS[projection]
        self.windowed = causal or kind.windowed  # compresses windows of w rows, not a dense k × n E
        self.windows = [math.ceil(max_len / k) for k in self.ks]
        self.sides = 2 if share in ("none", "headwise") and compress == "both" else 1
        self.groups = n_heads if share == "none" else 1
        if kind.per_channel and d_head is None:
            raise ValueError(f"a {projection} projection needs d_head (its channels)")
        if not kind.parametric:
            return
        layers = [0] if share == "layerwise" else range(len(self.ks))
        for i in layers:
            k = max(self.ks) if share == "layerwise" else self.ks[i]
            w = self.windows[i]
            if kind.per_channel:
                shape, fan_in = (self.sides, self.groups, 1, w, d_head), w
            elif causal:
                shape, fan_in = (self.sides, self.groups, self.slots(i), w, 1), w
            else:
                shape, fan_in = (self.sides, self.groups, k, max_len), max_len
            if init == "theorem2":  # one R for both sides: E = δR, F = e^{-δ}R
                scale = torch.tensor([delta, math.exp(-delta)]).view(2, *[1] * (len(shape) - 1))
                weight = kind.draw((1, *shape[1:]), init, fan_in, k, std) * scale
            else:
                weight = kind.draw(shape, init, fan_in, k, std)
            if kind.trainable:
                self.register_parameter(f"weight_{i}", nn.Parameter(weight))
            else:
                self.register_buffer(f"weight_{i}", weight)

    # ------------------------------------------------------------------------------ geometry
    def window(self, layer: int) -> int:
        """w_l = ⌈n/k_l⌉, the block length of windowed and causal kinds."""
        return self.windows[layer]

    def slots(self, layer: int) -> int:
        """Slots at full length: k_l (dense), ⌈n/w_l⌉ (windowed), ⌈n/w_l⌉ − 1 (causal)."""
        if not self.windowed:
            return self.ks[layer]
        return math.ceil(self.max_len / self.windows[layer]) - (1 if self.causal else 0)

    def _stored(self, layer: int) -> Tensor:
        return self.weight_0 if self.share == "layerwise" else getattr(self, f"weight_{layer}")

    def matrices(self, layer: int, length: int) -> tuple[Tensor, Tensor]:
        """Dense (E, F) of a layer for a length-T input, each (G, k_l, T); F is E when shared."""
        w = self.stacked(layer, length)
        return w[0], w[-1]

    def stacked(self, layer: int, length: int) -> Tensor:
        """Dense [E; F] of a layer for a length-T input, (S, G, k_l, T): side 0 E, side S − 1 F (S = 1: F is E)."""
        if self.windowed:
            raise ValueError(
                f"{'causal' if self.causal else self.projection} projections are windowed: "
                "use block_weights(), not matrices()"
            )
        w = self._stored(layer)
        if self.share == "layerwise":
            w = w[:, :, : self.ks[layer]]
        return w[..., :length]

    def block_weights(self, layer: int, side: int, like: Tensor) -> Tensor:
        """Windowed weights of one side, (G, S', w, C') with S' ∈ {1, slots} and C' ∈ {1, d_h}."""
        if not self.kind.parametric:
            return self.kind.fixed_block(self.windows[layer], like)
        return self._stored(layer)[min(side, self.sides - 1)]

    # ------------------------------------------------------------------------------ operators
    def compress(self, layer: int, side: int, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """E x: (B, H, T, C) → (B, max(H, G), k', C), padded rows of x zeroed first.

        k' = k_l (dense) or ⌈T/w_l⌉ (windowed). H ∈ {1, h} broadcasts against G: x may be the layer
        input (H = 1, C = d) or per-head keys/values (H = h, C = d_h). Cost O(k'·T·C) dense, O(T·C)
        windowed.
        """
        if mask is not None:
            x = x * mask[:, None, :, None].to(x.dtype)
        if not self.windowed:
            e = self.matrices(layer, x.shape[-2])[min(side, 1)]  # (G, k, T)
            return e.unsqueeze(0) @ x
        xb = blocks(x, self.windows[layer])  # (B, H, k', w, C)
        weight = self.block_weights(layer, side, x)[:, : xb.shape[-3]]  # (G, S', w, C')
        if weight.shape[-1] == 1:  # one weight per window position: a (1 × w)·(w × C) product per slot
            return (weight.transpose(-1, -2) @ xb).squeeze(-2)  # (B, max(H, G), k', C)
        return (xb * weight).sum(-2)  # per-channel weights (conv)

    def compress_input(self, layer: int, x: Tensor, mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """[E; F] X and [E; F] m, what ``order: compress_first`` projects, from one product for both sides.

        x (B, T, d) → slots (B, S', G, k', d) and mass (B or 1, S', G, k', 1), S' ∈ {1, 2} the distinct sides (1 when
        F is E or the kind has no weights), m the 0/1 real-token mask (ones without padding), padded rows of x zeroed
        first. Dense: [E; F] (S'·G·k × T) times each sequence, one batched product with E shared by the batch (no
        copy of E per sequence), O(S'·G·k·T·d); pool: each window's sum ÷ w, O(T·d). Per-channel kinds (conv) do not
        commute with W_k and have no such form.
        """
        m = x.new_ones(1, x.shape[1]) if mask is None else mask.to(x.dtype)  # (B or 1, T)
        if mask is not None:
            x = x * m[..., None]
        if self.windowed:  # the fixed window weights of a kind without parameters: E = F
            weight = self.block_weights(layer, 0, x)[0, 0]  # (w, 1)
            slots = (blocks(x, self.windows[layer]) * weight).sum(-2)  # (B, k', d)
            mass = (blocks(m[..., None], self.windows[layer]) * weight).sum(-2)  # (B or 1, k', 1)
            return slots[:, None, None], mass[:, None, None]
        ef = self.stacked(layer, x.shape[1])  # (S', G, k, T)
        flat = ef.flatten(0, 2)  # (S'·G·k, T)
        # E broadcast over the batch as a stride-0 view (cast first under autocast, never copied per sequence)
        slots = flat.unsqueeze(0) @ x  # (B, S'·G·k, d)
        mass = (m @ flat.transpose(0, 1))[..., None]  # (B or 1, S'·G·k, 1)
        return slots.unflatten(1, ef.shape[:3]), mass.unflatten(1, ef.shape[:3])

    def compress_pair(self, layer: int, y: Tensor, mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """E K and F V from one product: y (B, T, 2, h, C) the values and the keys of every position, in that order
        (the rows of a layer's one input product [W_v; W_k]) → (E K, F V), each (B, h, k', C); padded rows zeroed
        first.

        Dense: y regrouped once as (2·G, T, B·h·C/G) and multiplied by [F; E] (2·G, k, T) in one batched product
        (G + G large products instead of B·h small ones per side, and no copy of E per sequence), O(k·T·B·h·C);
        windowed: one weighted sum over the windows of both sides, O(T·h·C).
        """
        b, t, _, h, c = y.shape
        if mask is not None:
            y = y * mask[:, :, None, None, None].to(y.dtype)
        if self.windowed:
            return self._compress_pair_windows(layer, y)
        ef = self.stacked(layer, t)  # (S, G, k, T): side 0 E
        g, k = ef.shape[1], ef.shape[2]
        fe = ef.flip(0) if self.sides == 2 else ef.expand(2, -1, -1, -1)  # (2, G, k, T): F then E, as y's sides
        grouped = y.reshape(b, t, 2, g, h // g * c).permute(2, 3, 1, 0, 4).reshape(2 * g, t, -1)  # (2G, T, B·hC/G)
        out = torch.bmm(fe.reshape(2 * g, k, t), grouped)  # (2G, k, B·hC/G)
        out = out.view(2, g, k, b, h // g, c).permute(0, 3, 1, 4, 2, 5).flatten(2, 3)  # (2, B, h, k, C)
        return out[1], out[0]

    def _compress_pair_windows(self, layer: int, y: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`compress_pair` of a windowed kind: y (B, T, 2, h, C), padding zeroed → (E K, F V) (B, h, k', C)."""
        yb = blocks(y.flatten(2), self.windows[layer]).unflatten(-1, y.shape[2:])  # (B, k', w, 2, h, C)
        weight = torch.stack([self.block_weights(layer, 1, y), self.block_weights(layer, 0, y)])  # (2, G, S', w, C')
        weight = weight[:, :, : yb.shape[1]].permute(2, 3, 0, 1, 4)  # (S', w, 2, G, C'): F then E
        out = (yb * weight).sum(2)  # (B, k', 2, h, C)
        return out[:, :, 1].transpose(1, 2), out[:, :, 0].transpose(1, 2)

    def compress_block(self, layer: int, side: int, block: Tensor, j: int) -> Tensor:
        """Slot j from its complete block: (B, H, w, C) → (B, max(H, G), C) (incremental decoding)."""
        weight = self.block_weights(layer, side, block)  # (G, S', w, C')
        return (block * weight[:, j if weight.shape[1] > 1 else 0]).sum(-2)

    def nonempty_slots(self, layer: int, mask: Optional[Tensor]) -> Optional[Tensor]:
        """(B, T) real-token mask → (B, ⌈T/w⌉) True where a window holds a real token (windowed
        kinds); None when every slot is non-empty (dense E, or no padding)."""
        if mask is None or not self.windowed:
            return None
        return blocks(mask[..., None], self.windows[layer]).any(-2)[..., 0]

    def lift(self, layer: int, side: int, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """P x with P = E_m⁺ E_m, the orthogonal projector onto the row space of E_m = E diag(m).

        x: (B, H, T, C) → (B, H, T, C). Rank-k sequence bottleneck followed by the lift back to T rows.

        * dense: P = Q Qᵀ with Q (T, k) from a reduced QR of E_mᵀ. A sequence with ≤ k real tokens
          has E_m of full column rank on its real positions (generic E), so P = diag(m) there; the
          QR then runs on a well-conditioned stand-in whose result is discarded (no NaN gradients).
          Cost O(T·k²) per distinct (mask, E): one QR per group G without padding (mask None), one per
          sequence and group with it. Which sequences need P is selected on the device (no host sync),
          and E is always part of the result (a zero gradient when no sequence needs it: DDP expects a
          gradient for every parameter of every rank).
        * windowed: E_m is block-diagonal per channel with one row c_m (c restricted to the window's
          real positions) per block, so per block P = c_m c_mᵀ / ‖c_m‖² (0 for an all-padding
          window): x̂_{jw+r} = c_{m,r} (Σ_r' c_{m,r'} x_{jw+r'}) / ‖c_m‖². For pool this is the mean of
          the window's real rows. Cost O(T·C).
        """
        t = x.shape[-2]
        m = torch.ones(1, t, device=x.device) if mask is None else mask.float()  # (B', T)
        x = x * m[:, None, :, None].to(x.dtype)
        if self.windowed:
            c = self.block_weights(layer, side, x) * blocks(m[:, None, :, None], self.windows[layer])
            xb = blocks(x, self.windows[layer])  # (B, H, k', w, C)
            norm = (c * c).sum(-2, keepdim=True)  # (B', G, k', 1, C')
            lifted = c * (c * xb).sum(-2, keepdim=True) / norm.clamp_min(torch.finfo(norm.dtype).tiny)
            return lifted.flatten(-3, -2)[..., :t, :].to(x.dtype)
        e = self.matrices(layer, t)[min(side, 1)]  # (G, k, T)
        k = e.shape[-2]
        if t <= k:  # no sequence has more than k real tokens: P = diag(m), and x is masked already
            return x + 0 * e.sum()  # E in the graph, zero gradient
        if mask is None:  # every sequence needs P, and all share it: one QR per group
            q = torch.linalg.qr(e.transpose(-1, -2).float())[0].to(x.dtype)  # (G, T, k)
            return q @ (q.transpose(-1, -2) @ x)  # (B, H, T, C)
        bottleneck = (m.sum(-1) > k)[:, None, None, None]  # (B, 1, 1, 1): rank-k P needed
        a = (e.unsqueeze(0) * m[:, None, None, :]).transpose(-1, -2)  # (B, G, T, k) = E_mᵀ
        stand_in = torch.eye(t, k, device=a.device, dtype=a.dtype)
        q = torch.linalg.qr(torch.where(bottleneck, a, stand_in).float())[0].to(x.dtype)  # (B, G, T, k)
        projected = q @ (q.transpose(-1, -2) @ x)  # (B, H, T, C)
        return torch.where(bottleneck, projected, x)
