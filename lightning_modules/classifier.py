"""Sequence classification on top of the (optionally pretrained) encoder: the fine-tuning stage of Table 2,
and ListOps / byte-level text of the Long Range Arena.

    h = Encoder(input_ids, mask)                          (B, T, d)
    p = Σ_t m_t h_t / Σ_t m_t                             (B, d)    mean over real tokens (m: mask)
    logits = W₂ tanh(W₁ dropout(p) + b₁) + b₂             (B, C)    after a dropout (RoBERTa's head)
    loss = cross-entropy(logits, labels)                            classification
    loss = mean (logits[:, 0] − labels)²                            regression (C = 1; GLUE's STS-B)

Mean pooling rather than the [CLS] vector: MLM pretraining packs documents into blocks without [CLS], so
that vector is untrained when fine-tuning starts, while every position's state was trained; the masked
mean is also unchanged by padding, like every real token's state (``attention/base.py``).

``init_from`` (a run directory, whose ``checkpoints/last.ckpt`` is read, or a ``.ckpt`` file) loads the
encoder's weights, E/F included, with ``torch.load(weights_only=True)``. The checkpoint's architecture must
equal ``model.*`` up to settings that change no weight (dropouts, ``attention.options.order``, ``init``,
``delta``: the loaded E/F replace the initial ones), and its vocabulary size the tokenizer's; otherwise
one ConfigError line names the first differing key. A run directory stands for the end of its training:
if its ``last.ckpt`` holds an earlier step than its ``metrics.json`` (checkpoints are written at
validations), loading is refused rather than silently starting from older weights. The head starts fresh.

Metrics (torchmetrics), on the validation split (``val/``) and on each test set (``test/``, or
``test/<name>/`` for each of ``data.classify.test_splits``): the loss, and

- classification: accuracy and F1 (binary tasks: F1 of class 1, GLUE's convention for MRPC and QQP; more
  classes: macro F1), plus Matthews correlation when ``data.classify.metrics`` names ``matthews`` (CoLA);
- regression: Pearson and Spearman correlation of prediction and label (STS-B).

The first of ``data.classify.metrics`` (the task's official metrics) selects checkpoints: ``training.train``
keeps the best ``val/<first>`` (``checkpoint_monitor``, higher is better) as ``checkpoints/best.ckpt`` and
evaluates it on the test sets; ``hp/val_loss`` and ``hp/val_<first>`` fill the HPARAMS tab (``hp_metrics``, logged
by ``training.answer``). ListOps (task ``listops``) uses the classification defaults: official metric accuracy, one
test set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor, nn
from torchmetrics import MeanMetric, MetricCollection, PearsonCorrCoef, SpearmanCorrCoef
from torchmetrics.classification import (
    BinaryF1Score,
    BinaryMatthewsCorrCoef,
    MulticlassAccuracy,
    MulticlassF1Score,
    MulticlassMatthewsCorrCoef,
)

from foundation.checkpoint import read_checkpoint
from foundation.configfile import flatten
from foundation.errors import ConfigError
from foundation.rundir import init_from_checkpoint
from lightning_modules.attention import ATTENTION_KINDS, misplaced_option
from lightning_modules.config import model_config
from lightning_modules.encoder import TransformerEncoder, count_parameters
from lightning_modules.optim import build_optimizer
from lightning_modules.step_logs import log_training_step

FROM_SCRATCH = "note: no init_from: the encoder is trained from scratch here, no pretrained encoder was loaded"
# Model settings that no weight depends on: they may differ between pretraining and fine-tuning.
WEIGHT_FREE_KEYS = {"dropout", "attention.dropout"}


class ClassificationHead(nn.Module):
    """Dense + tanh + linear over the pooled state (RoBERTa's head). Both keep ``nn.Linear``'s own draw, like the
    LM head (lightning_modules/language_model.py says why; docs/defaults.md)."""

    def __init__(self, d_model: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.dense, self.out = nn.Linear(d_model, d_model), nn.Linear(d_model, num_labels)

    def forward(self, pooled: Tensor) -> Tensor:
        """(B, d) → logits (B, C)."""
        return self.out(self.drop(torch.tanh(self.dense(self.drop(pooled)))))


def task_settings(config: dict) -> tuple[bool, list[str]]:
    """(regression?, official metrics) of a run config: ``data.classify`` for task classify, else
    classification scored by accuracy."""
    if config.get("task") != "classify":
        return False, ["accuracy"]
    classify = config["data"]["classify"]
    return bool(classify["regression"]), list(classify["metrics"])


def score_metrics(regression: bool, metrics: list[str], num_labels: int) -> MetricCollection:
    """The metrics logged for one evaluation set (see the module docstring)."""
    if regression:
        return MetricCollection({"pearson": PearsonCorrCoef(), "spearman": SpearmanCorrCoef()})
    binary = num_labels == 2
    scores = {
        "accuracy": MulticlassAccuracy(num_labels, average="micro"),
        "f1": BinaryF1Score() if binary else MulticlassF1Score(num_labels, average="macro"),
    }
    if "matthews" in metrics:
        scores["matthews"] = BinaryMatthewsCorrCoef() if binary else MulticlassMatthewsCorrCoef(num_labels)
    return MetricCollection(scores)


class SequenceClassifierModule(L.LightningModule):
    """Encoder + mean pooling + head, trained on ``batch = {input_ids, attention_mask, labels (B,)}``.

    Args:
        config: the whole run config as a plain dict (``foundation.configfile.to_container``).
        vocab_size: size of the tokenizer's vocabulary.
        num_labels: number of classes C (1 for a regression).
        test_sets: the names of the test sets, in the order of the data module's test loaders: the prefixes of
            their metrics.
    """

    def __init__(self, config: dict, vocab_size: int, num_labels: int, test_sets: tuple = ("test",)) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.config = config
        self.regression, self.metrics = task_settings(config)
        self.test_sets = list(test_sets)
        # training.train keeps the best checkpoint by this and tests it; the HPARAMS tab shows these
        self.checkpoint_monitor = (f"val/{self.metrics[0]}", "max")
        self.hp_metrics = ("hp/val_loss", f"hp/val_{self.metrics[0]}")
        self.encoder = TransformerEncoder(config["model"], vocab_size)
        self.head = ClassificationHead(config["model"]["d_model"], num_labels, config["model"]["dropout"])
        if config.get("init_from"):
            load_encoder(self.encoder, config["init_from"], config["model"], vocab_size)
        self.n_parameters = count_parameters(self)
        scores = score_metrics(self.regression, self.metrics, num_labels)
        self.val_scores = scores.clone(prefix="val/")
        self.test_scores = nn.ModuleList([scores.clone(prefix=f"{name}/") for name in self.test_sets])
        self.val_loss = MeanMetric()
        self.test_losses = nn.ModuleList([MeanMetric() for _ in self.test_sets])

    def on_fit_start(self) -> None:
        if self.config.get("task") == "classify" and not self.config.get("init_from") and self.trainer.is_global_zero:
            print(FROM_SCRATCH)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Logits (B, C)."""
        hidden = self.encoder(input_ids, attention_mask)  # (B, T, d)
        if attention_mask is None:
            return self.head(hidden.mean(1))
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        return self.head((hidden * m).sum(1) / m.sum(1).clamp(min=1))

    def _step(self, batch: dict) -> tuple[Tensor, Tensor]:
        """(loss, predictions): class logits (B, C), or a regression's outputs (B,)."""
        logits = self(batch["input_ids"], batch["attention_mask"]).float()
        if self.regression:
            return F.mse_loss(logits[:, 0], batch["labels"].float()), logits[:, 0]
        return F.cross_entropy(logits, batch["labels"]), logits

    def training_loss(self, batch: dict) -> Tensor:
        """The loss a training step minimises (what ``callbacks.TrainingFlops`` counts)."""
        return self._step(batch)[0]

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss, out = self._step(batch)
        labels = batch["labels"]
        log_training_step(
            self,
            loss,
            dict if self.regression else lambda: {"train/accuracy": (out.argmax(-1) == labels).float().mean()},
        )
        return loss

    def _evaluate(self, batch: dict, loss_metric: MeanMetric, scores: MetricCollection) -> None:
        loss, out = self._step(batch)
        loss_metric.update(loss.detach(), weight=len(out))
        scores.update(out if self.regression else out.argmax(-1), batch["labels"])

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, self.val_loss, self.val_scores)

    def sample_scores(self, batches: list[dict]) -> dict[str, float]:
        """``val/loss`` and the validation scores of ``batches`` alone (a fixed sample of the validation set, on
        the module's device), the model as it is, in metrics of their own: the validation's are untouched."""
        loss, scores = MeanMetric().to(self.device), self.val_scores.clone().to(self.device)
        scores.reset()
        for batch in batches:
            self._evaluate(batch, loss, scores)
        return {**{k: float(v) for k, v in scores.compute().items()}, "val/loss": float(loss.compute())}

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, self.test_losses[dataloader_idx], self.test_scores[dataloader_idx])

    def on_validation_epoch_end(self) -> None:
        scores, loss = self.val_scores.compute(), self.val_loss.compute()
        self.log_dict({**scores, "val/loss": loss})  # training.answer logs the hp/* copies, at the step validated
        self.val_scores.reset()
        self.val_loss.reset()

    def on_test_epoch_end(self) -> None:
        logged = {}
        for name, scores, loss in zip(self.test_sets, self.test_scores, self.test_losses):
            logged.update({**scores.compute(), f"{name}/loss": loss.compute()})
            scores.reset()
            loss.reset()
        self.log_dict(logged, add_dataloader_idx=False)

    def configure_optimizers(self) -> Any:
        return build_optimizer(self, self.config["optim"], self.config["trainer"]["max_steps"])


