"""Training-step scalars, logged only at the steps the trainer writes.

Lightning writes a training step's logged values to the loggers every ``trainer.log_every_n_steps`` steps, but
each ``self.log`` call costs the same at every step (its result bookkeeping: 1-2 ms on a 2-core CPU machine; the
three calls were a tenth of the MQAR model's step). Logging at the written steps only leaves every logger's record
and the progress bar (refreshed at the same steps) as they were, to the last bit (docs/results.md, "Machines
differ").
"""

from __future__ import annotations

from typing import Callable

import lightning as L
import torch
from torch import Tensor


def log_training_step(module: L.LightningModule, loss: Tensor, extra: Callable[[], dict[str, Tensor]]) -> None:
    """Log ``train/loss`` (on the progress bar), ``train/lr`` and what ``extra()`` returns, at the steps the trainer
    writes (``extra`` is only called there)."""
    trainer = module.trainer
    # Lightning's own test before it writes a step's values, made (as it documents) before the step is taken.
    if not trainer._logger_connector.should_update_logs:
        return
    module.log("train/loss", loss, prog_bar=True)
    # A CPU tensor: a Python number would be copied to the device, and waited for.
    lr = torch.tensor(trainer.optimizers[0].param_groups[0]["lr"])
    module.log_dict({**extra(), "train/lr": lr})
