"""``python -m experiments.cooldown_check``: a budget curve's cooldown points beside separate runs of the stretched
schedule at the same budgets, on a tiny config."""

import json

from experiments import cooldown_check


def test_the_check_trains_a_curve_and_a_stretched_run_per_budget_and_tables_their_paired_difference(
    tiny_overrides, tmp_path, capsys
):
    """Two seeds at ×1 and ×2 of 6 steps: each seed's trunk (to step 10), its cooldowns and its stretched runs end at
    the same steps (6 and 12); the table has a row per budget with the paired difference over the two seeds."""
    out = tmp_path / "check"
    args = [str(tiny_overrides.config), *tiny_overrides.args, "--seeds", "0,1", "--budgets", "1,2"]
    assert cooldown_check.main([*args, "--output-dir", str(out)]) == 0
    root = out / "base"
    for seed in (0, 1):
        for name, steps in (("x1", 6), ("x2", 12)):
            for kind in ("cooldown", "stretched"):
                metrics = json.loads((root / f"seed={seed}" / f"{kind}_{name}" / "metrics.json").read_text())
                assert metrics["global_step"] == steps, (seed, kind, name)
    results = json.loads((root / "comparison.json").read_text())
    assert set(results) == {"0", "1"} and set(results["0"]) == {"x1", "x2"}
    table = (root / "comparison.md").read_text()
    assert "| ×1 | 0: " in table and "| ×2 | 0: " in table and "cooldown − stretched, 95 % CI" in table
    assert "| budget |" in capsys.readouterr().out


def test_a_budget_that_cannot_cool_down_after_the_warm_up_is_refused_before_anything_trains(
    tiny_overrides, tmp_path, capsys
):
    args = [str(tiny_overrides.config), *tiny_overrides.args, "optim.warmup_steps=6", "--budgets", "1"]
    assert cooldown_check.main([*args, "--output-dir", str(tmp_path / "check")]) == 2
    assert "--budgets: ×1: optim.cooldown_fraction: 0.2 of trainer.max_steps=6" in capsys.readouterr().err
    assert not (tmp_path / "check").exists()


def test_the_two_methods_differ_only_where_the_ci_of_their_difference_excludes_0():
    """Differs: the CI clear of 0; within seed noise: the mean difference no larger than the smaller spread (two
    runs that both reach accuracy 1 agree); else not shown to agree."""
    from sweeps.spec import stats

    def paired(diffs):
        return stats.compare({i: 2.0 + d for i, d in enumerate(diffs)}, {i: 2.0 for i in range(len(diffs))})

    assert cooldown_check.agreement(paired([-0.1, -0.11, -0.12]), [0.05, 0.07]) == "differs"
    assert cooldown_check.agreement(paired([-0.01, 0.02, -0.005]), [0.05, 0.07]) == "within seed noise"
    assert cooldown_check.agreement(paired([-0.3, 0.02]), [0.05, 0.07]) == "not shown to agree (2 seeds)"
    assert cooldown_check.agreement(paired([0.1]), [float("nan")] * 2) == "not judged (one seed)"
    assert cooldown_check.agreement(paired([0.0, 0.0]), [0.0, 0.0]) == "within seed noise"  # both solve recall
