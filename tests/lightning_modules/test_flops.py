"""Floating-point operation counts (lightning_modules/flops.py): an attention layer's count against its formula,
counting that changes no output and no gradient, every kind at a budget of k against full attention, a training
step's count against a hand computation (the training FLOPs a run records in metrics.json), and the causal counts of
CUDA's attention kernels, halved like the CPU one's."""

import json
from pathlib import Path

import pytest
import tiny
import torch
from kinds import D, N, attention
from tiny import REPO

from foundation.configfile import to_container
from lightning_modules.callbacks import TrainingFlops
from lightning_modules.flops import count_flops, training_step_flops
from lightning_modules.language_model import MaskedLMModule
from training import config as run_config
from training.train import train


# ----------------------------------------------------------------------------- FLOP counts
def _layer_flops(attention_cfg, n, mode, d=32, h=4, batch=2):
    torch.manual_seed(0)
    attn = tiny.layer(attention_cfg, n=n, d=d, h=h).train(mode == "fwdbwd")
    x = torch.randn(batch, n, d, requires_grad=mode == "fwdbwd")

    def run():
        if mode == "fwd":
            with torch.inference_mode():
                return attn(x)
        attn(x).sum().backward()

    return count_flops(run)[0]


@pytest.mark.parametrize("mode,per_pair", [("fwd", 4), ("fwdbwd", 14)])
def test_local_flop_count_is_4_b_h_n_w_dh_and_full_attentions_at_w_ge_n(mode, per_pair):
    n, w, d, h, b = 64, 8, 32, 4, 2
    projections = 8 * b * n * d * d * (1 if mode == "fwd" else 3)  # Q, K, V, O: forward, then 2× backward
    local = _layer_flops({"kind": "local", "options": {"window": w}}, n, mode)
    assert local - projections == per_pair * b * h * n * w * (d // h)  # 4·B·h·n·w·d_h forward (+10 backward)
    assert _layer_flops({"kind": "local", "options": {"window": n}}, n, mode) == _layer_flops({"kind": "full"}, n, mode)


def test_counting_flops_changes_no_output_and_no_gradient():
    torch.manual_seed(0)
    local = tiny.layer(attention("local"))
    x = torch.randn(2, N, D, requires_grad=True)
    plain = local(x)
    (plain * plain).sum().backward()
    expected = [x.grad.clone(), *(p.grad.clone() for p in local.parameters())]
    x.grad = None
    local.zero_grad(set_to_none=True)

    def run():
        out = local(x)
        (out * out).sum().backward()
        return out

    _, counted_out = count_flops(run)
    assert torch.equal(counted_out, plain)
    for got, want in zip([x.grad, *(p.grad for p in local.parameters())], expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_every_kind_counts_less_attention_work_than_full_at_a_budget_of_k():
    n, k = 64, 8
    full = _layer_flops({"kind": "full"}, n, "fwd")
    for kind, options in (
        ("local", {"window": k}),
        ("sparse", {"block": k}),
        ("lsh", {"bucket_size": k}),
        ("performer", {"n_features": k}),
        ("nystrom", {"n_landmarks": k}),
    ):
        assert 0 < _layer_flops({"kind": kind, "options": options}, n, "fwd") < full, kind


# --------------------------------------------------------------------------------------- training FLOPs
def _tiny_mlm(layers: int = 2, d: int = 32, heads: int = 2, d_ff: int = 64, n: int = 16, vocab: int = 50):
    cfg = run_config.load(
        REPO / "experiments" / "configs" / "base.yaml",
        [
            f"model.n_layers={layers}",
            f"model.d_model={d}",
            f"model.n_heads={heads}",
            f"model.d_ff={d_ff}",
            f"model.max_len={n}",
            "model.dropout=0.0",
            "model.attention.kind=full",
        ],
    )
    return MaskedLMModule(to_container(cfg), vocab)


def test_one_training_step_counts_the_hand_computed_flops_of_a_tiny_transformer():
    """Forward + backward of every linear layer is 6·m·in·out (2 forward, 4 backward: the input's and the
    weight's gradient); attention (SDPA's CPU flash kernel) 4·B·h·T²·d_h forward and 10·B·h·T²·d_h backward;
    the LM head (dense d×d, then the tied decoder d×V) runs only at the M masked positions."""
    layers, d, d_ff, n, vocab, batch = 2, 32, 64, 16, 50, 3
    module = _tiny_mlm(layers, d, 2, d_ff, n, vocab).train()
    input_ids = torch.randint(5, vocab, (batch, n), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(input_ids, -100)
    labels[:, ::4] = input_ids[:, ::4]  # M = 3 · 4 masked positions
    masked = int((labels != -100).sum())
    tokens = batch * n
    expected = (
        6 * tokens * layers * (4 * d * d + 2 * d * d_ff)  # Q, K, V, O and the FFN
        + layers * (4 + 10) * batch * n * n * d  # QKᵀ and PV, forward and backward
        + 6 * masked * (d * d + d * vocab)
    )  # the LM head
    flops = training_step_flops(module, lambda: module.training_loss({"input_ids": input_ids, "labels": labels}))
    assert flops == expected
    # ≈ 6·N·tokens for the non-embedding weights N = L·(4d² + 2·d·d_ff) when attention and the head are small
    six_n_tokens = 6 * layers * (4 * d * d + 2 * d * d_ff) * tokens
    assert six_n_tokens < flops < 1.5 * six_n_tokens


def test_counting_a_step_leaves_the_gradients_and_the_random_state_untouched():
    module = _tiny_mlm()
    module.train()
    batch = {"input_ids": torch.randint(5, 50, (2, 16)), "labels": torch.randint(5, 50, (2, 16))}
    state = torch.get_rng_state()
    flops = training_step_flops(module, lambda: module.training_loss(batch))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in module.parameters())
    direct, _ = count_flops(
        lambda: torch.autograd.grad(module.training_loss(batch), [p for p in module.parameters() if p.requires_grad])
    )
    assert flops == direct


def test_a_run_records_its_training_flops_and_trains_exactly_as_it_would_without_the_count(tiny_overrides, monkeypatch):
    cfg = run_config.load(tiny_overrides.config, tiny_overrides.args + ["model.dropout=0.1"])
    counted = train(cfg)
    assert counted["flops_per_batch"] > 0 and counted["train_flops"] == counted["flops_per_batch"] * 6
    written = json.loads((Path(counted["run_dir"]) / "metrics.json").read_text())
    assert written["train_flops"] == counted["train_flops"]
    monkeypatch.setattr(TrainingFlops, "on_train_batch_start", lambda *args: None)
    plain = train(cfg)
    assert plain["train_flops"] is None
    assert plain["val/loss"] == counted["val/loss"]  # same dropout draws, same updates


def test_a_length_curriculum_counts_its_short_steps_at_their_own_length(tiny_overrides):
    cfg = run_config.load(
        tiny_overrides.config,
        tiny_overrides.args + ["model.attention.kind=full", "optim.short_steps=2", "optim.short_lengths=[8]"],
    )
    counted = train(cfg)
    short, full = counted["short_flops_per_batch"], counted["flops_per_batch"]
    assert 0 < short < full  # attention over 8 positions instead of 32: fewer score FLOPs, the same token FLOPs
    assert counted["train_flops"] == 2 * short + 4 * full


# --------------------------------------------------------------------------------------- CUDA's attention kernels
def _cuda_attention_calls(causal: bool) -> dict:
    """Each CUDA attention kernel's aten op with positional arguments as its schema orders them (meta tensors:
    only shapes matter): q, k, v (B=2, h=4, T=64, d_h=16) and, for a backward, grad_out and out alike."""
    aten = torch.ops.aten
    t = torch.empty(2, 4, 64, 16, device="meta")
    lse, none = torch.empty(2, 4, 64, device="meta"), torch.empty(0, device="meta")
    return {
        aten._scaled_dot_product_flash_attention: (t, t, t, 0.0, causal),
        aten._scaled_dot_product_efficient_attention: (t, t, t, None, False, 0.0, causal),
        aten._scaled_dot_product_cudnn_attention: (t, t, t, None, False, 0.0, causal),
        aten._scaled_dot_product_flash_attention_backward: (
            t,
            t,
            t,
            t,
            t,
            lse,
            none,
            none,
            64,
            64,
            0.0,
            causal,
            none,
            none,
        ),
        aten._scaled_dot_product_efficient_attention_backward: (
            t,
            t,
            t,
            t,
            none,
            t,
            lse,
            none,
            none,
            0.0,
            [True] * 4,
            causal,
        ),
        aten._scaled_dot_product_cudnn_attention_backward: (
            t,
            t,
            t,
            t,
            t,
            lse,
            none,
            none,
            none,
            none,
            none,
            64,
            64,
            0.0,
            causal,
        ),
    }


def test_causal_flops_of_the_cuda_attention_kernels_are_halved_like_the_cpu_one():
    """Flash, memory-efficient and cuDNN attention skip the blocks above the diagonal under is_causal, as the
    CPU flash kernel does: their counts halve too (torch's own formulas ignore is_causal)."""
    from torch.utils.flop_counter import flop_registry

    forward = 4 * 2 * 4 * 64 * 64 * 16  # Q Kᵀ and P V
    for (op, causal_args), full_args in zip(_cuda_attention_calls(True).items(), _cuda_attention_calls(False).values()):
        full = flop_registry[op](*full_args)
        assert full == (forward if "backward" not in str(op) else forward * 5 // 2), op
        assert flop_registry[op](*causal_args) == full // 2, op
        assert flop_registry[op](*full_args[:-1], is_causal=True) == full // 2, op  # passed by keyword
