"""LightningModules that predict tokens: masked LM (bidirectional) and causal LM (next token).

Both minimise the mean cross-entropy over the positions whose label is not -100 (the masked
positions for MLM, every next token for causal LM, the queried values for associative recall) and
report perplexity exp(loss). The head is RoBERTa's: dense → GELU → LayerNorm → decoder tied to the
token embedding, plus a bias.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric

from lightning_modules.config import model_config
from lightning_modules.encoder import TransformerEncoder, count_parameters
from lightning_modules.optim import build_optimizer


class LMHead(nn.Module):
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

    def __init__(self, config: dict, vocab_size: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.config = config
        self.encoder = TransformerEncoder(config["model"], vocab_size)
        self.head = LMHead(config["model"]["d_model"], self.encoder.tok)
        self.n_parameters = count_parameters(self)
        # Token-weighted means over the whole validation set (synchronised across DDP ranks).
        self.val_loss, self.val_accuracy = MeanMetric(), MeanMetric()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.head(self.encoder(input_ids, attention_mask))

    def _loss(self, batch: dict) -> tuple[Tensor, Tensor]:
        labels = batch["labels"]
        target = labels != -100  # (B, T)
        # Only supervised positions go through the (large) vocabulary projection.
        hidden = self.encoder(batch["input_ids"], batch.get("attention_mask"))
        logits = self.head(hidden[target])  # (N, V)
        loss = F.cross_entropy(logits.float(), labels[target])
        correct = (logits.argmax(-1) == labels[target]).float().mean()
        return loss, correct

    def training_loss(self, batch: dict) -> Tensor:
        """The loss a training step minimises (what ``callbacks.TrainingFlops`` counts)."""
        return self._loss(batch)[0]

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss = self.training_loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/ppl", torch.exp(loss.detach().clamp(max=50)))
        # A CPU tensor: a Python number would be copied to the device, and waited for, at every step.
        self.log("train/lr", torch.tensor(self.trainer.optimizers[0].param_groups[0]["lr"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, acc = self._loss(batch)
        n = (batch["labels"] != -100).sum()
        self.val_loss.update(loss.detach(), weight=n)
        self.val_accuracy.update(acc, weight=n)

    def on_validation_epoch_end(self) -> None:
        loss = float(self.val_loss.compute())
        ppl = math.exp(min(loss, 50.0))
        self.log_dict(
            {
                "val/loss": loss,
                "val/ppl": ppl,
                "val/accuracy": self.val_accuracy.compute(),
                "hp/val_loss": loss,
                "hp/val_ppl": ppl,
            }
        )
        self.val_loss.reset()
        self.val_accuracy.reset()

    def configure_optimizers(self) -> Any:
        return build_optimizer(self, self.config["optim"], self.config["trainer"]["max_steps"])


class MaskedLMModule(TokenPredictionModule):
    """Masked language modelling (RoBERTa's objective); attention must be bidirectional."""

    def __init__(self, config: dict, vocab_size: int) -> None:
        if model_config(config["model"]).attention.causal:
            raise ValueError("MaskedLMModule needs bidirectional attention (attention.causal=false)")
        super().__init__(config, vocab_size)


class CausalLMModule(TokenPredictionModule):
    """Next-token language modelling; attention must be causal (labels are the shifted inputs)."""

    def __init__(self, config: dict, vocab_size: int) -> None:
        if not model_config(config["model"]).attention.causal:
            raise ValueError("CausalLMModule needs attention.causal=true")
        super().__init__(config, vocab_size)
