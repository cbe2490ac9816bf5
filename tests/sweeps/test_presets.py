"""Every shipped study's every preset, GPU ones included, is ready before anyone has a GPU: each trial config
(every grid point of the study and of its control) passes the full preflight of ``train --check`` (schema,
rules, the Trainer's arguments, the model built on the meta device), and each distinct attention setting of the
long-sequence head-to-head preset takes one training step at a shrunken width on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lightning_modules.encoder import TransformerEncoder
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
