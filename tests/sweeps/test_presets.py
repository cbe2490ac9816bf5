"""Every shipped study's every preset, GPU ones included, is ready before anyone has a GPU: each trial config
(every grid point of the study and of its control) passes the full preflight of ``train --check`` (schema,
rules, the Trainer's arguments, the model built on the meta device), and each distinct attention setting of the
long-sequence head-to-head preset takes one training step at a shrunken width on CPU; so does the largest rung of
the model-size ladder's GPU presets (sweeps/scale.yaml), every rung of which passes the train check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tiny import REPO

from lightning_modules.encoder import TransformerEncoder
from lightning_modules.language_model import MaskedLMModule
from sweeps.spec.schema import SEED_PARAM, SWEEPS_DIR
from sweeps.spec.study import load_study
from training.config import check
from training.train import preflight

STUDIES = sorted(SWEEPS_DIR.glob("*.yaml"))


def presets(path: Path) -> list:
    named = sorted(OmegaConf.to_container(OmegaConf.load(path)).get("presets") or {})
    return named if "cpu" in named else [None, *named]  # without a preset, a file with a cpu preset runs that


CASES = [(path, preset) for path in STUDIES for preset in presets(path)]
CHECKED: set[str] = set()


@pytest.mark.parametrize("path, preset", CASES, ids=[f"{p.stem}:{s or 'file'}" for p, s in CASES])
def test_every_trial_of_every_preset_passes_the_preflight(path, preset):
    study = load_study(path, preset)
    for one in study.studies:
        # trials differing only in their seed differ in no check: one of them is built
        rests = {
            repr({k: v for k, v in p.items() if k != SEED_PARAM}): p
            for p in (one.points if one.is_grid else one.range_ends())
        }
        for params in rests.values():
            cfg = one.config(params)
            # the seed and the run's names change no check: each distinct setting once for the whole module
            key = repr(OmegaConf.to_container(OmegaConf.merge(cfg, {"seed": 0, "experiment": "x", "run_dir": None})))
            if key not in CHECKED:
                preflight(cfg)
                CHECKED.add(key)


def test_every_long_sequence_arm_trains_one_step_at_a_shrunken_width():
    study = load_study(SWEEPS_DIR / "head_to_head.yaml", "gpu_long")
    seen = set()
    for params in study.points:
        cfg = study.config(params)
        attention = OmegaConf.to_container(cfg.model.attention)
        key = repr(attention)
        if key in seen:
            continue
        seen.add(key)
        shrunk = OmegaConf.merge(cfg, {"model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}})
        check(shrunk)
        torch.manual_seed(0)
        encoder = TransformerEncoder(shrunk.model, vocab_size=300)
        ids = torch.randint(0, 300, (1, shrunk.model.max_len))
        encoder(ids).square().mean().backward()
        assert all(p.grad is not None for p in encoder.parameters() if p.requires_grad), attention["kind"]
    assert len(seen) == 7


# --------------------------------------------------------------------------------------- the GPU presets
SCALE = REPO / "sweeps" / "scale.yaml"


@pytest.fixture(scope="module")
def gpu_presets():
    """The GPU presets of sweeps/scale.yaml, loaded (and every grid point's config checked) once."""
    return {preset: load_study(SCALE, preset) for preset in ("gpu", "gpu_large")}


@pytest.mark.parametrize("preset", ["gpu", "gpu_large"])
def test_every_rung_of_the_gpu_presets_passes_the_train_check(gpu_presets, preset):
    """What `linformer-lab train <config> --check` does (Trainer arguments, the model on the meta device) for
    every rung and arm, and the ladder's promises: ~3× the parameters a rung, ~5.5 tokens per parameter,
    RoBERTa-base (and, behind gpu_large, RoBERTa-large) shapes at n = 512."""
    from training.train import preflight

    study = gpu_presets[preset]
    configs = {(p["rung"], p["arm"]): study.config(p) for p in study.points if p["seed"] == 0}
    sizes = {}
    for (rung, arm), cfg in configs.items():
        n = preflight(cfg)
        if arm == "full":
            sizes[rung] = n
            tokens = cfg.trainer.max_steps * cfg.data.batch_size * cfg.model.max_len
            assert 5.0 < tokens / n < 6.0, rung
    for p in study.control.points:
        preflight(study.control.config(p))
    ratios = [b / a for a, b in zip(list(sizes.values()), list(sizes.values())[1:])]
    assert all(2.5 < r < 4.0 for r in ratios), ratios
    base = configs[("12x768", "k_scaled")].model
    assert (base.n_layers, base.d_model, base.n_heads, base.max_len, base.attention.options.k) == (
        12,
        768,
        12,
        512,
        256,
    )
    assert configs[("12x768", "k_fixed")].model.attention.options.k == 128
    assert configs[("12x768", "full")].model.attention.kind == "full"
    assert ("24x1024", "full") in configs if preset == "gpu_large" else study.rungs[-1] == "12x768"
    if preset == "gpu_large":
        large = configs[("24x1024", "k_scaled")].model
        assert (large.n_layers, large.d_model, large.n_heads, large.max_len) == (24, 1024, 16, 512)


@pytest.mark.parametrize("arm", ["full", "k_fixed", "k_scaled"])
def test_the_largest_rung_trains_one_step_at_a_sixteenth_of_its_width(gpu_presets, arm):
    """The RoBERTa-large rung's depth, heads, n and k with d_model and d_ff divided by 16 (64 and 256, head
    dimension 4): one AdamW step of masked LM on CPU, which every shape rule of the full-size model passes."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(
        gpu_presets["gpu_large"].config({"seed": 0, "rung": "24x1024", "arm": arm}), resolve=True
    )
    cfg["model"].update(d_model=cfg["model"]["d_model"] // 16, d_ff=cfg["model"]["d_ff"] // 16)
    module = MaskedLMModule(cfg, vocab_size=cfg["data"]["tokenizer"]["vocab_size"]).train()
    optimizer = module.configure_optimizers()["optimizer"]
    n = cfg["model"]["max_len"]
    input_ids = torch.randint(5, 1000, (2, n), generator=torch.Generator().manual_seed(0))
    labels = torch.where(torch.rand(2, n, generator=torch.Generator().manual_seed(1)) < 0.15, input_ids, -100)
    before = module.encoder.blocks[-1].attn.q_proj.weight.detach().clone()
    loss = module.training_loss({"input_ids": input_ids, "labels": labels})
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and len(module.encoder.blocks) == 24 and module.encoder.blocks[0].attn.n_heads == 16
    assert not torch.equal(before, module.encoder.blocks[-1].attn.q_proj.weight)


# --------------------------------------------------------------------------------------- gpu_quick
# One eager trial of sweeps/bases/gpu.yaml alone on one H200, tokens/s (2026-12-04, docs/gpu.md): the figures
# random_vs_learned's gpu_quick derives its 10 minutes from.
H200_TOKENS_PER_S = {"full": 504e3, "linformer": 335e3}
GPU_QUICK_TRAINING_S = 460  # of its 600: the rest for the data's first preparation, the workers' start, the report


def test_gpu_quick_trains_the_paper_scale_model_within_the_gpu_time_its_file_derives():
    """Every trial of random_vs_learned's gpu_quick is the paper's model (n = 512, d = 512, 8 heads, 8 layers, batch 32,
    k = 128; the control's degraded arm k = 1), and its trials' GPU time at the measured throughput, one at a time (the
    worst case: sharing the GPU gains nothing) with a third of a step for each validation batch, stays within the
    training time the study file derives: raising its steps or seeds past that needs a new derivation."""
    study = load_study(SWEEPS_DIR / "random_vs_learned.yaml", "gpu_quick")
    seconds, trials = 0.0, 0
    for one in study.studies:
        for params in one.points:
            cfg = one.config(params)
            m, t = cfg.model, cfg.trainer
            assert (m.max_len, m.d_model, m.n_heads, m.n_layers, cfg.data.batch_size) == (512, 512, 8, 8, 32)
            if m.attention.kind == "linformer":
                assert m.attention.options.k == (1 if params.get("control") == "degraded" else 128)
            validated = t.max_steps // t.val_check_interval * t.limit_val_batches
            tokens = (t.max_steps + validated / 3) * cfg.data.batch_size * m.max_len
            seconds += tokens / H200_TOKENS_PER_S[m.attention.kind]
            trials += 1
    assert trials == 16 and seconds <= GPU_QUICK_TRAINING_S, (trials, seconds)
