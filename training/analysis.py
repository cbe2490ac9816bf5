"""What a trained run's attention and E/F learned, written into ``<run>/analysis/`` (the work of
``linformer-lab analyze``, and of the scale report's spectrum across sizes).

:func:`analyze` loads a trained run (its ``checkpoints/last.ckpt``, or the checkpoint given) and writes:

* ``spectrum_cumulative.png`` / ``spectrum_heatmap.png``: paper Fig. 1 (left, right) for this model's
  context-mapping matrices on the first N validation sequences of the run's own data (causal
  Linformer: its T × (nb − 1 + T) matrix over [slots ; positions], see ``CausalLinformer.context_matrix``);
* each registered kind's config suggested by the spectrum (``SelfAttention.spectrum_suggestions``; Linformer's
  ``k_schedule.yaml``: a ready ``model.attention.options.k`` list, per layer the smallest k that keeps
  ``energy`` of every head's cumulative singular value), whatever the run's kind;
* what the kind's shared module learned (``SelfAttention.analyze_shared``; Linformer: ``projections_<layer>.png``,
  rows of every distinct E/F over positions, and ``projection_metrics.png``: locality, smoothness, Fourier
  alignment and, with ``reference``, alignment with a full-attention model's P, each against a Gaussian matrix of
  the same shape);
* ``summary.json`` with every number, and the same figures as TensorBoard images (tags
  ``analysis/…``) in the run's log directory at the checkpoint's global step.

It lives on the training floor because it rebuilds the run's data and module (:mod:`training.train`);
the maths lives in :mod:`lightning_modules.analysis` and in the kinds' hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import lightning as L
from omegaconf import DictConfig

from foundation.atomic import atomic_write, atomic_write_text, write_json
from foundation.checkpoint import check_architecture, read_checkpoint
from foundation.configfile import flatten, to_container
from foundation.errors import ConfigError
from foundation.rundir import CHECKPOINT
from lightning_modules import analysis
from lightning_modules.attention import ATTENTION_KINDS, attention_class
from lightning_modules.figures import figure_to_array
from training import config as run_config
from training.train import build_datamodule, build_module

# Data settings that change what a token id means or which sequences are sampled.
_LOADER_ONLY = {"batch_size", "num_workers", "cache_dir"}


@dataclass
class Run:
    """A trained run as stored: where it lives, its config and its checkpoint's state."""

    run_dir: Path
    checkpoint: Path
    cfg: DictConfig
    global_step: int
    vocab_size: int
    state_dict: dict


def read_run(path: Path) -> Run:
    """A run directory (its ``checkpoints/last.ckpt``) or a checkpoint file, loaded weights-only."""
    if path.is_dir():
        run_dir, ckpt_path = path, path / CHECKPOINT
    elif path.is_file():
        ckpt_path = path
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    else:
        raise ConfigError(f"{path}: no such run directory or checkpoint")
    if not ckpt_path.is_file():
        raise ConfigError(f"{path}: no {CHECKPOINT} (has the run saved a checkpoint yet?)")
    ckpt = read_checkpoint(ckpt_path)  # weights_only=True; truncated or foreign files are one-line errors
    hparams = ckpt.get("hyper_parameters", {})
    if "config" not in hparams or "vocab_size" not in hparams:
        raise ConfigError(f"{ckpt_path}: not a linformer-lab checkpoint (no config/vocab_size hyper-parameters)")
    cfg = run_config.merge_run([hparams["config"]])
    run_config.check(cfg)
    return Run(run_dir, ckpt_path, cfg, int(ckpt.get("global_step", 0)), hparams["vocab_size"], ckpt["state_dict"])


def load_module(run: Run, datamodule: L.LightningDataModule) -> L.LightningModule:
    """The run's trained module in eval mode; ``datamodule``'s tokenizer must match its vocabulary."""
    if datamodule.vocab_size != run.vocab_size:
        raise ConfigError(
            f"{run.checkpoint}: trained with a vocabulary of {run.vocab_size} tokens, but the "
            f"tokenizer rebuilt from data.* has {datamodule.vocab_size}"
        )
    module = build_module(run.cfg, datamodule)
    check_architecture({"state_dict": run.state_dict}, module, run.checkpoint)
    module.load_state_dict(run.state_dict)
    return module.eval()


