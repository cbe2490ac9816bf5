"""A single run of ``linformer-lab train`` is named by its experiment and the overrides given
(``runs/<experiment>/kind=full/version_0``; none: ``runs/<experiment>/version_0``), one HPARAMS tab for both."""

import json
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tiny import REPO

from experiments import cli
from training import config as run_config
from training.train import run_folder


def _config_file(tiny, tmp_path: Path) -> Path:
    """The tiny settings as a config file over base.yaml, as a user's experiment file: no override left to name."""
    settings = {}
    for arg in tiny.args:
        key, value = arg.split("=", 1)
        node = settings
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"defaults": [str(REPO / "experiments" / "configs" / "base.yaml")], **settings}))
    return path


def _hparams(folder: Path, name: str) -> plugin_data_pb2.HParamsPluginData:
    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    acc.Reload()
    return plugin_data_pb2.HParamsPluginData.FromString(acc.PluginTagToContent("hparams")[name])


def test_two_runs_are_named_by_their_overrides_share_one_hparams_tab_and_a_resume_finds_its_run(tiny, tmp_path, capsys):
    config = _config_file(tiny, tmp_path)
    experiment = tmp_path / "runs" / "tiny"
    assert cli.main(["train", str(config)]) == 0
    assert cli.main(["train", str(config), "model.attention.kind=full"]) == 0
    out = capsys.readouterr().out.splitlines()
    plain, full = experiment / "version_0", experiment / "kind=full" / "version_0"
    assert json.loads((plain / "metrics.json").read_text())["global_step"] == 6
    assert (full / "metrics.json").is_file() and not (experiment / "version_1").exists()
    # Each run prints its own folder; the TensorBoard line is the experiment's folder, which shows both.
    assert f"run directory: {full}" in out and f"run directory: {plain}" in out
    assert out.count(f"tensorboard --logdir {experiment} --host 127.0.0.1") == 2
    # One experiment config, at the experiment's folder: the overridden key first and ticked.
    assert not list((experiment / "kind=full").glob("events.out.tfevents.*"))
    infos = _hparams(experiment, "_hparams_/experiment").experiment.hparam_infos
    assert infos[0].name == "model.attention.kind" and infos[0].differs
    assert sorted(v.string_value for v in infos[0].domain_discrete.values) == ["full", "linformer"]
    assert _hparams(full, "_hparams_/session_start_info").session_start_info.group_name == "tiny/kind=full/version_0"
    # The same overrides and resume=true: the newest run of that folder, trained further in place.
    assert cli.main(["train", str(config), "model.attention.kind=full", "trainer.max_steps=9", "resume=true"]) == 0
    assert json.loads((full / "metrics.json").read_text())["global_step"] == 9
    assert not (full.parent / "version_1").exists()
    assert json.loads((plain / "metrics.json").read_text())["global_step"] == 6


