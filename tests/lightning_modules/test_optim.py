"""The optimiser the runs train with: AdamW on two parameter groups, multi-tensor, under the warm-up schedule."""

import math

import pytest
import tiny
import torch
import torch.nn.functional as F

from lightning_modules.encoder import TransformerEncoder
from lightning_modules.optim import build_optimizer, cooldown_factor, cooldown_start, lr_factor, parameter_groups

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


def test_e_and_f_learn_at_their_own_rate_and_every_other_weight_as_before():
    """``projection_lr_scale`` puts E/F in a group of their own at lr × scale, under the same schedule: at 0 they
    stay where they started while every other weight trains exactly as with E/F frozen; at 1 the optimiser is the
    two groups, unchanged."""
    model = tiny.encoder(tiny.attention(k=4))
    assert len(build_optimizer(model, {**OPTIM, "projection_lr_scale": 1.0}, 8)["optimizer"].param_groups) == 2
    built = build_optimizer(model, {**OPTIM, "projection_lr_scale": 0.1}, 8)
    groups = built["optimizer"].param_groups
    assert [g["initial_lr"] for g in groups] == pytest.approx([3e-3, 3e-3, 3e-4])
    assert {id(p) for p in groups[2]["params"]} == {id(model.shared.weight_0), id(model.shared.weight_1)}
    assert groups[2]["lr"] == pytest.approx(3e-4 / 3)  # the warm-up's first factor, as the other groups'

    still, frozen = tiny.encoder(tiny.attention(k=4)), tiny.encoder(tiny.attention(k=4))
    start = still.shared.weight_0.detach().clone()
    built = build_optimizer(still, {**OPTIM, "projection_lr_scale": 0.0}, 8)
    _train(still, built["optimizer"], built["lr_scheduler"]["scheduler"])
    frozen.shared.requires_grad_(False)
    built = build_optimizer(frozen, OPTIM, 8)
    _train(frozen, built["optimizer"], built["lr_scheduler"]["scheduler"])
    assert torch.equal(still.shared.weight_0, start)
    for (name, a), b in zip(still.named_parameters(), frozen.parameters()):
        if not name.startswith("shared."):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "shape, q, expected",
    [
        ("linear", 0.25, 0.75),
        ("cosine", 0.5, 0.5),
        ("cosine", 0.25, (1 + math.cos(math.pi / 4)) / 2),
        ("1-sqrt", 0.25, 0.5),
    ],
)
def test_a_cooldown_shape_is_its_formula(shape, q, expected):
    assert cooldown_factor(q, shape) == pytest.approx(expected)
    assert cooldown_factor(0.0, shape) == 1.0 and cooldown_factor(1.0, shape) == pytest.approx(0.0)


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_warms_up_holds_the_peak_then_cools_down_over_the_last_fraction(shape):
    """100 steps, warm-up 10, cooldown 20 %: (s+1)/10 up to step 9, exactly 1 from step 10 to 79 (the constant
    schedule's values: a trunk at constant lr is this schedule's stable phase), then falling monotonically to 0 at
    step 100, the shape's value at each fraction of the cooldown."""
    factors = [lr_factor(s, 10, 100, "wsd", 0.2, shape) for s in range(101)]
    assert factors[:10] == [(s + 1) / 10 for s in range(10)]
    assert factors[10:80] == [lr_factor(s, 10, 100, "constant") for s in range(10, 80)] == [1.0] * 70
    assert factors[80] == 1.0 and factors[100] == pytest.approx(0.0)
    assert all(a > b for a, b in zip(factors[80:], factors[81:]))
    assert factors[90] == pytest.approx(cooldown_factor(0.5, shape))
    assert cooldown_start(100, 0.2) == 80 and cooldown_start(7, 0.2) == 6  # rounded to a whole step


def test_the_1_sqrt_cooldown_stays_above_linear_which_stays_above_cosine_early_on():
    """Hägele et al.'s 1-sqrt keeps more of the peak than linear over the cooldown's first quarter; it drops last."""
    for q in (0.02, 0.1, 0.2):
        assert cooldown_factor(q, "1-sqrt") < cooldown_factor(q, "linear")
    assert cooldown_factor(0.9, "1-sqrt") < cooldown_factor(0.9, "linear")
    assert cooldown_factor(0.2, "cosine") > cooldown_factor(0.2, "linear")


def test_the_scheduler_follows_wsd_with_the_configured_cooldown():
    model = tiny.encoder(tiny.attention(k=4))
    optim = {**OPTIM, "warmup_steps": 2, "schedule": "wsd", "cooldown_fraction": 0.5, "cooldown_shape": "cosine"}
    built = build_optimizer(model, optim, max_steps=8)
    scheduler = built["lr_scheduler"]["scheduler"]
    seen = []
    for _ in range(8):
        seen.append(built["optimizer"].param_groups[0]["lr"] / OPTIM["lr"])
        scheduler.step()
    assert seen == pytest.approx(
        [0.5, 1.0, 1.0, 1.0, 1.0, cooldown_factor(0.25, "cosine"), 0.5, cooldown_factor(0.75, "cosine")]
    )