def _same_data(run: DictConfig, reference: DictConfig) -> None:
    """The reference must have seen the same token ids: same task, data (loader knobs aside), n."""
    pairs = [("task", run.task, reference.task), ("model.max_len", run.model.max_len, reference.model.max_len)]
    mine, theirs = (flatten(to_container(c.data)) for c in (run, reference))
    pairs += [(f"data.{key}", mine[key], theirs.get(key)) for key in sorted(mine) if key not in _LOADER_ONLY]
    for key, a, b in pairs:
        if a != b:
            raise ConfigError(f"--reference: {key} differs ({a!r} here, {b!r} in the reference run)")


def _spectrum(
    run: Run, module: L.LightningModule, sample: list[dict], energy: float, index: Optional[int]
) -> tuple[dict, dict]:
    """Summary entries and figures of the spectrum (paper Fig. 1) and the suggested k."""
    spectrum = analysis.measure_spectrum(module.encoder, sample)
    if index is not None:
        _check_index(index, [s.shape[-1] for s in spectrum.singular_values])
    indices = (
        [index] * run.cfg.model.n_layers if index is not None else analysis.heatmap_indices(run.cfg.model, spectrum)
    )
    at_index = spectrum.at_index(indices)
    part = {
        "spectrum": {
            "index": indices,
            "cumulative_at_index": at_index.tolist(),
            "effective_rank": spectrum.effective_ranks(energy),
            "effective_rank_per_head": spectrum.head_effective_ranks(energy),
            "layer_curves": [c.tolist() for c in spectrum.layer_curves],
            "mean_singular_values": [s.mean((0, 1)).tolist() for s in spectrum.singular_values],
        },
        "suggested_k": spectrum.suggested_ks(energy),
    }
    what = attention_class(run.cfg.model).context_label
    figures = {
        "spectrum_cumulative": analysis.figure_cumulative(spectrum, indices, f"{what}, step {run.global_step}"),
        "spectrum_heatmap": analysis.figure_heatmap(at_index, indices, "cumulative singular value at k"),
    }
    return part, figures


def _shared(
    run: Run,
    module: L.LightningModule,
    datamodule: L.LightningDataModule,
    sample: list[dict],
    energy: float,
    reference: Optional[Run],
) -> tuple[dict, dict]:
    """Summary entries and figures of what the kind's shared module learned (Linformer: what E/F encode, against
    Gaussian matrices and a full model)."""
    part: dict[str, Any] = {}
    grams = None
    if reference is not None:
        ref_spectrum = analysis.measure_spectrum(load_module(reference, datamodule).encoder, sample, grams=True)
        part["reference"] = {
            "run_dir": str(reference.run_dir),
            "global_step": reference.global_step,
            "effective_rank": ref_spectrum.effective_ranks(energy),
        }
        grams = ref_spectrum.grams
    encoder = module.encoder
    entries, figures = encoder.attention_class.analyze_shared(encoder.shared, grams, run.cfg.seed)
    part.update(entries)
    return part, figures


def _check_arguments(samples: int, energy: float, index: Optional[int]) -> None:
    if samples < 1:
        raise ConfigError(f"--samples: must be >= 1, got {samples}")
    if not 0.0 < energy <= 1.0:
        raise ConfigError(f"--energy: must be in (0, 1], got {energy}")
    if index is not None and index < 1:
        raise ConfigError(f"--index: must be >= 1, got {index}")


def _check_index(index: int, lengths: list[int], why: str = "") -> None:
    """``--index`` reads every layer's curve at one index: it must lie within the shortest, 1 … min_l m_l (the
    number of singular values of layer l's context matrices); refused rather than clipped, so the index a figure
    shows is the one asked."""
    if index > min(lengths):
        layers = ", ".join(f"layer {layer}: {m}" for layer, m in enumerate(lengths))
        raise ConfigError(
            f"--index: {index} is past the singular values of the attention matrices "
            f"({why or layers}); allowed: 1 to {min(lengths)}"
        )


