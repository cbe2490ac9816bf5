"""What a run answers: its objective, the level a model without context reaches on the same targets, and the gain.

The objective of a task is the number its studies optimise (``sweeps/*.yaml``): ``val/masked_loss`` for a masked
LM whose validation splits its targets by BERT's rule (the [MASK]ed ones can only be predicted from context),
else ``val/loss``; ``val/accuracy`` for recall, classification and ListOps. The no-context level is the
metrics.json number a model that ignores its input scores on the same targets: ``baselines`` ``unigram/<name>``
(the training targets' frequencies), else ``trivial_<name>`` (for classification the majority class's accuracy).

    gain = no_context − value    (a loss: nats)       gain = value − no_context    (an accuracy)

A run whose gain is below :data:`LEFT_NO_CONTEXT` did not leave the no-context level. 0.05 nats is about twenty
standard errors of a paired difference on the byte-MLM validation set (0.0022, experiments/configs/bytes_mlm.yaml)
and a tenth of the 0.5 nats the studies ask of their reference: a gain below it is a model that predicts its
targets by their frequencies plus noise (Linformer at seed 0 of bytes_mlm gains 0.04 at 600 steps and then
leaves the plateau later). 0.02 of accuracy is two standard errors of an accuracy near 0.5 on 2,500 examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import lightning as L

LEFT_NO_CONTEXT = {"loss": 0.05, "accuracy": 0.02, "score": 0.02}


@dataclass(frozen=True)
class Objective:
    metric: str  # e.g. "val/masked_loss"

    @property
    def kind(self) -> str:
        """``loss`` (minimised, in nats), ``accuracy``, or ``score`` (a maximised F1, Matthews or correlation)."""
        if self.metric.endswith("loss"):
            return "loss"
        return "accuracy" if self.metric.endswith("accuracy") else "score"

    @property
    def hp_metric(self) -> str:
        """Its tag in TensorBoard's HPARAMS tab: ``hp/val_masked_loss``."""
        return "hp/" + self.metric.replace("/", "_")

    def no_context_key(self, metrics: dict[str, Any]) -> Optional[str]:
        """Where ``metrics`` (metrics.json, ``baselines`` nested or flattened) holds the no-context level."""
        name = self.metric.removeprefix("val/")
        flat = flat_baselines(metrics)
        for key in (f"baselines/unigram/{name}", f"trivial_{name}"):
            if key in flat:
                return key
        return None

    def no_context(self, metrics: dict[str, Any]) -> Optional[float]:
        key = self.no_context_key(metrics)
        return float(flat_baselines(metrics)[key]) if key is not None else None

    def gain(self, value: float, no_context: float) -> float:
        """How far ``value`` is past ``no_context`` in the objective's favour (nats for a loss)."""
        return no_context - value if self.kind == "loss" else value - no_context

    def learned(self, gain: float) -> bool:
        return gain >= LEFT_NO_CONTEXT[self.kind]


