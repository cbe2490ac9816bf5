"""The grid of a study (sweeps/spec/grids.py): conditional params enter it only where they are active."""

from __future__ import annotations

from studies import write_study

from sweeps.spec.study import load_study


def test_conditional_params_enter_the_grid_only_where_active(tmp_path, tiny_overrides):
    path = write_study(
        tmp_path,
        tiny_overrides,
        "conditional",
        {
            "seed": {"type": "categorical", "choices": [0, 1]},
            "model.attention.kind": {"type": "categorical", "choices": ["full", "linformer"]},
            "model.attention.options.k": {
                "type": "int",
                "low": 4,
                "high": 8,
                "step": 4,
                "when": {"model.attention.kind": "linformer"},
            },
        },
    )
    study = load_study(path)
    per_seed = [{"model.attention.kind": "full"}] + [
        {"model.attention.kind": "linformer", "model.attention.options.k": k} for k in (4, 8)
    ]
    assert study.points == [{"seed": s, **arm} for s in (0, 1) for arm in per_seed]
    assert study.n_trials == 6 and study.arms == ["model.attention.kind", "model.attention.options.k"]
