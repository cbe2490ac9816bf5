"""The CPU presets have the power to see an effect at their budget: each study's control (on recall a Linformer
whose k is far too small for the task, on the byte MLM a model that cannot use context) separates from full
attention by more than the seed-to-seed spread, and full attention leaves the no-context level. The quickstart (`make run`, causal MQAR) and the byte-level
MLM base of the other bidirectional studies; minutes each on 2 cores: `slow`."""

import pytest

from sweeps.spec.schema import REPO_ROOT
from sweeps.spec.stats import compare, power_check, summarize
from sweeps.spec.study import load_study
from training.train import train


def no_context(metrics: dict, metric: str) -> float:
    """What a model without context reaches on ``metric``: the unigram on the same targets, else the trivial level."""
    unigram = (metrics.get("baselines") or {}).get(f"unigram/{metric.removeprefix('val/')}")
    return unigram if unigram is not None else metrics[f"trivial_{metric.rsplit('_', 1)[-1].removeprefix('val/')}"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["random_vs_learned", "sharing"])
def test_the_cpu_control_separates_from_full_attention_beyond_the_seed_spread(tmp_path, name):
    control = load_study(REPO_ROOT / "sweeps" / f"{name}.yaml", "cpu").control
    metric, direction = control.metrics[0], control.directions[0]
    runs = {
        role: {
            seed: train(
                control.config(
                    {"control": role, "seed": seed}, {"run_dir": str(tmp_path / f"{role}_{seed}"), "experiment": role}
                )
            )
            for seed in control.spec.space.seed.choices
        }
        for role in ("reference", "degraded")
    }
    values = {role: {seed: m[metric] for seed, m in by_seed.items()} for role, by_seed in runs.items()}
    trivial = {seed: no_context(m, metric) for seed, m in runs["reference"].items()}
    assert power_check(values["reference"], values["degraded"], trivial, direction).has_power, (values, trivial)
    sign = 1 if direction == "maximize" else -1  # > 0: better
    gap = sign * compare(values["reference"], values["degraded"]).diff
    spread = max(summarize(list(v.values())).std for v in values.values())
    assert gap > 3 * spread, values
    assert min(sign * v for v in values["reference"].values()) > max(sign * v for v in values["degraded"].values())
    assert min(sign * (v - trivial[s]) for s, v in values["reference"].items()) > 3 * spread, (values, trivial)