def flat_baselines(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` with its nested ``baselines`` entries also as ``baselines/<name>``."""
    nested = metrics.get("baselines")
    extra = {f"baselines/{k}": v for k, v in nested.items()} if isinstance(nested, dict) else {}
    return {**metrics, **extra}


def objective_of(task: str, target_groups: Sequence[str] = ()) -> Objective:
    """The objective of a run of ``task`` (its data module's ``target_groups`` for a masked LM)."""
    if task in ("classify", "listops", "recall"):
        return Objective("val/accuracy")
    if task == "mlm" and "masked" in target_groups:
        return Objective("val/masked_loss")
    return Objective("val/loss")


GAIN_HP = "hp/context_gain"
NO_CONTEXT = "no_context/"  # TensorBoard: the no-context level of the objective, drawn as a line beside it


class ObjectiveMetrics(L.Callback):
    """After each validation, the HPARAMS tab's answer: ``hp/<objective>`` (``hp/val_masked_loss``), the context
    gain ``hp/context_gain`` (:meth:`Objective.gain`, nats for a loss) and ``hp/<metric>`` of each of ``extra``
    (a study's other objectives, the module's own: ``hp/val_loss``), all logged at the step validated (the module's
    ``self.log`` would log them one step earlier). :meth:`levels` is the no-context level's tag and
    value, which the sample validations (training/sample_curve.py) log as a line to read the objective against."""

    def __init__(self, objective: Objective, extra: Sequence[str] = ()) -> None:
        self.objective = objective
        self.extra = list(dict.fromkeys(m for m in extra if m != objective.metric))
        self._levels: Optional[dict[str, Any]] = None

    def tags(self) -> list[str]:
        """The HPARAMS metrics this callback fills, to declare when the hyper-parameters are logged."""
        return [self.objective.hp_metric, GAIN_HP, *(Objective(m).hp_metric for m in self.extra)]

    @property
    def level_tag(self) -> str:
        """The TensorBoard tag of the objective's no-context level: ``no_context/masked_loss``."""
        return NO_CONTEXT + self.objective.metric.removeprefix("val/")

    def levels(self, trainer: L.Trainer) -> dict[str, float]:
        """``{level_tag: the no-context level}`` (empty when the run has none)."""
        level = self._no_context(trainer)
        return {} if level is None else {self.level_tag: level}

    def _no_context(self, trainer: L.Trainer) -> Optional[float]:
        if self._levels is None:
            dm = trainer.datamodule
            self._levels = {
                **dm.trivial_baseline(),
                **({"baselines": dm.baselines()} if hasattr(dm, "baselines") else {}),
            }
        return self.objective.no_context(self._levels)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        scores = trainer.callback_metrics
        if trainer.sanity_checking:
            return
        out = {Objective(m).hp_metric: float(scores[m]) for m in self.extra if m in scores}
        if self.objective.metric in scores:
            value = float(scores[self.objective.metric])
            out[self.objective.hp_metric] = value
            if (level := self._no_context(trainer)) is not None:
                out[GAIN_HP] = self.objective.gain(value, level)
        for logger in trainer.loggers if out else ():
            logger.log_metrics(out, step=trainer.global_step)


def _fmt(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 10 else f"{x:.4g}"


def answer_lines(objective: Objective, metrics: dict[str, Any]) -> list[str]:
    """The lines that say what the run answers: the objective, the no-context level and the gain, in words
    when the run did not leave that level."""
    value = metrics.get(objective.metric)
    if not isinstance(value, (int, float)) or math.isnan(value):
        return [f"{objective.metric}: not recorded"]
    level, key = objective.no_context(metrics), objective.no_context_key(metrics)
    if level is None or key is None:
        return [f"{objective.metric} {_fmt(value)} (the objective; no no-context level recorded)"]
    where = "majority class" if key == "trivial_accuracy" and objective.kind == "accuracy" else "no context"
    unit = " nats" if objective.kind == "loss" else ""
    gain = objective.gain(value, level)
    lines = [
        f"{objective.metric} {_fmt(value)} (the objective)   {where} {_fmt(level)} ({key})   gain {gain:+.4f}{unit}"
    ]
    if not objective.learned(gain):
        threshold = LEFT_NO_CONTEXT[objective.kind]
        lines.append(
            f"this run did not leave the no-context level: a gain of {gain:+.4f}{unit}, below {threshold}{unit}; the "
            "model scores its targets no better than their frequencies do (train longer, another seed, or see "
            "docs/results.md for what this config reaches)"
        )
    return lines


def utilisation_words(metrics: dict[str, Any]) -> list[str]:
    """The run's MFU beside its tokens/s with the peak it is a share of; on a GPU without a peak, why (a CPU run
    says nothing: no CPU has a peak in the table)."""
    if isinstance(metrics.get("mfu"), (int, float)):
        return [f"mfu {100 * metrics['mfu']:.1f} % of {metrics['mfu_peak']}"]
    if metrics.get("device", "cpu") != "cpu" and metrics.get("mfu_unavailable"):
        return [f"mfu not measured: {metrics['mfu_unavailable']}"]
    return []


def ending_lines(
    objective: Objective, metrics: dict[str, Any], needs_gpu: Optional[str] = None, logdir: Optional[Path] = None
) -> list[str]:
    """The last lines of a finished run: its other validation scores and speed, the objective, the
    no-context level and the gain, then the run directory and the TensorBoard command on ``logdir`` (default: the
    run directory's parent), which shows the run beside the other runs of its experiment, and the address that opens
    it on the objective's curve."""
    others = [
        f"{k} {metrics[k]:.4g}"
        for k in ("val/ppl", "val/loss", "val/accuracy")
        if k in metrics and k != objective.metric
    ]
    lines = ["  ".join(others + [f"{metrics['tokens_per_sec']:.0f} tokens/s", *utilisation_words(metrics)])]
    tested = sorted(k for k in metrics if k.startswith("test/") and not k.endswith("/loss"))
    if tested:
        lines.append("  ".join(f"{k} {metrics[k]:.4f}" for k in tested) + " (best validation checkpoint)")
    lines += answer_lines(objective, metrics)
    if needs_gpu:
        lines.append(f"note: {needs_gpu}")
    run_dir = Path(metrics["run_dir"])
    lines += [f"run directory: {run_dir}", f"tensorboard --logdir {logdir or run_dir.parent} --host 127.0.0.1"]
    return lines + [f"  then open {link_of(objective)}"]


def link_of(objective: Objective) -> str:
    """TensorBoard's address that opens on the objective's sample curve and no-context level, unsmoothed."""
    from training.tensorboard import objective_link

    return objective_link(objective.metric, NO_CONTEXT + objective.metric.removeprefix("val/"))