# ------------------------------------------------------------------------------------- init_from
def architecture(model_cfg: Any) -> dict[str, Any]:
    """The model settings that weights depend on, flat (the kind's weight options: ``SelfAttention.weight_options``)."""
    model = model_config(model_cfg, misplaced_option)
    cfg = OmegaConf.to_container(model, resolve=True)
    kind = ATTENTION_KINDS.get(model.attention.kind)
    if kind is not None:  # the options the kind's weights depend on, defaults filled in
        cfg["attention"]["options"] = kind.weight_options(model)
    return {k: v for k, v in flatten(cfg).items() if k not in WEIGHT_FREE_KEYS}


def load_encoder(encoder: TransformerEncoder, init_from: str, model_cfg: Any, vocab_size: int) -> None:
    """Copy a pretraining checkpoint's encoder weights into ``encoder`` after checking it is the same model."""
    ckpt = init_from_checkpoint(init_from)
    try:
        state = read_checkpoint(ckpt)  # weights_only=True
    except ConfigError as err:
        raise ConfigError(f"init_from: {err}") from None
    hparams, weights = state.get("hyper_parameters") or {}, state["state_dict"]
    if "config" not in hparams or "vocab_size" not in hparams:
        raise ConfigError(
            f"init_from: {str(ckpt)!r} has no model config and vocabulary size in its hyper-parameters "
            f"(not a linformer-lab checkpoint)"
        )
    theirs, mine = architecture(hparams["config"]["model"]), architecture(model_cfg)
    for key in mine:
        if theirs.get(key) != mine[key]:
            raise ConfigError(
                f"init_from: {str(ckpt)!r} was trained with model.{key}={theirs.get(key)}, this run has "
                f"model.{key}={mine[key]} (the encoder architecture must match)"
            )
    finished = ckpt.parents[1] / "metrics.json"
    if Path(init_from).is_dir() and finished.is_file():  # a run directory stands for the end of its training
        ended, saved = json.loads(finished.read_text()).get("global_step"), state.get("global_step")
        if ended != saved:
            raise ConfigError(
                f"init_from: {str(ckpt)!r} holds step {saved}, but the run ended at step {ended} "
                f"(checkpoints are written at validations: make trainer.max_steps a multiple of "
                f"trainer.val_check_interval, or name a .ckpt file)"
            )
    if hparams["vocab_size"] != vocab_size:
        raise ConfigError(
            f"init_from: {str(ckpt)!r} has a vocabulary of {hparams['vocab_size']} tokens, this run's "
            f"tokenizer has {vocab_size} (fine-tune with the pretraining run's tokenizer)"
        )
    prefix = "encoder."
    encoder.load_state_dict({k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)})
