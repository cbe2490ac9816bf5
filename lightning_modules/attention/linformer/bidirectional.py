"""Linformer (Wang et al. 2020, Eq. 7), ``kind: linformer``: keys and values projected along the sequence.

Shapes as in :mod:`~lightning_modules.attention.base`; k_l the projected length of this layer, G ∈ {1, h}
distinct E (or F) per layer, k' the slots (k_l dense, ⌈T/w⌉ windowed, w = ⌈n/k_l⌉). E, F and their kinds
(learned, random, conv, pool, …) live in the model's :class:`~.projections.ProjectionBank`, the module the kind
shares (the layer's ``bank``)::

    head_i = softmax(Q_i (E_i K_i)ᵀ / √d_h) (F_i V_i)            (B, h, T, d_h)      O(Tk'd)

A windowed slot with no real token in its window is masked out of the softmax. Two other forms of the kind,
chosen by the package (:mod:`lightning_modules.attention.linformer`): ``compress: keys | values``
(:mod:`.one_sided`) and ``causal: true`` (:mod:`.causal`).

Padding: padded rows of K and V are zeroed *before* E/F (a padded position contributes nothing to any
slot), so appending padding leaves real tokens' outputs unchanged. Short sequences use the first T columns
of E/F (first ⌈T/w⌉ windows) *without rescaling*: a sequence's slots are then the same sums whatever padding
or block length surrounds it.

Two exact orders for E K with dense and pool projections (``order``; conv's per-channel weights do not
commute with W_k, so conv uses ``project_first``):

* ``project_first``: K = X W_kᵀ + 1 b_kᵀ first, then E K (Eq. 7 as written): T·d² + k·T·d flops;
* ``compress_first``: E K = (E X) W_kᵀ + (E 1) b_kᵀ — compress the layer input along the sequence first,
  then apply W_k to only k rows: G·k·T·d + k·d² flops, far cheaper when E is shared by heads. With padding,
  E 1 becomes E m (m the 0/1 mask), i.e. E's columns at padded positions are zero.

``auto`` picks the cheaper one from these counts.

Two engines (``engine``) compute the same E K and F V. ``reference`` runs each side's products as written above
(:meth:`Linformer.compressed_keys_values`: the numbers of every run on a CPU before the fused engine was its
default). ``fused`` (:meth:`Linformer.fused_keys_values`; what ``auto`` runs on every device) runs the same sums in
fewer, larger kernels:
``project_first`` takes [V | K] from one input product and compresses both sides in one batched product over (side,
group) with the batch in the columns (no copy of E per sequence); ``compress_first`` applies [E; F] to X in one
product and, when F is E, both W_k and W_v in one more. On a CPU the reference's per-sequence copy of E, and
the sum of E's gradient over those copies, cost more than Eq. 7's products at k = n/2, where it trains slower than
full attention and the fused engine does not (docs/benchmarks.md has the profile).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterable, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, ListConfig
from torch import Tensor, nn

from foundation.errors import check_number, require
from lightning_modules.attention.base import Linear, SelfAttention, kind_options
from lightning_modules.attention.linformer import analysis, engines
from lightning_modules.attention.linformer.options import LinformerOptions, init_draw, layer_ks, resolve_init
from lightning_modules.attention.linformer.projections import PROJECTION_KINDS, ProjectionBank, ProjectionKind
from lightning_modules.flops import counting


def _first(mask: Optional[Tensor]) -> Optional[Tensor]:
    return None if mask is None else mask[:1]


def compress_first_is_cheaper(groups: int, k: int, n: int, d_model: int) -> bool:
    """Flop count of both exact orders for one of E K or F V (multiply-adds, heads summed)."""
    project_first = n * d_model * d_model + k * n * d_model
    compress_first = groups * k * n * d_model + k * d_model * d_model
    return compress_first < project_first


def _checked_ks(model: DictConfig, att: DictConfig) -> list[int]:
    """k (an integer or one per layer) and its schedule are well formed; every layer's k lies in [1, n]."""
    k = att.k
    if isinstance(k, (list, ListConfig)):
        require(
            all(isinstance(v, int) and not isinstance(v, bool) for v in k),
            f"model.attention.options.k: a list must hold integers, got {list(k)}",
        )
        require(
            len(k) == model.n_layers,
            f"model.attention.options.k: has {len(k)} entries but model.n_layers={model.n_layers} (one per layer)",
        )
    else:
        require(
            isinstance(k, int) and not isinstance(k, bool),
            f"model.attention.options.k: must be an integer or a list of integers, got {k!r}",
        )
    if att.k_schedule is not None:
        for end in ("first", "last"):
            check_number(
                f"model.attention.options.k_schedule.{end}", att.k_schedule[end], 1, model.max_len, integer=True
            )
    ks = layer_ks(model)
    for i, kl in enumerate(ks):
        require(
            1 <= kl <= model.max_len,
            f"model.attention.options.k: k={kl} (layer {i}) must be in [1, model.max_len={model.max_len}]",
        )
    return ks


