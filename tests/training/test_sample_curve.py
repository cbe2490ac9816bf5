"""The fixed-sample validation curve (training/sample_curve.py) and the HPARAMS experiment record
(training/tensorboard.py)."""

import json

import pytest
from tiny import run_of

from experiments import cli
from training import sample_curve
from training.sample_curve import SampleValidation, sample_every, sample_positions
from training.tensorboard import columns, merged


def test_schedule_gives_twenty_points_and_a_spread_sample():
    assert sample_every(600) == 30 and len(range(30, 601, 30)) == 20
    assert sample_every(1500) == 75 and sample_every(6) == 1
    # bytes_mlm validates 320 batches: 10 of them, every 32nd, make the sample
    assert sample_positions(320) == list(range(0, 320, 32))
    assert sample_positions(16) == [0] and sample_positions(33) == [0, 16]


def test_the_sample_changes_nothing_a_run_records(tiny, tmp_path, monkeypatch):
    """The same run with the sample validations and without: every validation number, to the last digit."""
    args = ["train", str(tiny.config), *tiny.args]
    assert cli.main(args) == 0
    monkeypatch.setattr(SampleValidation, "on_train_batch_end", lambda *a, **k: None)
    assert cli.main(args) == 0
    runs = [json.loads((run_of(tmp_path / "runs" / "tiny", i) / "metrics.json").read_text()) for i in (0, 1)]
    scored = [k for k in runs[0] if k.startswith("val/") or k == "validation_examples"]
    assert "val/masked_loss" in scored
    assert [{k: r[k] for k in scored} for r in runs] == [{k: runs[1][k] for k in scored}] * 2
    assert [c[1:] for c in runs[0]["ppl_vs_wallclock"]] == [c[1:] for c in runs[1]["ppl_vs_wallclock"]]
    assert sample_curve.POINTS >= 10


def test_experiment_record_lists_the_axes_and_the_varied_first_and_keeps_every_metric():
    first = merged({}, {"experiment": "x", "kind": "linformer", "seed": 0}, ["hp/val_masked_loss"], ())
    assert columns(first) == ["experiment", "kind", "seed"]
    both = merged(first, {"experiment": "x", "kind": "full", "seed": 0, "lr": 0.1}, ["hp/val_accuracy"], ["lr"])
    assert columns(both) == ["lr", "kind", "experiment", "seed"]  # the given axis, then what differs
    assert both["metrics"] == ["hp/val_masked_loss", "hp/val_accuracy"]
    assert both["values"]["kind"] == ["linformer", "full"]
    # True and 1 are different values of a column
    assert merged(both, {"flag": True}, [], ())["values"]["flag"] == [True]
    assert merged(merged(both, {"flag": True}, [], ()), {"flag": 1}, [], ())["values"]["flag"] == [True, 1]


@pytest.mark.parametrize("share", [1, 4])
def test_sample_share_is_a_share_of_the_batches(share, monkeypatch):
    monkeypatch.setattr(sample_curve, "SAMPLE_SHARE", share)
    assert len(sample_positions(8)) == 8 // share


def test_trials_are_named_by_arm_seed_and_number_with_short_unambiguous_keys():
    from foundation.rundir import NAME_LIMIT, short_keys, values_name
    from sweeps.run.trials import trial_folder

    keys = short_keys(["model.attention.kind", "model.attention.options.k", "data.k"])
    assert keys == {"model.attention.kind": "kind", "model.attention.options.k": "options.k", "data.k": "data.k"}
    params = {"model.attention.kind": "full", "seed": 2}
    assert trial_folder(params, 7).as_posix() == "kind=full/seed=2_trial_7"
    assert trial_folder({"seed": 0}, 1).as_posix() == "seed=0_trial_1" and trial_folder({}, 3).as_posix() == "trial_3"
    assert values_name({"data.path": "a/b c"}) == "path=a_b_c"
    # an arm whose label already says its key (fixed_k_vary_n's n=512) is not prefixed twice; with a schema it is
    assert values_name({"arm": "full", "n": "n=512"}) == "arm=full,n=512"
    assert values_name({"n": "n=512"}, ["n"]) == "n=n=512"
    long = values_name({f"key{i}": "x" * 20 for i in range(10)})
    assert len(long) == NAME_LIMIT and long != values_name({f"key{i}": "x" * 20 for i in range(11)})


def test_a_run_is_listed_in_its_experiment_folder_by_its_overrides_and_folder(tmp_path):
    from training.tensorboard import LogPlace, log_roots

    runs = tmp_path / "runs"
    kind = {"model.attention.kind": "full"}
    roots, name = log_roots(runs / "bytes_mlm" / "version_1", runs, LogPlace(axes=tuple(kind)), kind)
    assert roots == [runs / "bytes_mlm"] and name == "kind=full bytes_mlm/version_1"
    study = tmp_path / "elsewhere" / "arms"  # a study outside output_dir: its own folder only
    roots, name = log_roots(study / "control" / "seed=0_trial_1", runs, LogPlace(root=study), {})
    assert roots == [study] and name == "control/seed=0_trial_1"
