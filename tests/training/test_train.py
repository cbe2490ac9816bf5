"""`linformer-lab train` (training/train.py) end to end on a tiny model: run directory, TensorBoard, metrics, resume;
the parameters ``--check`` counts, and every shipped config answers on a CPU in minutes or says that it needs a GPU."""

import json
import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tiny import REPO

from experiments import cli

EXPECTED_SCALARS = {
    "train/loss",
    "train/ppl",
    "val/loss",
    "val/ppl",
    "val/accuracy",
    "perf/tokens_per_sec",
    "perf/step_time_s",
    "perf/peak_mem_mb",
    "train/lr",
    "hp/val_loss",
    "hp/val_ppl",
    "val/ppl_vs_wallclock",
}


def _events(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _hparams(run_dir):
    """Hyper-parameter names and metric tags of the HPARAMS plugin's session-start record."""
    acc = _events(run_dir)
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    return dict(start.session_start_info.hparams), {m.name.tag for m in exp.experiment.metric_infos}


@pytest.mark.parametrize("kind", ["linformer", "full"])
def test_train_writes_run_dir_tensorboard_and_metrics(tiny_overrides, tmp_path, kind):
    assert cli.main(["train", str(tiny_overrides.config), *tiny_overrides.args, f"model.attention.kind={kind}"]) == 0
    run = tmp_path / "runs" / "tiny" / "version_0"
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ("val/loss", "val/ppl", "parameters", "wall_time_s", "tokens_per_sec", "peak_mem_mb"):
        assert isinstance(metrics[key], (int, float)) and math.isfinite(metrics[key]), key
    assert metrics["global_step"] == 6
    assert (metrics["projection_parameters"] > 0) == (kind == "linformer")
    acc = _events(run)
    assert EXPECTED_SCALARS <= set(acc.Tags()["scalars"])
    # Lightning logs at the 0-based index of the last training batch: validations after steps 3 and 6.
    assert [e.step for e in acc.Scalars("val/loss")] == [2, 5]
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(6))
    hparams, metric_tags = _hparams(run)
    assert hparams["model.attention.kind"].string_value == kind
    if kind == "linformer":
        assert hparams["model.attention.options.k"].number_value == 8
    else:  # full attention has no options: the base file's Linformer k is not carried over
        assert not any(name.startswith("model.attention.options") for name in hparams)
    assert {"hp/val_loss", "hp/val_ppl"} <= metric_tags


def test_resume_continues_the_step_count(tiny_overrides, tmp_path):
    args = ["train", str(tiny_overrides.config), *tiny_overrides.args]
    assert cli.main(args) == 0
    assert cli.main(args + ["trainer.max_steps=9", "resume=true"]) == 0
    run = tmp_path / "runs" / "tiny" / "version_0"
    assert not (tmp_path / "runs" / "tiny" / "version_1").exists()
    assert json.loads((run / "metrics.json").read_text())["global_step"] == 9
    steps = sorted(e.step for e in _events(run).Scalars("val/loss"))
    assert steps == [2, 5, 8]
    assert sorted(e.step for e in _events(run).Scalars("train/loss")) == list(range(9))
    # A second run without resume gets its own directory.
    assert cli.main(args) == 0
    assert (tmp_path / "runs" / "tiny" / "version_1" / "metrics.json").is_file()


def test_training_scalars_are_written_every_n_steps_across_a_resume(tiny_overrides, tmp_path):
    """train/* are logged only at the steps the trainer writes (lightning_modules/step_logs.py): every
    log_every_n_steps-th step, counted across a resume as Lightning counts them, each holding that step's value."""
    args = ["train", str(tiny_overrides.config), *tiny_overrides.args, "trainer.log_every_n_steps=4"]
    assert cli.main(args) == 0
    assert cli.main(args + ["trainer.max_steps=9", "resume=true"]) == 0
    acc = _events(tmp_path / "runs" / "tiny" / "version_0")
    for tag in ("train/loss", "train/ppl", "train/lr", "perf/step_time_s"):  # two events files, read in name order
        assert sorted(e.step for e in acc.Scalars(tag)) == [3, 7], tag
    for loss, ppl in zip(acc.Scalars("train/loss"), acc.Scalars("train/ppl")):
        assert ppl.value == pytest.approx(math.exp(loss.value), rel=1e-5)


def test_check_counts_the_parameters_of_the_recall_model_it_will_build(tmp_path):
    from training import config as run_config
    from training.train import build_datamodule, build_module, check_parameters

    cfg = run_config.load(
        REPO / "experiments" / "configs" / "mqar.yaml", ["data.mqar.n_train=64", "data.mqar.n_val=32"]
    )
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert check_parameters(cfg) == (build_module(cfg, datamodule).n_parameters, True)


CONFIG_FILES = sorted((REPO / "experiments" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.stem for p in CONFIG_FILES])
def test_every_shipped_config_answers_on_a_cpu_in_minutes_or_says_at_its_top_that_it_needs_a_gpu(path):
    """A CPU config is the size of the bases measured to learn in about a minute a run (bytes_mlm: n = 32, d = 64,
    600 steps; mqar: n = 24, d = 32, 1,500 steps); a GPU one opens with "Needs a GPU" and says so in its run."""
    from training import config as run_config
    from training.train import check_parameters, gpu_note

    cfg = run_config.load(path, ["trainer.accelerator=cpu"])
    if cfg.answers_on == "gpu":
        assert path.read_text().startswith("# Needs a GPU:"), path.name
        assert "needs a GPU" in gpu_note(cfg)
    else:
        assert gpu_note(cfg) is None
        assert cfg.model.max_len <= 32 and cfg.model.d_model <= 64 and cfg.trainer.max_steps <= 1500, path.name
        assert check_parameters(cfg)[0] < 200_000, path.name