def _check_compress_first(att: DictConfig, projection: ProjectionKind, causal: bool, one_sided: bool) -> None:
    """``order: compress_first`` needs E to commute with W_k and to see every key row."""
    require(
        not projection.per_channel,
        f"model.attention.options.order: 'compress_first' needs E to commute with W_k, which "
        f"{att.projection}'s per-channel weights do not; use auto or project_first",
    )
    require(
        not causal,
        "model.attention.options.order: 'compress_first' does not apply with causal=true (the "
        "local block needs every key); use auto or project_first",
    )
    require(
        not one_sided,
        f"model.attention.options.order: 'compress_first' does not apply with "
        f"compress='{att.compress}' (the lift needs every key row); use auto or project_first",
    )


class Linformer(SelfAttention):
    """Eq. 7 with both sides compressed (``compress: both``, non-causal), and what every form of the kind
    shares: its options, rules, projection bank and hooks."""

    kind: ClassVar[str] = "linformer"
    Options = LinformerOptions
    context_label = "P̄ = softmax(Q(EK)ᵀ/√d)"
    weight_free_options = ("order", "init", "delta", "engine")

    def __init__(self, model: DictConfig, layer: int = 0, shared: Optional[ProjectionBank] = None) -> None:
        super().__init__(model, layer, shared)
        if shared is None:
            raise ValueError("linformer attention needs the model's ProjectionBank")
        options = kind_options(model.attention)
        self.order, self.engine = self._choose_order(options.order), str(options.engine)
        self.fused_checked: Optional[bool] = None  # the fused engine's check at this layer (engines.agrees)

    @property
    def bank(self) -> ProjectionBank:
        """The model's E/F: the module the kind shares (:meth:`build_shared`)."""
        return self.shared

    # ------------------------------------------------------------------------------ plug-in interface
    @classmethod
    def compressed_lengths(cls, model: DictConfig) -> list[int]:
        return layer_ks(model)

    @classmethod
    def settled_options(cls, options: dict, causal: bool) -> dict:
        """``init: auto`` (given or by default) as the draw it resolves to for this form."""
        return {**options, "init": resolve_init(options.get("init", "auto"), causal)}

    @classmethod
    def weight_options(cls, model: DictConfig) -> dict:
        """k as the k of every layer (a list and its schedule are the same weights)."""
        return {**super().weight_options(model), "k": layer_ks(model), "k_schedule": None}

    @classmethod
    def extra_parameters(cls, model: DictConfig) -> int:
        """E and F at their largest: one n × k_max matrix per layer, head and side."""
        return 2 * model.n_layers * model.n_heads * max(layer_ks(model)) * model.max_len

    @classmethod
    def build_shared(cls, model: DictConfig) -> ProjectionBank:
        """Every E/F of the model, in one bank whatever the sharing mode or projection kind."""
        att = kind_options(model.attention)
        return ProjectionBank(
            layer_ks(model),
            model.max_len,
            model.n_heads,
            att.share,
            att.projection,
            init_draw(model.attention),
            att.delta,
            std=model.init_std,
            compress=att.compress,
            causal=model.attention.causal,
            d_head=model.d_model // model.n_heads,
        )

    def no_decay_parameters(self) -> Iterable[nn.Parameter]:
        """E and F: AdamW decays them no more than biases and norms."""
        return self.bank.parameters()

    @classmethod
    def projection_parameters(cls, shared: Optional[nn.Module]) -> int:
        """The trainable E/F (a ``random`` projection's are buffers: 0)."""
        return sum(p.numel() for p in shared.parameters() if p.requires_grad)

    @classmethod
    def analyze_shared(
        cls, shared: Optional[nn.Module], reference_grams: Optional[list[Tensor]], seed: int
    ) -> tuple[dict, dict]:
        """What every distinct E/F encodes (:mod:`.analysis`)."""
        return analysis.analyze(shared, reference_grams, seed)

    @classmethod
    def report_shared(cls, summary: dict) -> list[str]:
        return analysis.report(summary)

    @classmethod
    def spectrum_suggestions(
        cls, ks: list[int], run_dir: Any, step: int, energy: float, samples: int
    ) -> dict[str, str]:
        """``k_schedule.yaml``: ``options.k`` = ``ks``."""
        return {"k_schedule.yaml": analysis.k_schedule_yaml(ks, run_dir, step, energy, samples)}

    @classmethod
    def spectrum_report(cls, ks: list[int]) -> list[str]:
        return [f"suggested model.attention.options.k: {ks}"]

    @classmethod
    def check(cls, model: DictConfig) -> None:
        """Linformer's rules: k, and the variant combinations that cannot work."""
        att, causal = kind_options(model.attention), model.attention.causal
        ks = _checked_ks(model, att)
        projection = PROJECTION_KINDS.get(att.projection)
        require(
            projection is not None,
            f"model.attention.options.projection: unknown projection kind {att.projection!r} "
            f"(allowed: {', '.join(PROJECTION_KINDS)})",
        )
        one_sided = att.compress != "both"
        require(
            not (one_sided and causal),
            f"model.attention.options.compress: '{att.compress}' cannot be causal (its lift P = E⁺E mixes every "
            "position into every row); use compress=both with causal=true",
        )
        if att.order == "compress_first":
            _check_compress_first(att, projection, causal, one_sided)
        one_window_per_matrix = projection.parametric and (projection.windowed or causal)
        require(
            not (att.share == "layerwise" and one_window_per_matrix and len(set(ks)) > 1),
            f"model.attention.options.k: per-layer k {ks} needs one window per layer, which share=layerwise cannot "
            f"give a {att.projection if projection.windowed else 'causal'} projection; use share none, headwise or kv",
        )
        require(
            init_draw(model.attention) != "theorem2"
            or not projection.parametric
            or (att.share in ("none", "headwise") and not one_sided),
            f"model.attention.options.init: 'theorem2' needs distinct E and F (share none or headwise, compress both), "
            f"got share={att.share}, compress={att.compress}",
        )
        require(
            init_draw(model.attention) != "window" or att.share != "layerwise" or len(set(ks)) == 1,
            f"model.attention.options.init: 'window' draws one window per slot of the shared {max(ks)} × n matrix, "
            f"so under share=layerwise a layer with k < {max(ks)} would see only the start of the sequence (per-layer "
            f"k {ks}); use share none, headwise or kv",
        )

    # ------------------------------------------------------------------------------ Eq. 7
    def attend(self, x: Tensor, q: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        use_fused = self.fused(x) and self.fused_agrees(
            x,
            lambda: self.fused_keys_values(x[:1], _first(mask)),
            lambda: self.compressed_keys_values(x[:1], _first(mask)),
        )
        keys_values = self.fused_keys_values if use_fused else self.compressed_keys_values
        k, v = keys_values(x, mask)  # E K, F V: (B, h, k', d_h) each
        real = self.bank.nonempty_slots(self.layer, mask)  # (B, k') or None
        visible = None if real is None else real[:, None, None, :]  # (B, 1, 1, k')
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout_p)  # (B, h, T, d_h)

    def fused(self, x: Tensor) -> bool:
        """Whether this call asks for the fused engine: ``engine: fused``, or ``auto`` where :meth:`auto_fuses` (it
        runs once :meth:`fused_agrees`)."""
        return self.engine == "fused" or (self.engine == "auto" and self.auto_fuses(x.device))

    def auto_fuses(self, device: torch.device) -> bool:
        """Whether ``engine: auto`` runs the fused engine on ``device``: for Eq. 7, on every device (its products
        are plain batched products, faster than the reference's on a CPU too)."""
        return True

    def fused_agrees(self, x: Tensor, fused: Callable, reference: Callable) -> bool:
        """Whether the fused engine agreed with the reference at this layer's shape (:mod:`.engines`), checked on
        its first use: ``fused`` and ``reference`` compute the same tensors on the call's first sequence."""
        if self.fused_checked is None and counting():  # a FLOP count: the same sums, no check counted in it
            return True
        if self.fused_checked is None:
            key = (type(self).__name__, str(x.device), self.order, self.bank.slots(self.layer), tuple(x.shape[1:]))
            self.fused_checked = engines.agrees(key, fused, reference)
        return self.fused_checked

    def _choose_order(self, order: str) -> str:
        bank = self.bank
        if order != "auto":
            return order
        if bank.windowed and bank.kind.per_channel:
            return "project_first"
        groups = 1 if bank.windowed else bank.groups
        cheaper = compress_first_is_cheaper(groups, bank.slots(self.layer), bank.max_len, self.d_model)
        return "compress_first" if cheaper else "project_first"

    def compressed_keys_values(self, x: Tensor, mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """E K and F V, each (B, h, k', d_h), in the layer's exact order."""
        bank, layer = self.bank, self.layer
        if self.order == "project_first":
            return self.project_then_compress(x, mask, self.k_proj, 0), self.project_then_compress(
                x, mask, self.v_proj, 1
            )
        ones = x.new_ones(1, 1, x.shape[1], 1)
        xe, mass = bank.compress(layer, 0, x.unsqueeze(1), mask), bank.compress(layer, 0, ones, mask)  # E X, E m
        k = self._apply_linear(xe, mass, self.k_proj)  # (B, G, k', d) → (B, h, k', d_h)
        if bank.sides == 2:  # F ≠ E: compress again
            xe, mass = bank.compress(layer, 1, x.unsqueeze(1), mask), bank.compress(layer, 1, ones, mask)
        v = self._apply_linear(xe, mass, self.v_proj)
        return k, v

    def fused_keys_values(self, x: Tensor, mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """E K and F V, each (B, h, k', d_h), as :meth:`compressed_keys_values` computes them, in fewer and larger
        products (module docstring, ``engine: fused``)."""
        b, t, _ = x.shape
        if self.order == "project_first":
            y = self.in_proj.part("vk")(x)  # [V | K] = X [W_v; W_k]ᵀ + [b_v; b_k]: (B, T, 2d)
            return self.bank.compress_pair(self.layer, y.view(b, t, 2, self.n_heads, self.d_head), mask)
        slots, mass = self.bank.compress_input(self.layer, x, mask)  # [E; F] X (B, S', G, k', d), [E; F] m
        if slots.shape[1] == slots.shape[2] == 1:  # one E for both sides and every head: W_v, W_k in one product
            vk = self.in_proj.part("vk")
            y = torch.addcmul(F.linear(slots[:, 0, 0], vk.weight), mass[:, 0, 0], vk.bias)  # (B, k', 2d)
            y = y.view(b, -1, 2, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)  # [F V ; E K]: (2, B, h, k', d_h)
            return y[1], y[0]
        return self._project_slots(slots[:, 0], mass[:, 0], self.k_proj), self._project_slots(
            slots[:, -1], mass[:, -1], self.v_proj
        )

    def _project_slots(self, xe: Tensor, mass: Tensor, linear: Linear) -> Tensor:
        """(E X) Wᵀ + (E m) bᵀ: xe (B, G, k', d), mass (B or 1, G, k', 1) → (B, h, k', d_h); with one E for every
        head, one product of B·k' rows."""
        if xe.shape[1] > 1:
            return self._apply_linear(xe, mass, linear)
        y = torch.addcmul(F.linear(xe[:, 0], linear.weight), mass[:, 0], linear.bias)  # (B, k', d)
        return self.heads(y)

    def project_then_compress(self, x: Tensor, mask: Optional[Tensor], linear: Linear, side: int) -> Tensor:
        """E (X Wᵀ + 1 bᵀ) of one side → (B, h, k', d_h): the projection as its own product (no weights
        concatenated per call); with one E for every head and per-position weights, compressed before the head
        split (one (k' × T)·(T × d) product instead of h of (T × d_h))."""
        y = linear(x)  # (B, T, d)
        if self.bank.groups == 1 and not self.bank.kind.per_channel:
            return self.heads(self.bank.compress(self.layer, side, y.unsqueeze(1), mask)[:, 0])  # (B, h, k', d_h)
        return self.bank.compress(self.layer, side, self.heads(y), mask)  # per head: (B, h, k', d_h)

    def _apply_linear(self, xe: Tensor, mass: Tensor, linear: Linear) -> Tensor:
        """(E X) Wᵀ + (E m) bᵀ per head: (B, G, k, d), mass (B or 1, G, k, 1) → (B, h, k, d_h)."""
        w = linear.weight.view(self.n_heads, self.d_head, self.d_model)  # (h, d_h, d)
        bias = linear.bias.view(self.n_heads, 1, self.d_head)  # (h, 1, d_h)
        return xe @ w.transpose(1, 2) + mass * bias
