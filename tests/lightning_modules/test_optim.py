"""The optimiser the runs train with: AdamW on two parameter groups, multi-tensor, under the warm-up schedule."""

import tiny
import torch
import torch.nn.functional as F

from lightning_modules.encoder import TransformerEncoder
from lightning_modules.optim import build_optimizer, parameter_groups

OPTIM = {"lr": 3e-3, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.01, "warmup_steps": 3, "schedule": "linear"}


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
    model, reference = tiny.encoder(tiny.attention(k=4)), tiny.encoder(tiny.attention(k=4))
    built = build_optimizer(model, OPTIM, max_steps=8)
    assert built["optimizer"].defaults["foreach"] is True
    _train(model, built["optimizer"], built["lr_scheduler"]["scheduler"])
    per_tensor = build_optimizer(reference, OPTIM, max_steps=8)  # the same groups and schedule, per tensor
    for group in per_tensor["optimizer"].param_groups:
        group["foreach"] = False
    _train(reference, per_tensor["optimizer"], per_tensor["lr_scheduler"]["scheduler"])
    moved = [not torch.equal(p, q) for p, q in zip(model.parameters(), tiny.encoder(tiny.attention(k=4)).parameters())]
    assert all(moved)  # every tensor trained (no vacuous equality)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name


def test_adamw_decays_the_matrices_but_not_biases_norms_or_what_the_kind_exempts():
    """1-d tensors go undecayed, and so do the parameters a kind exempts (Linformer's E/F, in the module it shares),
    whether the encoder or a standalone layer holds that module; every other kind's matrices decay."""
    linformer, full = tiny.encoder(tiny.attention(k=4)), tiny.encoder(tiny.attention("full"))
    decay, no_decay = parameter_groups(linformer)
    assert [name for name in no_decay if name.startswith("shared.")] == ["shared.weight_0", "shared.weight_1"]
    assert all(linformer.get_parameter(name).ndim == 2 for name in decay)
    decay, no_decay = parameter_groups(full)
    assert no_decay == [name for name, p in full.named_parameters() if p.ndim < 2]
    assert "shared.weight_0" in parameter_groups(tiny.layer(tiny.attention(k=4)))[1]
