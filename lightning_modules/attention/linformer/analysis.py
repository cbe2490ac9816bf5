"""What Linformer's E/F learned (``linformer-lab analyze`` on a Linformer run, through the kind's hooks
``analyze_shared`` and ``report_shared``), and the per-layer k that a spectrum suggests (``spectrum_suggestions``:
``k_schedule.yaml``).

Every distinct E/F of the model's :class:`~.projections.ProjectionBank` is read as a dense matrix (C, k', n)
(:func:`projection_operator`: the bank's own operator applied to the identity) and described by

Projections (each row w ∈ R^n of E, over key positions t = 0 … n-1)
    locality   = share of |w|'s mass within ⌈n/k⌉ positions centred on its centre of mass
                 μ = Σ_t t|w_t| / Σ_t|w_t|: 1 for a pooling row, ≈ 1/k for a dense random one;
    spread     = √(Σ_t |w_t| (t-μ)² / Σ_t |w_t|), in positions;
    smoothness = share of w's energy in the lower half of DCT-II frequencies (f < n/2): 1 for a
                 constant row, 0 for a row of upper-half frequencies only, ≈ 0.5 for white noise;
    alignment  = mean cos² of the principal angles between E's row space and a reference subspace
                 (= ‖Q₁ᵀQ₂‖²_F / min(k₁, k₂) with Q₁, Q₂ orthonormal bases); a random k-dimensional
                 subspace of R^n gives ≈ k₂/n. References: the k lowest DCT-II frequencies (a real
                 Fourier basis) and the top-k right singular vectors of a full-attention model's P.

each beside a Gaussian matrix of the same shape (seeded by the run's seed).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_modules.attention.linformer.projections import ProjectionBank
from lightning_modules.figures import figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


# ------------------------------------------------------------------------------ the distinct E/F
class Projection(NamedTuple):
    """One distinct projection: its name, the layers it serves and its dense form (C, k', n) —
    C = 1, or d_h for a conv projection (one matrix per channel)."""

    name: str
    layers: tuple[int, ...]
    matrix: Tensor


def projection_operator(bank: ProjectionBank, layer: int, side: int) -> Tensor:
    """The dense matrices the bank applies to one side (0: keys, 1: values) of a layer, (G, C, k', n).

    Obtained by compressing the identity with the bank's own operator (column t = E e_t), so every
    kind (dense, conv, pool) and the causal block-diagonal form come out the same way. Causal banks
    only ever compress their ``slots·w`` completed positions; the remaining columns are zero.
    """
    n = bank.max_len
    length = bank.slots(layer) * bank.window(layer) if bank.causal else n
    stored = next(iter(bank.state_dict().values()), None)  # pool stores nothing
    eye = torch.eye(length, device=None if stored is None else stored.device)[
        :, None, :, None
    ]  # (length, 1, length, 1)
    with torch.no_grad():  # in chunks of unit vectors: a conv's per-channel product is (chunk, G, n, C)
        out = torch.cat([bank.compress(layer, side, chunk) for chunk in eye.split(32)])  # (length, G, k', C)
    return F.pad(out.permute(1, 3, 2, 0).double().cpu(), (0, n - length))


def distinct_projections(bank: ProjectionBank) -> list[Projection]:
    """Every distinct E/F of the bank, once (see :mod:`.projections` for the sharing modes): named
    ``layer{l}/{E|F|E=F}[/head{g}]``, or ``all/…`` for the one matrix of ``layerwise`` (its k_max
    rows, which every layer slices). A side is ``E=F`` when its matrix equals the other's (``kv``,
    ``layerwise``, parameter-free ``pool``); ``compress: keys`` / ``values`` store only E / F."""
    n_layers = len(bank.ks)
    layerwise = bank.share == "layerwise"
    layers = [max(range(n_layers), key=lambda l: bank.ks[l])] if layerwise else range(n_layers)
    one_side = {"both": "E=F", "keys": "E", "values": "F"}[bank.compressed_side]
    out = []
    for layer in layers:
        sides = [projection_operator(bank, layer, side) for side in range(bank.sides)]
        if len(sides) == 2 and torch.equal(sides[0], sides[1]):
            sides = sides[:1]
        names = ["E", "F"] if len(sides) == 2 else [one_side]
        serves = tuple(range(n_layers)) if layerwise else (layer,)
        for name, e in zip(names, sides):
            for g in range(e.shape[0]):
                head = f"/head{g}" if e.shape[0] > 1 else ""
                out.append(Projection(f"{'all' if layerwise else f'layer{layer}'}/{name}{head}", serves, e[g]))
    return out


def dct_matrix(n: int) -> Tensor:
    """Orthonormal DCT-II, (n, n): row f is cos(π(2t+1)f / 2n) over t, scaled so D Dᵀ = I."""
    t = torch.arange(n, dtype=torch.float64)
    d = torch.cos(math.pi * (2 * t[None, :] + 1) * t[:, None] / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d


def _mass(e: Tensor) -> Tensor:
    a = e.double().abs()
    return a / a.sum(-1, keepdim=True).clamp_min(1e-30)


def locality(e: Tensor) -> Tensor:
    """(…, k, n) → (…, k): share of each row's |weight| within w = ⌈n/k⌉ positions around its centre
    of mass (|t − μ| ≤ w/2): 1 for a pooling window (or a point), ≈ 1/k for a dense random row."""
    k, n = e.shape[-2:]
    a, t = _mass(e), torch.arange(n, dtype=torch.float64)
    mu = (a * t).sum(-1, keepdim=True)
    return (a * ((t - mu).abs() <= math.ceil(n / k) / 2)).sum(-1)


def spread(e: Tensor) -> Tensor:
    """(…, k, n) → (…, k): standard deviation of position under each row's |weight| distribution."""
    a, t = _mass(e), torch.arange(e.shape[-1], dtype=torch.float64)
    mu = (a * t).sum(-1, keepdim=True)
    return (a * (t - mu) ** 2).sum(-1).sqrt()


def smoothness(e: Tensor) -> Tensor:
    """(…, k, n) → (…, k): share of each row's energy at DCT-II frequencies f < n/2."""
    n = e.shape[-1]
    c2 = (e.double() @ dct_matrix(n).T) ** 2  # (…, k, n)
    return c2[..., : (n + 1) // 2].sum(-1) / c2.sum(-1).clamp_min(1e-30)


def _row_basis(a: Tensor) -> Tensor:
    """Orthonormal basis of a's row space, (n, r), r = numerical rank."""
    u, s, _ = torch.linalg.svd(a.double().T, full_matrices=False)
    keep = s > s.max() * max(a.shape) * torch.finfo(torch.float64).eps
    return u[:, keep]


def principal_cosines(a: Tensor, b: Tensor) -> Tensor:
    """Cosines of the principal angles between the row spaces of a (k₁, n) and b (k₂, n), descending:
    the singular values of Q₁ᵀQ₂."""
    return torch.linalg.svdvals(_row_basis(a).T @ _row_basis(b)).clamp(max=1.0)


def subspace_alignment(a: Tensor, b: Tensor) -> float:
    """Mean cos² of the principal angles: 1 when one row space contains the other, ≈ k₂/n at random."""
    cos = principal_cosines(a, b)
    return float((cos**2).sum() / min(_row_basis(a).shape[1], _row_basis(b).shape[1]))


def attention_subspace(gram: Tensor, k: int) -> Tensor:
    """Top-k right singular vectors of the stacked P's, i.e. top-k eigenvectors of Σ PᵀP: (k, S)."""
    _, vectors = torch.linalg.eigh(gram.double())  # ascending
    return vectors[:, -k:].flip(-1).T


def projection_metrics(e: Tensor, attention: Optional[Tensor] = None) -> dict[str, float]:
    """For matrices e (C, k, n): means over rows (and channels) of locality, spread and smoothness,
    and the mean over channels of the alignment of each row space with the k lowest DCT frequencies
    and (when given) a full model's attention subspace (k, n)."""
    k, n = e.shape[-2:]
    fourier = dct_matrix(n)[:k]
    out = {
        "locality": float(locality(e).mean()),
        "spread": float(spread(e).mean()),
        "smoothness": float(smoothness(e).mean()),
        "fourier_alignment": float(np.mean([subspace_alignment(c, fourier) for c in e])),
    }
    if attention is not None:
        out["attention_alignment"] = float(np.mean([subspace_alignment(c, attention) for c in e]))
    return out


def projection_report(
    projections: Sequence[Projection], reference_grams: Optional[Sequence[Tensor]] = None, seed: int = 0
) -> dict[str, dict]:
    """Per distinct matrix: its metrics (``model``) and those of a Gaussian matrix of the same shape
    (``gaussian``, drawn from a seeded generator), plus shape and layers. With ``reference_grams`` (per layer
    Σ PᵀP of a full model on the same sequences), the attention subspace of an entry is that of Σ PᵀP over the
    layers it serves and all their heads (heads do not correspond across models)."""
    generator = torch.Generator().manual_seed(seed)
    report = {}
    for p in projections:
        channels, k, n = p.matrix.shape
        attention = None
        if reference_grams is not None:
            if max(p.layers) >= len(reference_grams):
                raise ValueError(f"{p.name}: the reference model has only {len(reference_grams)} layers")
            gram = sum(reference_grams[l] for l in p.layers)
            if gram.shape[-1] != n:
                raise ValueError(f"{p.name}: reference attention is over {gram.shape[-1]} positions, E over {n}")
            attention = attention_subspace(gram, k)
        gaussian = torch.randn(channels, k, n, generator=generator, dtype=torch.float64)
        report[p.name] = {
            "shape": [channels, k, n],
            "layers": list(p.layers),
            "model": projection_metrics(p.matrix, attention),
            "gaussian": projection_metrics(gaussian, attention),
        }
    return report


# ------------------------------------------------------------------------------ figures
def figure_projection_rows(projections: Sequence[Projection], title: str) -> "Figure":
    """Heatmaps of matrices' rows (slots) over positions, one panel per matrix (its first channel when
    it has several), shared colour scale."""
    cols = min(4, len(projections))
    rows = math.ceil(len(projections) / cols)
    fig = figure(3.2 * cols + 0.8, 2.4 * rows + 0.5)
    lim = max(float(p.matrix.abs().max()) for p in projections) or 1.0
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, p in zip(axes.flat, projections):
        image = ax.imshow(
            p.matrix[0].numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest"
        )
        channels = f" (channel 0 of {p.matrix.shape[0]})" if p.matrix.shape[0] > 1 else ""
        ax.set(title=p.name + channels, xlabel="position", ylabel="slot")
    for ax in axes.flat[len(projections) :]:
        ax.set_axis_off()
    fig.colorbar(image, ax=axes.ravel().tolist())
    fig.suptitle(title)
    return fig


def figure_projection_metrics(report: dict[str, dict]) -> "Figure":
    """Each metric per distinct matrix, the model's against a Gaussian matrix of the same shape."""
    names = list(report)
    metrics = [
        m
        for m in ("locality", "smoothness", "fourier_alignment", "attention_alignment")
        if m in report[names[0]]["model"]
    ]
    fig = figure(max(6.0, 0.35 * len(names) + 2), 2.2 * len(metrics) + 0.6)
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    x = np.arange(len(names))
    for ax, metric in zip(axes, metrics):
        ax.plot(x, [report[n]["model"][metric] for n in names], "o", label="model")
        ax.plot(x, [report[n]["gaussian"][metric] for n in names], "x", color="grey", label="gaussian")
        ax.set(ylabel=metric.replace("_", "\n"), ylim=(0, 1.05))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    axes[-1].set_xticks(x, names, rotation=90, fontsize=7)
    return fig


# ------------------------------------------------------------------------------ the kind's hooks
def analyze(bank: ProjectionBank, reference_grams: Optional[Sequence[Tensor]], seed: int) -> tuple[dict, dict]:
    """Summary entries (``projections``) and figures (``projections_<layer>``, ``projection_metrics``) of what the
    bank's E/F encode, against Gaussian matrices (and, with ``reference_grams``, a full model's attention)."""
    projections = distinct_projections(bank)
    part: dict[str, Any] = {"projections": projection_report(projections, reference_grams, seed=seed)}
    figures = {}
    for group in dict.fromkeys(p.name.split("/")[0] for p in projections):
        figures[f"projections_{group}"] = figure_projection_rows(
            [p for p in projections if p.name.split("/")[0] == group], f"E/F rows over positions: {group}"
        )
    figures["projection_metrics"] = figure_projection_metrics(part["projections"])
    return part, figures


def report(summary: dict[str, Any]) -> list[str]:
    """The E/F table of ``analyze``'s text report: per distinct matrix, each metric of the model's and the
    Gaussian's."""
    if "projections" not in summary:
        return []
    metrics = [
        m
        for m in ("locality", "smoothness", "fourier_alignment", "attention_alignment")
        if m in next(iter(summary["projections"].values()))["model"]
    ]
    lines = ["projection (model | gaussian)  " + "  ".join(f"{m:>22}" for m in metrics)]
    for name, entry in summary["projections"].items():
        cells = [f"{entry['model'][m]:.3f} | {entry['gaussian'][m]:.3f}" for m in metrics]
        lines.append(f"{name:<30} " + "  ".join(f"{c:>22}" for c in cells))
    return lines


def k_schedule_yaml(ks: list[int], run_dir: Any, step: int, energy: float, samples: int) -> str:
    """``k_schedule.yaml``: ``model.attention.options.k`` = ``ks`` (per layer the smallest k keeping ``energy`` of
    every head's cumulative singular value in the spectrum of run ``run_dir`` at ``step``, on ``samples``
    sequences), a config layer to list under ``defaults:``."""
    return (
        f"# Per-layer k from the attention spectrum of {run_dir} (step {step}): per layer the\n"
        f"# smallest k keeping {energy:g} of every head's cumulative singular value on {samples} validation\n"
        f"# sequences. Use: list this file under `defaults:` of an experiment file, or the override\n"
        f"# model.attention.options.k=[{','.join(map(str, ks))}]\n"
        f"model:\n  attention:\n    options:\n      k: [{', '.join(map(str, ks))}]\n      k_schedule: null\n"
    )
