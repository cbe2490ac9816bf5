"""The model-size ladder (sweeps/scale.yaml, docs/scale.md): training FLOPs in metrics.json, the ladder field of
a study file, the gap trend and its interval, the scale report, and the GPU presets' configs checked on a CPU."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lightning_modules.callbacks import TrainingFlops
from lightning_modules.flops import count_flops, training_step_flops
from lightning_modules.language_model import MaskedLMModule
from training import config as run_config
from training.train import train

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------- training FLOPs
def _tiny_mlm(layers: int = 2, d: int = 32, heads: int = 2, d_ff: int = 64, n: int = 16, vocab: int = 50):
    cfg = run_config.load(REPO / "experiments" / "configs" / "base.yaml",
                          [f"model.n_layers={layers}", f"model.d_model={d}", f"model.n_heads={heads}",
                           f"model.d_ff={d_ff}", f"model.max_len={n}", "model.dropout=0.0",
                           "model.attention.kind=full"])
    return MaskedLMModule(run_config.to_container(cfg), vocab)


def test_one_training_step_counts_the_hand_computed_flops_of_a_tiny_transformer():
    """Forward + backward of every linear layer is 6·m·in·out (2 forward, 4 backward: the input's and the
    weight's gradient); attention (SDPA's CPU flash kernel) 4·B·h·T²·d_h forward and 10·B·h·T²·d_h backward;
    the LM head (dense d×d, then the tied decoder d×V) runs only at the M masked positions."""
    layers, d, d_ff, n, vocab, batch = 2, 32, 64, 16, 50, 3
    module = _tiny_mlm(layers, d, 2, d_ff, n, vocab).train()
    input_ids = torch.randint(5, vocab, (batch, n), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(input_ids, -100)
    labels[:, ::4] = input_ids[:, ::4]                                    # M = 3 · 4 masked positions
    masked = int((labels != -100).sum())
    tokens = batch * n
    expected = (6 * tokens * layers * (4 * d * d + 2 * d * d_ff)          # Q, K, V, O and the FFN
                + layers * (4 + 10) * batch * n * n * d                   # QKᵀ and PV, forward and backward
                + 6 * masked * (d * d + d * vocab))                       # the LM head
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
    direct, _ = count_flops(lambda: torch.autograd.grad(module.training_loss(batch),
                                                       [p for p in module.parameters() if p.requires_grad]))
    assert flops == direct


def test_a_run_records_its_training_flops_and_trains_exactly_as_it_would_without_the_count(tiny_overrides,
                                                                                         monkeypatch):
    cfg = run_config.load(tiny_overrides.config, tiny_overrides.args + ["model.dropout=0.1"])
    counted = train(cfg)
    assert counted["flops_per_batch"] > 0 and counted["train_flops"] == counted["flops_per_batch"] * 6
    written = json.loads((Path(counted["run_dir"]) / "metrics.json").read_text())
    assert written["train_flops"] == counted["train_flops"]
    monkeypatch.setattr(TrainingFlops, "on_train_batch_start", lambda *args: None)
    plain = train(cfg)
    assert plain["train_flops"] is None
    assert plain["val/loss"] == counted["val/loss"]                       # same dropout draws, same updates