def test_the_folder_name_says_the_defining_overrides_in_one_safe_folder_name(tiny):
    cfg = run_config.load(tiny.config, tiny.args)
    assert run_folder(cfg, ["model.attention.kind=full"]) == "kind=full"
    # keys sorted, each by its shortest unambiguous tail: the same overrides in any order name the same folder
    both = ["model.attention.options.k=16", "model.attention.kind=linformer"]
    assert run_folder(cfg, both) == run_folder(cfg, both[::-1]) == "kind=linformer,k=16"
    # what a resume may change (where files go, how long it trains, how often it logs) and the experiment do not
    # name the run: resume=true with the same overrides finds it
    kept = ["resume=true", "output_dir=/tmp/x", "trainer.max_steps=9", "trainer.cpu_threads=1", "experiment=other"]
    assert run_folder(cfg, [*kept, "trainer.log_every_n_steps=7"]) == ""
    assert run_folder(cfg, [*kept, "seed=3"]) == "seed=3"
    hostile = run_folder(cfg, ["data.source=../../etc/x y\tz", "model.attention.kind=" + "a" * 300])
    assert "/" not in hostile and " " not in hostile and hostile not in (".", "..")
    assert len(hostile.encode()) <= 80 and hostile.startswith("source=.._.._etc_x_y")
    assert run_folder(cfg, ["data.source=a", "model.attention.kind=" + "b" * 300]) != run_folder(
        cfg, ["data.source=a", "model.attention.kind=" + "b" * 299]
    )  # cut names keep a hash of the whole
    # two different overrides never share a folder: a key named by the tail it owns among the config's keys, and a
    # hash of the exact overrides where a character was replaced
    assert run_folder(cfg, ["model.dropout=0.1"]) == "dropout=0.1"
    assert run_folder(cfg, ["model.attention.dropout=0.1"]) == "attention.dropout=0.1"
    spaced, joined = run_folder(cfg, ["data.source=my corpus.txt"]), run_folder(cfg, ["data.source=my_corpus.txt"])
    assert joined == "source=my_corpus.txt" and spaced.startswith("source=my_corpus.txt-") and spaced != joined
    assert run_folder(cfg, ["seed=1,k=2"]) != run_folder(cfg, ["seed=1", "model.attention.options.k=2"])
    # an explicit run_dir is the run's place
    assert run_folder(run_config.load(tiny.config, [*tiny.args, "run_dir=/tmp/r"]), ["seed=3"]) == ""


def test_a_named_folder_that_cannot_be_one_is_one_line_before_anything_is_written(tiny, tmp_path, capsys):
    config = _config_file(tiny, tmp_path)
    experiment = tmp_path / "runs" / "tiny"
    experiment.mkdir(parents=True)
    (experiment / "kind=full").symlink_to(tmp_path / "elsewhere")
    assert cli.main(["train", str(config), "model.attention.kind=full"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "kind=full" in err[0] and "symbolic link" in err[0], err
    (experiment / "kind=full").unlink()
    (experiment / "kind=full").write_text("a file")
    assert cli.main(["train", str(config), "model.attention.kind=full", "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file, not a folder" in err[0], err
    assert sorted(p.name for p in experiment.iterdir()) == ["kind=full"] and not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("record", [{"axes": "seed"}, {"values": {"seed": 0}, "metrics": [{}]}])
def test_an_hparams_record_of_another_form_is_made_anew_and_the_run_completes(tiny, tmp_path, record):
    config = _config_file(tiny, tmp_path)
    experiment = tmp_path / "runs" / "tiny"
    experiment.mkdir(parents=True)
    (experiment / ".hparams.json").write_text(json.dumps(record))
    assert cli.main(["train", str(config)]) == 0
    assert (experiment / "version_0" / "metrics.json").is_file()
    made = json.loads((experiment / ".hparams.json").read_text())
    assert made["values"]["seed"] == ["0"] and "hp/val_masked_loss" in made["metrics"] and made["axes"] == []


def test_overrides_that_differ_only_in_a_keys_prefix_get_two_folders_and_each_resume_finds_its_own(tiny, tmp_path):
    config = _config_file(tiny, tmp_path)
    experiment = tmp_path / "runs" / "tiny"
    assert cli.main(["train", str(config), "model.dropout=0.2"]) == 0
    assert cli.main(["train", str(config), "model.attention.dropout=0.2"]) == 0
    first, second = experiment / "dropout=0.2" / "version_0", experiment / "attention.dropout=0.2" / "version_0"
    assert (first / "metrics.json").is_file() and (second / "metrics.json").is_file()
    assert cli.main(["train", str(config), "model.dropout=0.2", "resume=true", "trainer.max_steps=9"]) == 0
    assert json.loads((first / "metrics.json").read_text())["global_step"] == 9
    assert not (first.parent / "version_1").exists()
    assert json.loads((second / "metrics.json").read_text())["global_step"] == 6
