"""What attention learned: the spectrum of context-mapping matrices (paper Fig. 1), for every kind. What a kind's
shared module learned (Linformer's E/F) is the kind's own analysis (``SelfAttention.analyze_shared``).

Notation: N sequences of length T (= n = max_len for packed blocks), h heads, L layers; a layer's
context-mapping matrix is P = softmax(QKᵀ/√d_h) ∈ R^{T×T} (full attention) or
P̄ = softmax(Q(EK)ᵀ/√d_h) ∈ R^{T×k} (Linformer), per sequence and head. Causal Linformer (blocks of
w tokens, nb = ⌈T/w⌉, see ``attention/linformer/causal.py``) gives P̃ ∈ R^{T×(nb−1+T)} over [the nb − 1 slots ; the T
token positions]: row i holds the weights of query i on the slots j < ⌊i/w⌋ and, at their absolute
positions, on the keys of its own block up to i (``CausalLinformer.context_matrix``); out = P̃ [F-slots ; V].

Spectrum
    σ_1 ≥ … ≥ σ_m, m = min(T, S), the singular values of P (S = T, k, or nb − 1 + T for P̃). The
    normalised cumulative curve is c_i = Σ_{j≤i} σ_j / Σ_j σ_j (the paper's Fig. 1 quantity: singular
    values, not their squares), averaged over the sample. The effective rank at threshold τ is the
    smallest r with c_r ≥ τ; a layer's suggested k is the largest such r over its heads (all heads of
    a layer share k).

Attention probabilities are captured by :func:`recorded_attention` while the model runs unchanged:
every variant runs its softmax through ``scaled_dot_product_attention``, so all are covered without
a second copy of their maths. Figures are matplotlib ``Figure`` objects rendered without pyplot
(:mod:`lightning_modules.figures`).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_modules.attention import SelfAttention, attention_class
from lightning_modules.config import model_config
from lightning_modules.figures import figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


# ------------------------------------------------------------------------------ capture
def attention_probabilities(
    q: Tensor, k: Tensor, attn_mask: Optional[Tensor] = None, is_causal: bool = False, scale: Optional[float] = None
) -> Tensor:
    """softmax(q kᵀ · scale + mask), exactly what ``scaled_dot_product_attention`` weights v by.

    q: (…, T, d_h), k: (…, S, d_h) → (…, T, S) in float32. ``attn_mask`` is boolean (True = attend)
    or additive; ``is_causal`` masks keys j > i (top-left aligned, as SDPA); scale defaults to 1/√d_h.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale  # (…, T, S)
    if is_causal:
        t, s = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(t, s, dtype=torch.bool, device=q.device).tril(), -math.inf)
    if attn_mask is not None:
        scores = (
            scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else scores + attn_mask.float()
        )
    return scores.softmax(-1)


