"""LightningModules that predict tokens: masked LM (bidirectional) and causal LM (next token).

Both minimise the mean cross-entropy over the positions whose label is not -100 (the masked
positions for MLM, every next token for causal LM, the queried values for associative recall) and
report perplexity exp(loss). The head is RoBERTa's: dense → GELU → LayerNorm → decoder tied to the
token embedding, plus a bias.

Validation logs ``val/loss`` and ``val/accuracy`` over every target and, for each of the data module's target
groups (MLM: BERT's action on the target, ``masked``, ``random``, ``kept``), ``val/<group>_loss`` and
``val/<group>_accuracy`` over that group's targets: token-weighted means over the whole validation set, whatever
the DDP ranks, from per-example sums (:mod:`lightning_modules.per_example`) that ``metrics.json`` also keeps.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_modules.config import model_config
from lightning_modules.encoder import TransformerEncoder, count_parameters
from lightning_modules.optim import build_optimizer
from lightning_modules.per_example import PerExampleSums, column_names, example_sums
from lightning_modules.step_logs import log_training_step

EXAMPLES = "validation_examples/"  # callback-metric prefix of the per-example sums (metrics.json)
TARGET_INDEX = "target_index"  # batch key: the flat positions whose label is not -100, found on the host


def target_index(labels: Tensor) -> Tensor:
    """The flat positions (row-major, as a boolean index takes them) whose label is not -100: (…) → (N,)."""
    return (labels.flatten() != -100).nonzero().squeeze(1)


def cut_blocks(batch: dict, length: int) -> dict:
    """A packed batch of (B, T) blocks as (B·T/length, length) blocks: the same tokens in the same order (so the
    flat positions of the targets do not move), each short block attended on its own. Packed blocks carry no
    padding mask (``attention_mask`` None)."""
    assert batch.get("attention_mask") is None, "a length curriculum cuts packed blocks, which have no padding"
    cut = dict(batch)
    for key in ("input_ids", "labels", "target_group"):
        if cut.get(key) is not None:
            cut[key] = cut[key].reshape(-1, length)  # (B, T) -> (B·T/length, length)
    return cut


class LMHead(nn.Module):
    """Dense + GELU + LayerNorm, then the tied token embedding.

    The dense layer keeps ``nn.Linear``'s own draw, U(±1/√d) with U(±1/√d) bias, not N(0, ``model.init_std``²):
    the CPU bases were calibrated with it, and with N(0, 0.1²) full attention's seed 2 on the byte-MLM base stays
    on the no-context level (val/masked_loss 3.054 against 2.41; docs/defaults.md, "Weights every kind shares")."""

    def __init__(self, d_model: int, embedding: nn.Embedding) -> None:
        super().__init__()
        self.dense, self.ln = nn.Linear(d_model, d_model), nn.LayerNorm(d_model)
        self.embedding = embedding
        self.bias = nn.Parameter(torch.zeros(embedding.num_embeddings))

    def forward(self, h: Tensor) -> Tensor:
        """(…, d) → logits (…, V)."""
        return F.linear(self.ln(F.gelu(self.dense(h))), self.embedding.weight, self.bias)


class TokenPredictionModule(L.LightningModule):
    """Encoder + LM head trained on ``batch = {input_ids, labels, attention_mask}``.

    Args:
        config: the whole run config as a plain dict (``foundation.configfile.to_container``).
        vocab_size: size of the tokenizer's vocabulary.
    """

    def __init__(self, config: dict, vocab_size: int, target_groups: Sequence[str] = ()) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.config = config
        self.encoder = TransformerEncoder(config["model"], vocab_size)
        self.head = LMHead(config["model"]["d_model"], self.encoder.tok)
        self.n_parameters = count_parameters(self)
        self.target_groups = tuple(target_groups)
        # Per validation example and target group (lightning_modules/per_example.py), gathered across DDP ranks.
        self.val_sums = PerExampleSums()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.head(self.encoder(input_ids, attention_mask))

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Find the supervised positions while the batch is still on the host: a boolean index on the GPU makes the
        host wait for the device (it must learn how many there are), once every step."""
        if isinstance(batch, dict) and "labels" in batch:
            batch[TARGET_INDEX] = target_index(batch["labels"])
        return batch

    def short_length(self) -> int | None:
        """The block length of this training step under the length curriculum (the first ``optim.short_steps`` steps
        split evenly over ``optim.short_lengths``), None at the model's full length (validation, and every later
        step)."""
        optim = self.config["optim"]
        steps, lengths = optim.get("short_steps", 0), optim.get("short_lengths", [])
        trainer = self._trainer  # None outside a Trainer
        step = self.global_step
        if trainer is None or not trainer.training or step >= steps:
            return None
        return lengths[step * len(lengths) // steps]

    def _scored(self, batch: dict) -> tuple[Tensor, Tensor, Tensor]:
        """Logits (N, V) and labels (N,) of the batch's N supervised positions, and those positions (N,) in the
        flattened batch (found on the host when the batch came through :meth:`on_before_batch_transfer`)."""
        labels = batch["labels"].flatten()  # (B·T,)
        where = batch.get(TARGET_INDEX)
        where = target_index(labels) if where is None else where  # (N,)
        # Only supervised positions go through the (large) vocabulary projection.
        hidden = self.encoder(batch["input_ids"], batch.get("attention_mask")).flatten(0, 1)  # (B·T, d)
        return self.head(hidden.index_select(0, where)), labels.index_select(0, where), where

    def _loss(self, batch: dict) -> tuple[Tensor, Tensor]:
        logits, targets, _ = self._scored(batch)  # (N, V), (N,)
        loss = F.cross_entropy(logits.float(), targets)
        correct = (logits.argmax(-1) == targets).float().mean()
        return loss, correct

    def training_loss(self, batch: dict) -> Tensor:
        """The loss a training step minimises (what ``callbacks.TrainingFlops`` counts)."""
        return self._loss(batch)[0]

    def training_batch(self, batch: dict) -> dict:
        """The batch a training step trains on: cut to the length curriculum's short blocks in its short phase
        (:func:`cut_blocks`: the targets' flat positions stay), else as it came."""
        length = self.short_length()
        return batch if length is None else cut_blocks(batch, length)

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss = self.training_loss(self.training_batch(batch))
        log_training_step(self, loss, lambda: {"train/ppl": torch.exp(loss.detach().clamp(max=50))})
        return loss

    def _example_sums(self, batch: dict, batch_idx: int) -> tuple[Tensor, Tensor]:
        """The batch's example indices (B,) and per-example sums (B, 3, 1 + G) (:mod:`.per_example`)."""
        logits, targets, where = self._scored(batch)  # (N, V), (N,), (N,)
        losses = F.cross_entropy(logits.float(), targets, reduction="none")  # (N,)
        correct = logits.argmax(-1) == targets  # (N,)
        group = batch["target_group"].flatten().index_select(0, where) if self.target_groups else None  # (N,)
        b, t = batch["labels"].shape
        # The example's index in the validation set (in one process without it: the batches' running order).
        index = batch.get("example_index", torch.arange(b, device=targets.device) + batch_idx * b)
        example = where // t  # (N,) each target's row
        return index, example_sums(losses, correct, example, group, b, len(self.target_groups))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_sums.update(*self._example_sums(batch, batch_idx))

    def _means(self, totals: Tensor) -> dict[str, float]:
        """``val/<group_>loss`` and ``val/<group_>accuracy`` of the column sums ``totals`` (3, 1 + G)."""
        scores = {}
        for m, prefix in enumerate(column_names(self.target_groups)):
            if totals[2, m] > 0:  # a group without targets (none kept in a tiny set) has no mean
                scores[f"val/{prefix}loss"] = float(totals[0, m] / totals[2, m])
                scores[f"val/{prefix}accuracy"] = float(totals[1, m] / totals[2, m])
        return scores

    def sample_scores(self, batches: Sequence[dict]) -> dict[str, float]:
        """The validation metrics (``val/loss``, ``val/masked_loss``, ...) of ``batches`` alone (a fixed sample of
        the validation set, on the module's device), the model as it is; no logging, no state touched."""
        totals = sum(self._example_sums(batch, i)[1].sum(0) for i, batch in enumerate(batches))
        return self._means(totals)

    def on_validation_epoch_end(self) -> None:
        index, sums = self.val_sums.compute()  # (n,), (n, 3, 1 + G)
        self.val_sums.reset()
        totals = sums.sum(0)  # (3, 1 + G): Σ loss, Σ correct, count
        scores = self._means(totals)
        for m, prefix in enumerate(column_names(self.target_groups)):
            if totals[2, m] > 0:
                for s, name in ((0, "loss"), (1, "accuracy")):
                    self.keep_examples(f"{prefix}{name}", sums[:, s, m], sums[:, 2, m])
        ppl = math.exp(min(scores["val/loss"], 50.0))
        self.log_dict({**scores, "val/ppl": ppl})  # training.answer logs the hp/* copies, at the step validated

    def keep_examples(self, metric: str, sums: Tensor, counts: Tensor) -> None:
        """Hand one metric's per-example sums and counts to ``metrics.json`` (``validation_examples``): they ride
        in the trainer's callback metrics, which Lightning also brings back from spawned DDP ranks."""
        self.trainer.callback_metrics[f"{EXAMPLES}{metric}/sum"] = sums.float().cpu()
        self.trainer.callback_metrics[f"{EXAMPLES}{metric}/count"] = counts.float().cpu()

    def configure_optimizers(self) -> Any:
        return build_optimizer(self, self.config["optim"], self.config["trainer"]["max_steps"])


class MaskedLMModule(TokenPredictionModule):
    """Masked language modelling (RoBERTa's objective); attention must be bidirectional."""

    def __init__(self, config: dict, vocab_size: int, target_groups: Sequence[str] = ()) -> None:
        if model_config(config["model"]).attention.causal:
            raise ValueError("MaskedLMModule needs bidirectional attention (attention.causal=false)")
        super().__init__(config, vocab_size, target_groups)


class CausalLMModule(TokenPredictionModule):
    """Next-token language modelling; attention must be causal (labels are the shifted inputs)."""

    def __init__(self, config: dict, vocab_size: int, target_groups: Sequence[str] = ()) -> None:
        if not model_config(config["model"]).attention.causal:
            raise ValueError("CausalLMModule needs attention.causal=true")
        super().__init__(config, vocab_size, target_groups)
