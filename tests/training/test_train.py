"""`linformer-lab train` (training/train.py) end to end on a tiny model: run directory, TensorBoard, metrics, resume;
the parameters ``--check`` counts, and every shipped config answers on a CPU in minutes or says that it needs a GPU."""

import json
import math

import lightning as L
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tiny import REPO, run_of

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
    "val_sample/masked_loss",
    "no_context/masked_loss",
}


def _events(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _hparams(run_dir, root):
    """Hyper-parameter names of the HPARAMS plugin's session-start record, and the metric tags of the experiment
    config at the log directory's root (the experiment's folder, whatever folder the run's overrides name)."""
    start = plugin_data_pb2.HParamsPluginData.FromString(
        _events(run_dir).PluginTagToContent("hparams")["_hparams_/session_start_info"]
    )
    root = _events(root).PluginTagToContent("hparams")
    exp = plugin_data_pb2.HParamsPluginData.FromString(root["_hparams_/experiment"])
    return dict(start.session_start_info.hparams), {m.name.tag for m in exp.experiment.metric_infos}


@pytest.mark.parametrize("kind", ["linformer", "full"])
def test_train_writes_run_dir_tensorboard_and_metrics(tiny_overrides, tmp_path, kind):
    assert cli.main(["train", str(tiny_overrides.config), *tiny_overrides.args, f"model.attention.kind={kind}"]) == 0
    run = run_of(tmp_path / "runs" / "tiny")
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ("val/loss", "val/ppl", "parameters", "wall_time_s", "tokens_per_sec", "peak_mem_mb"):
        assert isinstance(metrics[key], (int, float)) and math.isfinite(metrics[key]), key
    assert metrics["global_step"] == 6
    assert (metrics["projection_parameters"] > 0) == (kind == "linformer")
    acc = _events(run)
    assert EXPECTED_SCALARS <= set(acc.Tags()["scalars"]) and "epoch" not in acc.Tags()["scalars"]
    # The fixed validation sample at every step of this 6-step run, the level beside it; no NaN anywhere.
    assert [e.step for e in acc.Scalars("val_sample/masked_loss")] == list(range(1, 7))
    level = metrics["baselines"]["unigram/masked_loss"]
    assert [e.value for e in acc.Scalars("no_context/masked_loss")] == [pytest.approx(level, rel=1e-6)] * 6
    assert not any(math.isnan(e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag))
    # Lightning logs at the 0-based index of the last training batch: validations after steps 3 and 6.
    assert [e.step for e in acc.Scalars("val/loss")] == [2, 5]
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(6))
    hparams, metric_tags = _hparams(run, tmp_path / "runs" / "tiny")
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
    run = run_of(tmp_path / "runs" / "tiny")
    assert not (run.parent / "version_1").exists()
    assert json.loads((run / "metrics.json").read_text())["global_step"] == 9
    steps = sorted(e.step for e in _events(run).Scalars("val/loss"))
    assert steps == [2, 5, 8]
    assert sorted(e.step for e in _events(run).Scalars("train/loss")) == list(range(9))
    # A second run without resume gets its own directory.
    assert cli.main(args) == 0
    assert (run_of(tmp_path / "runs" / "tiny", 1) / "metrics.json").is_file()


def test_training_scalars_are_written_every_n_steps_across_a_resume(tiny_overrides, tmp_path):
    """train/* are logged only at the steps the trainer writes (lightning_modules/step_logs.py): every
    log_every_n_steps-th step, counted across a resume as Lightning counts them, each holding that step's value."""
    args = ["train", str(tiny_overrides.config), *tiny_overrides.args, "trainer.log_every_n_steps=4"]
    assert cli.main(args) == 0
    assert cli.main(args + ["trainer.max_steps=9", "resume=true"]) == 0
    acc = _events(run_of(tmp_path / "runs" / "tiny"))
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
    """A CPU config is the size of the bases measured to learn in minutes a run (bytes_mlm: n = 32, d = 64, 600 steps;
    mqar: n = 24, d = 32, 1,500 steps; bytes_mlm_long: n = 512, d = 64, 1,200 steps of 4,096 tokens, its E/F the bulk
    of its parameters); a GPU one opens with "Needs a GPU" and says so in its run."""
    from training import config as run_config
    from training.train import check_parameters, gpu_note

    cfg = run_config.load(path, ["trainer.accelerator=cpu"])
    if cfg.answers_on == "gpu":
        assert path.read_text().startswith("# Needs a GPU:"), path.name
        assert "needs a GPU" in gpu_note(cfg)
    else:
        assert gpu_note(cfg) is None
        assert cfg.model.max_len <= 512 and cfg.model.d_model <= 64 and cfg.trainer.max_steps <= 1500, path.name
        assert cfg.data.batch_size * cfg.model.max_len * cfg.trainer.max_steps <= 5_000_000, path.name  # tokens
        assert check_parameters(cfg)[0] < (200_000 if cfg.model.max_len <= 32 else 1_500_000), path.name


