"""The optimiser the runs train with: AdamW on two parameter groups, multi-tensor, under the warm-up schedule."""

import torch
import torch.nn.functional as F
from tiny import attention, small_model

from lightning_modules.encoder import TransformerEncoder
from lightning_modules.optim import build_optimizer

OPTIM = {"lr": 3e-3, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.01, "warmup_steps": 3, "schedule": "linear"}


def _model() -> TransformerEncoder:
    torch.manual_seed(0)
    return TransformerEncoder(small_model(attention(k=4)), vocab_size=40)


def _train(model: TransformerEncoder, optimizer: torch.optim.Optimizer, scheduler, steps: int = 8) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, 40, (4, 16), generator=generator)
        loss = F.cross_entropy((model(ids) @ model.tok.weight.T).flatten(0, 1), ids.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def test_the_multi_tensor_update_is_the_per_tensor_update_bit_for_bit():
    """build_optimizer's AdamW (foreach) against torch's per-tensor AdamW on the same groups and schedule: the same
    weights, bit for bit, after 8 steps (decayed and undecayed groups, warm-up and decay both crossed)."""
    model, reference = _model(), _model()
    built = build_optimizer(model, OPTIM, max_steps=8)
    assert built["optimizer"].defaults["foreach"] is True
    _train(model, built["optimizer"], built["lr_scheduler"]["scheduler"])
    per_tensor = build_optimizer(reference, OPTIM, max_steps=8)  # the same groups and schedule, per tensor
    for group in per_tensor["optimizer"].param_groups:
        group["foreach"] = False
    _train(reference, per_tensor["optimizer"], per_tensor["lr_scheduler"]["scheduler"])
    moved = [not torch.equal(p, q) for p, q in zip(model.parameters(), _model().parameters())]
    assert all(moved)  # every tensor trained (no vacuous equality)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
