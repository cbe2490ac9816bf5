"""The quickstart study (`make run`) has the power to see an effect at its CPU budget: its control arm
(a Linformer whose k is far below the number of MQAR pairs) separates from full attention by more than
the seed-to-seed spread, and full attention leaves the trivial solution. Minutes on 2 cores: `slow`."""

import pytest

from experiments.train import train
from sweeps.stats import compare, summarize
from sweeps.study import REPO_ROOT, load_study

TRIVIAL = {"val/accuracy": "trivial_accuracy", "val/loss": "trivial_loss"}


@pytest.mark.slow
def test_quickstart_control_arm_separates_from_full_attention_beyond_the_seed_spread(tmp_path):
    study = load_study(REPO_ROOT / "sweeps" / "random_vs_learned.yaml", "cpu")
    metric, direction = study.metrics[0], study.directions[0]
    control = next(arm for arm in study.spec.space.arm.choices if arm.startswith("control"))
    runs = {arm: {seed: train(study.config({"seed": seed, "arm": arm},
                                           {"run_dir": str(tmp_path / f"{arm}_{seed}"), "experiment": arm}))
                  for seed in study.spec.space.seed.choices}
            for arm in ("full", control)}
    values = {arm: {seed: m[metric] for seed, m in by_seed.items()} for arm, by_seed in runs.items()}
    sign = 1 if direction == "maximize" else -1                          # > 0: better
    gap = sign * compare(values["full"], values[control]).diff
    spread = max(summarize(list(v.values())).std for v in values.values())
    assert compare(values["full"], values[control]).distinguishable and gap > 0, values
    assert gap > 3 * spread, values
    assert min(sign * v for v in values["full"].values()) > max(sign * v for v in values[control].values()), values
    trivial = next(iter(runs["full"].values()))[TRIVIAL[metric]]
    assert min(sign * (v - trivial) for v in values["full"].values()) > 3 * spread, (values, trivial)
