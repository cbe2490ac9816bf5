"""The model-size ladder of a study file (sweeps/spec/ladders.py, docs/scale.md): a ladder names its rungs and its
arms are compared only within a rung; a bad ladder is one line naming the key."""

from __future__ import annotations

import pytest
from studies import LADDER_ARMS, RUNGS, ladder_study

from foundation.errors import ConfigError
from sweeps.spec.study import load_study


def test_a_ladder_study_names_its_rungs_and_compares_arms_only_within_a_rung(tmp_path, tiny_overrides):
    study = load_study(ladder_study(tmp_path, tiny_overrides))
    assert study.rungs == ["s1", "s2", "s3"] and study.n_trials == 12
    assert study.arm_label({"seed": 0, "rung": "s2", "arm": "full"}) == "s2 full"
    assert study.arm_label({"seed": 0, "rung": "s2", "arm": "full"}, without=["rung"]) == "full"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"ladder": {"rung": "size", "reference": {"arm": "full"}}}, "ladder.rung: 'size' is not a param of space"),
        ({"ladder": {"rung": "seed", "reference": {"arm": "full"}}}, "ladder.rung: 'seed' must be one of arms"),
        (
            {"ladder": {"rung": "rung"}},
            "ladder.reference: give the reference arm's value of 'arm' (choices: full, linformer)",
        ),
        (
            {"ladder": {"rung": "rung", "reference": {"arm": "fast"}}},
            "ladder.reference.arm: 'fast' is not a choice of space.arm (choices: full, linformer)",
        ),
        (
            {"ladder": {"rung": "rung", "reference": {"arm": "full", "seed": 0}}},
            "ladder.reference.seed: not an arm param beside the rung (arm params: arm)",
        ),
        ({"arms": ["rung"]}, "ladder: arms has no param beside the rung 'rung'"),
        (
            {
                "space": {
                    "seed": {"choices": [0, 1]},
                    "rung": {"choices": {"s2": RUNGS["s2"], "s1": RUNGS["s1"]}},
                    "arm": {"choices": LADDER_ARMS},
                }
            },
            "ladder.rung: rungs must grow, smallest first: 's1' has 7,568 parameters, not more than 's2' before it (17,760)",
        ),
        ({"sampler": {"kind": "random"}, "budget": {"n_trials": 2}}, "ladder: a ladder is a grid"),
    ],
)
def test_a_bad_ladder_is_one_line_naming_the_key(tmp_path, tiny_overrides, changes, message):
    with pytest.raises(ConfigError) as err:
        load_study(ladder_study(tmp_path, tiny_overrides, **changes))
    assert message in str(err.value) and "\n" not in str(err.value)