def _reference_run(run: Run, reference: Path) -> Run:
    """The full-attention run to compare ``run``'s E/F with, checked before any heavy work."""
    if attention_class(run.cfg.model).compressed_lengths(run.cfg.model) is None:
        kind = run.cfg.model.attention.kind
        raise ConfigError(f"--reference: compares a run's E/F with full attention; kind {kind!r} has no E/F")
    ref = read_run(reference)
    if not attention_class(ref.cfg.model).exact:
        raise ConfigError(
            f"--reference: {reference} is not a full-attention run "
            f"(model.attention.kind={ref.cfg.model.attention.kind})"
        )
    _same_data(run.cfg, ref.cfg)
    return ref


def _write_figures(run: Run, figures: dict[str, Any], out: Path) -> None:
    """Each figure rendered once, written as ``<out>/<name>.png`` and as a TensorBoard image of the run."""
    from matplotlib.image import imsave
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(run.run_dir))
    try:
        for name, fig in figures.items():
            image = figure_to_array(fig)  # rendered once for both outputs
            atomic_write(out / f"{name}.png", lambda f, image=image: imsave(f, image, format="png"))
            writer.add_image(f"analysis/{name}", image, run.global_step, dataformats="HWC")
    finally:
        writer.close()


def analyze(
    path: Path, samples: int = 16, energy: float = 0.9, index: Optional[int] = None, reference: Optional[Path] = None
) -> dict[str, Any]:
    """Write ``<run>/analysis/`` and the TensorBoard images; return the summary."""
    _check_arguments(samples, energy, index)
    run = read_run(path)
    if index is not None:  # at most n singular values, whatever the kind: refused before the data is read
        _check_index(index, [run.cfg.model.max_len], f"at most model.max_len={run.cfg.model.max_len} per layer")
    ref = None if reference is None else _reference_run(run, reference)
    datamodule = build_datamodule(run.cfg)
    datamodule.setup("validate")
    module = load_module(run, datamodule)
    sample = analysis.validation_sample(datamodule.val_dataloader(), samples)
    taken = sum(len(b["input_ids"]) for b in sample)
    summary: dict[str, Any] = {
        "run_dir": str(run.run_dir),
        "checkpoint": str(run.checkpoint),
        "global_step": run.global_step,
        "attention": run.cfg.model.attention.kind,
        "samples": taken,
        "energy": energy,
    }
    try:
        part, figures = _spectrum(run, module, sample, energy, index)
    except ConfigError:
        raise
    except ValueError as err:  # a kind that forms no softmax matrix (SelfAttention.context_matrix)
        raise ConfigError(f"analyze {run.run_dir}: {err}") from None
    summary.update(part)
    if module.encoder.shared is not None:
        part, figs = _shared(run, module, datamodule, sample, energy, ref)
        summary.update(part)
        figures.update(figs)

    out = run.run_dir / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    _write_figures(run, figures, out)
    for kind in ATTENTION_KINDS.values():
        for name, text in kind.spectrum_suggestions(
            summary["suggested_k"], run.run_dir, run.global_step, energy, taken
        ).items():
            atomic_write_text(out / name, text)
    summary["figures"] = sorted(f"{name}.png" for name in figures)
    write_json(out / "summary.json", summary)
    return summary


def report(summary: dict[str, Any]) -> str:
    """The numbers a reader wants first, as text."""
    lines = [
        f"{summary['attention']} attention, step {summary['global_step']}, {summary['samples']} validation sequences"
    ]
    s = summary["spectrum"]
    lines += [
        f"spectrum, effective rank at energy {summary['energy']:g}:",
        "layer  index  cumulative@index per head      effective rank (layer / per head)",
    ]
    for layer, (i, row, r, rh) in enumerate(
        zip(s["index"], s["cumulative_at_index"], s["effective_rank"], s["effective_rank_per_head"])
    ):
        lines.append(f"{layer:>5}  {i:>5}  {' '.join(f'{v:.3f}' for v in row):<29} {r} / {rh}")
    for kind in ATTENTION_KINDS.values():
        lines += kind.spectrum_report(summary["suggested_k"])
    if "reference" in summary:
        reference = summary["reference"]
        lines.append(f"reference {reference['run_dir']}: effective rank {reference['effective_rank']}")
    kind = ATTENTION_KINDS.get(summary["attention"])
    if kind is not None:
        lines += kind.report_shared(summary)
    return "\n".join(lines)
