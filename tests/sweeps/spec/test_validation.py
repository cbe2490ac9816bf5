"""Validation of a study file (sweeps/spec/validation.py): every problem is one line and exit 2, before any trial."""

from __future__ import annotations

import pytest
from studies import write_study

from experiments import cli


@pytest.mark.parametrize(
    "change, message",
    [
        ({"space": {"model.attention.kk": {"choices": [1]}}}, "space.model.attention.kk: not a config key"),
        ({"overrides": {"model.attention.kind": "bigbird"}}, "model.attention.kind"),
        ({"space": {"model.attention.options.k": {"choices": [8, 999]}}}, "model.attention.options.k=999"),
        (
            {
                "pruner": {"kind": "median"},
                "objective": [{"metric": "val/loss"}, {"metric": "tokens_per_sec", "direction": "maximize"}],
            },
            "Optuna cannot prune multi-objective studies",
        ),
        ({"overrides": {"trainer.devices": 2}}, "ddp_spawn"),
        (
            {"space": {"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}},
            "a grid needs finite values",
        ),
        ({"sampler": {"kind": "bayes"}}, "sampler.kind"),
        (
            {"control": {"reference": {"model.attention.kind": "full"}, "seeds": [0, 1]}},
            "control.degraded: give the overrides of the degraded arm",
        ),
        (
            {
                "control": {
                    "reference": {"model.attention.options.k": 2},
                    "degraded": {"model.attention.options.k": 2},
                    "seeds": [0, 1],
                }
            },
            "control: reference and degraded are the same overrides",
        ),
        (
            {
                "control": {
                    "reference": {"model.attention.kind": "full"},
                    "degraded": {"model.attention.options.k": 999},
                    "seeds": [0, 1],
                }
            },
            "control.degraded: model.attention.options.k: k=999",
        ),
        (
            {"control": {"reference": {"model.attention.kind": "full"}, "degraded": {"model.attention.options.k": 1}}},
            "control.seeds: at least 2 distinct seeds",
        ),
        (
            {
                "control": {
                    "reference": {"model.attention.kind": "full"},
                    "degraded": {"model.attention.options.k": 1},
                    "seeds": [0, 1],
                },
                "space": {"control": {"choices": ["a", "b"]}},
            },
            "space.control: the name is taken by the study's control arms",
        ),
        (
            {"verdict": {"deltas": {"val/loss": 0.01}}},
            "verdict.deltas: unknown key (allowed here: delta, success, context_gain, within)",
        ),
        (
            {"verdict": {"delta": {"val/loss": -0.01}}},
            "verdict.delta.val/loss: the margin δ must be > 0 (in the metric's units), got -0.01",
        ),
        (
            {"verdict": {"delta": {"val/loss": "small"}}},
            "verdict.delta.val/loss: Value 'small' of type 'str' could not be",
        ),
        (
            {"verdict": {"delta": {"val/los": 0.01}}},
            "verdict.delta.val/los: not an objective metric of this study file (objectives: val/loss)",
        ),
        (
            {
                "objective": [{"metric": "val/accuracy", "direction": "maximize"}],
                "verdict": {"success": {"val/accuracy": 90}},
            },
            "verdict.success.val/accuracy: an accuracy is a fraction in [0, 1], so 0 < threshold <= 1 (90 % is 0.9), got 90",
        ),
        (
            {"objective": [{"metric": "tokens_per_sec", "direction": "maximize"}]},
            "verdict.delta.tokens_per_sec: objective metric 'tokens_per_sec' has no default margin δ",
        ),
        # a seed after the first is checked too, though its trial shares every other check with the first's
        ({"space": {"seed": {"type": "categorical", "choices": [0, 2**32]}}}, "trial with seed=4294967296: seed:"),
    ],
)
def test_a_bad_study_file_is_one_line_and_exit_2_before_any_trial(tmp_path, tiny_overrides, capsys, change, message):
    space = {"seed": {"type": "categorical", "choices": [0]}, **change.pop("space", {})}
    path = write_study(tmp_path, tiny_overrides, "bad", space, **change)
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {path}") and message in err
    assert not (tmp_path / "runs").exists()