@contextmanager
def recorded_attention(model: nn.Module) -> Iterator[list[list[Tensor]]]:
    """Inside the block, each :class:`SelfAttention` of ``model`` (in module order) appends the
    attention probabilities it uses, (B, h, T, S), to ``records[layer]``.

    While a layer runs, ``torch.nn.functional.scaled_dot_product_attention`` is replaced by its
    explicit form P = softmax(…), output P v, so the captured P is the one that produced the layer's
    output (same values as SDPA up to rounding); calls outside an attention layer pass through. The
    training path is untouched outside this block. Eval mode only (attention dropout would make P
    random); not thread-safe.
    """
    layers = [m for m in model.modules() if isinstance(m, SelfAttention)]
    records: list[list[Tensor]] = [[] for _ in layers]
    active: list[Optional[int]] = [None]
    original = F.scaled_dot_product_attention

    def explicit(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if active[0] is None:
            return original(
                q,
                k,
                v,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        if dropout_p > 0 or enable_gqa:
            raise RuntimeError("recorded_attention needs eval mode (no attention dropout) and equal head counts")
        p = attention_probabilities(q, k, attn_mask, is_causal, scale)
        records[active[0]].append(p.detach())
        return (p @ v.float()).to(v.dtype)

    def enter(index: int):
        return lambda module, args: active.__setitem__(0, index)

    handles = [m.register_forward_pre_hook(enter(i)) for i, m in enumerate(layers)]
    handles += [m.register_forward_hook(lambda module, args, out: active.__setitem__(0, None)) for m in layers]
    F.scaled_dot_product_attention = explicit
    try:
        yield records
    finally:
        F.scaled_dot_product_attention = original
        for handle in handles:
            handle.remove()


def attention_maps(encoder: nn.Module, input_ids: Tensor, mask: Optional[Tensor] = None) -> list[Tensor]:
    """Every layer's context-mapping matrix for one batch: list over layers of (B, h, T, S), S = T
    (full, one-sided), k' (Linformer) or nb − 1 + T (causal Linformer); each layer's
    :meth:`~lightning_modules.attention.base.SelfAttention.context_matrix` reads it.

    Rows of padded query positions are zeroed (they attend but feed nothing that is scored)."""
    with torch.no_grad(), recorded_attention(encoder) as records:
        encoder(input_ids, mask)
    layers = [m for m in encoder.modules() if isinstance(m, SelfAttention)]
    length = input_ids.shape[1]
    maps = []
    for layer, calls in zip(layers, records):
        p = layer.context_matrix(calls, length)  # (B, h, T, S); ValueError for a kind that forms none
        maps.append(p if mask is None else p * mask[:, None, :, None].to(p.dtype))
    return maps


# ------------------------------------------------------------------------------ spectrum
def cumulative_share(singular_values: Tensor) -> Tensor:
    """(…, m) descending σ → c_i = Σ_{j≤i} σ_j / Σ_j σ_j, (…, m); c_m = 1."""
    return singular_values.cumsum(-1) / singular_values.sum(-1, keepdim=True).clamp_min(1e-30)


def effective_rank(curve: Tensor, energy: float) -> Tensor:
    """Smallest r (1-based) with c_r ≥ energy, for curves (…, m) → (…,) long."""
    if not 0.0 < energy <= 1.0:
        raise ValueError(f"energy must be in (0, 1], got {energy}")
    # The tolerance keeps c_r = 1 - 1e-7 (rounding of an exact 1) from counting as below energy = 1.
    return (curve < energy - 1e-6).sum(-1) + 1


@dataclass
class Spectrum:
    """Singular values of every layer's context-mapping matrices over a sample.

    ``singular_values[l]``: (N, h, m_l), descending, float64. ``grams[l]`` (when measured):
    Σ_{sequences, heads} PᵀP, (S_l, S_l), whose top eigenvectors span the key-position subspace
    that the layer's attention reads from.
    """

    singular_values: list[Tensor]
    grams: Optional[list[Tensor]] = None

    @property
    def head_curves(self) -> list[Tensor]:
        """Sample-mean normalised cumulative curve per layer and head: list of (h, m_l)."""
        return [cumulative_share(s).mean(0) for s in self.singular_values]

    @property
    def layer_curves(self) -> list[Tensor]:
        """Fig. 1 (left): the curve per layer, averaged over the sample and heads: list of (m_l,)."""
        return [c.mean(0) for c in self.head_curves]

    def at_index(self, indices: Sequence[int]) -> Tensor:
        """Fig. 1 (right): c at 1-based index indices[l] (clipped to m_l), (L, h)."""
        return torch.stack([c[:, min(i, c.shape[-1]) - 1] for c, i in zip(self.head_curves, indices)])

    def effective_ranks(self, energy: float) -> list[int]:
        """Per layer, from the layer curve."""
        return [int(effective_rank(c, energy)) for c in self.layer_curves]

    def head_effective_ranks(self, energy: float) -> list[list[int]]:
        return [effective_rank(c, energy).tolist() for c in self.head_curves]

    def suggested_ks(self, energy: float) -> list[int]:
        """k_l = the largest head effective rank of layer l: every head keeps ``energy`` of its mass."""
        return [max(r) for r in self.head_effective_ranks(energy)]


def measure_spectrum(encoder: nn.Module, batches: Iterable[dict], grams: bool = False) -> Spectrum:
    """Run ``encoder`` (eval, no grad) over ``batches`` ({input_ids, attention_mask}) and collect
    every layer's singular values (and PᵀP sums when ``grams``)."""
    was_training = encoder.training
    encoder.eval()
    svs: list[list[Tensor]] = []
    sums: list[Tensor] = []
    device = next(encoder.parameters()).device
    try:
        for batch in batches:
            mask = batch.get("attention_mask")
            maps = attention_maps(encoder, batch["input_ids"].to(device), None if mask is None else mask.to(device))
            if not svs:
                svs = [[] for _ in maps]
                sums = [torch.zeros(p.shape[-1], p.shape[-1], dtype=torch.float64) for p in maps]
            for layer, p in enumerate(maps):
                p = p.double().cpu()
                svs[layer].append(torch.linalg.svdvals(p))  # (B, h, m)
                if grams:
                    sums[layer] += (p.transpose(-2, -1) @ p).sum((0, 1))  # (S, S)
    finally:
        encoder.train(was_training)
    if not svs:
        raise ValueError("measure_spectrum: no batches")
    return Spectrum([torch.cat(s) for s in svs], sums if grams else None)


def heatmap_indices(model_cfg: Any, spectrum: Spectrum) -> list[int]:
    """Default index at which the heatmap reads each layer's curve: the layer's compressed length k (the
    paper's Fig. 1 right: how much a rank-k approximation keeps; n/4 for a kind that does not compress to a
    fixed length, the k = n/4 of the shipped Linformer configs), or ⌈m_l/2⌉ when the matrix has only m_l ≤ k
    singular values (a Linformer's P̄, whose curve reaches 1 at m_l)."""
    cfg = model_config(model_cfg)
    ks = attention_class(cfg).compressed_lengths(cfg) or [max(1, cfg.max_len // 4)] * cfg.n_layers
    return [k if s.shape[-1] > k else math.ceil(s.shape[-1] / 2) for k, s in zip(ks, spectrum.singular_values)]


def validation_sample(loader: Iterable[dict], sequences: int) -> list[dict]:
    """The first ``sequences`` sequences of a (non-shuffled) loader, as its own batches."""
    out, taken = [], 0
    for batch in loader:
        take = min(sequences - taken, batch["input_ids"].shape[0])
        out.append({key: None if value is None else value[:take] for key, value in batch.items()})  # no mask: None
        taken += take
        if taken >= sequences:
            break
    if not out:
        raise ValueError("validation_sample: the loader is empty")
    return out


# ------------------------------------------------------------------------------ figures
def figure_cumulative(spectrum: Spectrum, indices: Sequence[int], title: str) -> "Figure":
    """Fig. 1 (left): normalised cumulative singular value per layer; dots at each layer's index."""
    fig = figure(6, 4)
    ax = fig.add_subplot()
    for layer, (curve, index) in enumerate(zip(spectrum.layer_curves, indices)):
        x = np.arange(1, curve.shape[0] + 1)
        (line,) = ax.plot(x, curve.numpy(), label=f"layer {layer}")
        i = min(index, curve.shape[0])
        ax.plot([i], [float(curve[i - 1])], "o", color=line.get_color())
    ax.set(xlabel="singular value index", ylabel="normalised cumulative singular value", ylim=(0, 1.02), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=max(1, len(indices) // 12))
    return fig


def figure_heatmap(values: Tensor, indices: Sequence[int], title: str) -> "Figure":
    """Fig. 1 (right): layer × head heatmap of the cumulative value at each layer's index."""
    n_layers, n_heads = values.shape
    fig = figure(max(4.5, 2.0 + 0.6 * n_heads), max(3.0, 1.2 + 0.45 * n_layers))
    ax = fig.add_subplot()
    image = ax.imshow(values.numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
    if n_layers * n_heads <= 256:
        for (layer, head), v in np.ndenumerate(values.numpy()):
            ax.text(
                head, layer, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black"
            )
    ax.set(
        xlabel="head",
        ylabel="layer",
        title=title,
        xticks=range(n_heads),
        yticks=range(n_layers),
        yticklabels=[f"{l} (k={i})" for l, i in enumerate(indices)],
    )
    fig.colorbar(image, ax=ax)
    return fig
