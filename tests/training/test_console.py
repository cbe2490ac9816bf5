"""What a user sees: the last lines of a run (objective, no-context level, gain), a console without third-party
noise, a progress bar in any terminal, plain lines without one, and TensorBoard's HPARAMS carrying the answer."""

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tiny import TINY_MODEL

from experiments import cli
from training.answer import Objective, answer_lines, objective_of

REPO = Path(__file__).resolve().parents[1]
BYTES = REPO / "experiments" / "configs" / "bytes_mlm.yaml"
NOISE = ("💡", "litlogger", "_pytree", "LeafSpec", "weights_only", "v_num", "Warning")


def tiny_bytes(tmp_path: Path) -> list[str]:
    """bytes_mlm.yaml shrunk to seconds: the tiny model, 6 steps, 16 validation blocks (all of them scored)."""
    return [
        str(BYTES),
        f"output_dir={tmp_path / 'runs'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *TINY_MODEL,
        "data.max_texts=200",
        "data.batch_size=8",
        "data.max_val_blocks=16",
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "trainer.limit_val_batches=2",
        "trainer.log_every_n_steps=1",
        "trainer.accelerator=cpu",
        "trainer.cpu_threads=1",
        "optim.warmup_steps=2",
    ]


def _in_terminal_of_width_zero(args: list[str], cwd: Path) -> str:
    """The output of ``linformer-lab train ARGS`` run in a pseudo-terminal that reports 0 columns and 0 rows."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "0", "LINES": "0"}
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.cli", "train", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=cwd,
        env=env,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=300) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.processes  # a `linformer-lab train` process
def test_a_run_ends_with_its_objective_and_shows_a_bar_in_a_zero_width_terminal_without_noise(tmp_path):
    out = _in_terminal_of_width_zero(tiny_bytes(tmp_path), tmp_path)
    lines = [line for line in re.split(r"[\r\n]", out) if line.strip()]
    for word in NOISE:
        assert not [line for line in lines if word in line], word
    assert any(re.search(r"Epoch 0: 100%\|█+\| 6/6", line) for line in lines), out[-2000:]
    run = tmp_path / "runs" / "bytes_mlm" / "version_0"
    metrics = json.loads((run / "metrics.json").read_text())
    value, level = metrics["val/masked_loss"], metrics["baselines"]["unigram/masked_loss"]
    tail = lines[-4:]
    # Six steps of a tiny model leave nothing learned: the run says so in words.
    assert tail[0].startswith(f"val/masked_loss {value:.4f} (the objective)"), tail
    assert f"no context {level:.4f} (baselines/unigram/masked_loss)" in tail[0]
    assert f"gain {level - value:+.4f} nats" in tail[0]
    assert tail[1].startswith("this run did not leave the no-context level"), tail
    assert tail[2:] == [f"run directory: {run}", f"tensorboard --logdir {run.parent} --host 127.0.0.1"]


def test_without_a_terminal_progress_is_plain_lines_and_hparams_carry_the_objective_and_gain(tmp_path, capsys):
    assert cli.main(["train", *tiny_bytes(tmp_path), "--check"]) == 0
    checked = capsys.readouterr().out
    assert cli.main(["train", *tiny_bytes(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^step 6/6 \(100%\)  validated  train/loss [\d.]+  elapsed \d+:\d\d  left 0:00$", out, re.M)
    assert "it/s" not in out and "v_num" not in out
    run = tmp_path / "runs" / "bytes_mlm" / "version_0"
    metrics = json.loads((run / "metrics.json").read_text())
    # --check counts the model the run builds: the byte vocabulary (261), not the BPE size of base.yaml
    assert f"mlm, linformer attention, {metrics['parameters']:,} parameters; nothing written" in checked
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    tags = {m.name.tag for m in exp.metric_infos}
    assert {"hp/val_masked_loss", "hp/context_gain", "hp/val_loss"} <= tags
    columns = {h.name for h in exp.hparam_infos}
    assert {"model.attention.kind", "model.attention.options.k", "optim.lr", "seed", "trainer.max_steps"} <= columns
    assert not any(c.startswith(("data.listops", "data.mqar", "data.classify", "trainer.num_nodes")) for c in columns)
    assert len(columns) <= 30
    last = {t: acc.Scalars(t)[-1].value for t in ("hp/val_masked_loss", "hp/context_gain")}
    assert last["hp/val_masked_loss"] == pytest.approx(metrics["val/masked_loss"], abs=1e-6)
    gain = metrics["baselines"]["unigram/masked_loss"] - metrics["val/masked_loss"]
    assert last["hp/context_gain"] == pytest.approx(gain, abs=1e-6)


@pytest.mark.parametrize(
    "task, groups, metric",
    [
        ("mlm", ("masked", "random", "kept"), "val/masked_loss"),
        ("mlm", (), "val/loss"),
        ("clm", (), "val/loss"),
        ("recall", (), "val/accuracy"),
        ("classify", (), "val/accuracy"),
        ("listops", (), "val/accuracy"),
    ],
)
def test_each_task_answers_with_its_studies_objective(task, groups, metric):
    assert objective_of(task, groups).metric == metric


def test_a_loss_gain_is_the_no_context_level_minus_the_loss_and_a_small_one_is_said_in_words():
    metrics = {"val/masked_loss": 2.80, "baselines": {"unigram/masked_loss": 3.09}}
    (line,) = answer_lines(Objective("val/masked_loss"), metrics)
    assert "val/masked_loss 2.8000" in line and "no context 3.0900" in line and "gain +0.2900 nats" in line
    stuck = answer_lines(Objective("val/masked_loss"), {**metrics, "val/masked_loss": 3.06})
    assert len(stuck) == 2 and "did not leave the no-context level" in stuck[1] and "+0.0300" in stuck[1]


def test_classification_stands_beside_the_majority_class():
    metrics = {"val/accuracy": 0.81, "trivial_accuracy": 0.5}
    (line,) = answer_lines(Objective("val/accuracy"), metrics)
    assert "majority class 0.5000 (trivial_accuracy)" in line and "gain +0.3100" in line and "nats" not in line
    stuck = answer_lines(Objective("val/accuracy"), {**metrics, "val/accuracy": 0.51})
    assert "did not leave the no-context level" in stuck[-1]


def test_a_sweep_progress_line_counts_trials_and_projects_the_time_left_at_this_sessions_pace():
    from sweeps.run.command import progress_line

    # 2 trials were done before this command; 3 more finished in 6 minutes: 7 left at 2 min each.
    assert progress_line(5, 12, 2, 360.0) == "progress: 5/12 trials, 6:00 elapsed, about 14:00 left"
    assert progress_line(2, 12, 2, 30.0) == "progress: 2/12 trials, 0:30 elapsed"  # no pace yet
    assert progress_line(4, None, 0, 3700.0) == "progress: 4/∞ trials, 1:01:40 elapsed"


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


def test_a_report_advises_the_gpu_preset_only_where_the_study_file_has_one():
    from types import SimpleNamespace

    from sweeps.report.command import advice_of
    from sweeps.spec.schema import SWEEPS_DIR
    from sweeps.spec.study import load_study

    # the file's presets as the loaded study keeps them (the report does not read the file again)
    assert load_study(SWEEPS_DIR / "k_sweep.yaml").presets == ("cpu", "gpu")
    assert advice_of(SimpleNamespace(presets=("cpu", "gpu"), preset="cpu")) == "run the GPU preset (--preset gpu)"
    assert advice_of(SimpleNamespace(presets=("cpu", "gpu"), preset="gpu")) == "add seeds or training steps"
    assert advice_of(SimpleNamespace(presets=(), preset=None)) == "add seeds or training steps"


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