def test_a_cpu_run_records_its_device_and_why_it_has_no_mfu_and_compiles_nothing_by_default(tiny_overrides, tmp_path):
    assert cli.main(["train", str(tiny_overrides.config), *tiny_overrides.args]) == 0
    metrics = json.loads((run_of(tmp_path / "runs" / "tiny") / "metrics.json").read_text())
    assert metrics["device"] == "cpu" and metrics["compiled"] is False and "mfu" not in metrics
    assert metrics["mfu_unavailable"].startswith("no peak for a CPU")
    assert metrics["warmup_s"] > 0 and metrics["train_time_s"] > 0
    # the throughput of the timed steps: every step but the first (compiling, the FLOP count) of the process
    batch = metrics["tokens"] // metrics["global_step"]
    assert metrics["tokens_per_sec"] == pytest.approx((metrics["tokens"] - batch) / metrics["train_time_s"])


def test_compile_true_compiles_the_encoder_in_place_once_and_its_checkpoint_keeps_the_eager_keys(
    tiny_overrides, tmp_path, monkeypatch
):
    """What is compiled, and how often (torch.compile replaced by a spy that returns the eager function: the
    compiler itself is the slow test below's)."""
    import torch

    from training import config as run_config
    from training.train import build_datamodule, build_module

    compiled = []

    def spy(fn=None, *args, **kwargs):
        compiled.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", spy)
    assert cli.main(["train", str(tiny_overrides.config), *tiny_overrides.args, "trainer.compile=true"]) == 0
    assert [type(fn.__self__).__name__ for fn in compiled] == ["TransformerEncoder"]  # fit and the last validate
    run = run_of(tmp_path / "runs" / "tiny")
    assert json.loads((run / "metrics.json").read_text())["compiled"] is True
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    cfg = run_config.load(tiny_overrides.config, tiny_overrides.args)
    datamodule = build_datamodule(cfg)
    datamodule.setup("fit")
    eager = build_module(cfg, datamodule)
    assert list(state) == list(eager.state_dict())  # no _orig_mod. anywhere
    eager.load_state_dict(state)


class StopAt(L.Callback):
    """Ends a run with an exception at the start of ``step`` (after the checkpoint before it), as a kill would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise KeyboardInterrupt(f"stopped at step {self.step}")


@pytest.mark.slow  # compiles the tiny model in three processes' worth of runs: 1-3 minutes on 2 shared cores
def test_a_compiled_run_resumes_to_the_last_bit_of_an_uninterrupted_one(tiny_overrides, tmp_path):
    """A compiled run with dropout stopped after its checkpoint at step 3 and resumed ends where the run that was
    never stopped ends (the compiled graphs draw their dropout masks from the RNG state the checkpoint restores)."""
    import torch

    from foundation.checkpoint import read_checkpoint
    from foundation.rundir import CHECKPOINT
    from training import config as run_config
    from training.train import train

    args = [*tiny_overrides.args, "trainer.compile=true", "model.dropout=0.1", "trainer.cpu_threads=1"]
    config = lambda *more: run_config.load(tiny_overrides.config, [*args, *more])  # noqa: E731
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    train(config(f"run_dir={straight}"))
    with pytest.raises(KeyboardInterrupt):
        train(config(f"run_dir={cut}"), callbacks=[StopAt(4)])
    assert read_checkpoint(cut / CHECKPOINT)["global_step"] == 3
    train(config(f"run_dir={cut}", "resume=true"))
    ends = [read_checkpoint(d / CHECKPOINT) for d in (straight, cut)]
    assert ends[0]["global_step"] == ends[1]["global_step"] == 6
    for key, value in ends[0]["state_dict"].items():
        assert torch.equal(value, ends[1]["state_dict"][key]), key
    metrics = [json.loads((d / "metrics.json").read_text()) for d in (straight, cut)]
    assert metrics[0]["val/loss"] == metrics[1]["val/loss"] and metrics[0]["compiled"] and metrics[1]["compiled"]
