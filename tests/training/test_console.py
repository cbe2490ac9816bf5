"""What a user sees of a run (training/console.py): its last lines (objective, no-context level, gain), a console
without third-party noise, a progress bar in any terminal, plain lines without one, and TensorBoard's HPARAMS
carrying the answer. The answer's own words are ``test_answer.py``'s."""

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
from tiny import REPO, TINY_MODEL, child_env, run_of

from experiments import cli

BYTES = REPO / "experiments" / "configs" / "bytes_mlm.yaml"

# Third-party lines: Lightning's advert, advice and warnings, torch's deprecations, the datasets library's bars.
NOISE = (
    "💡",
    "litlogger",
    "_pytree",
    "LeafSpec",
    "weights_only",
    "v_num",
    "Warning",
    "Tensor Cores",
    "GPU available but not used",
    "GPU available: False",
    "TPU available",
    "`Trainer.fit` stopped",
    "on_before_batch_transfer",
    "Generating train split",
    "Map:",
    "Filter:",
)


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
    """The output of ``linformer-lab train ARGS`` run in a pseudo-terminal that reports 0 columns and 0 rows, with a
    Hugging Face cache of its own (the corpus is prepared, as by a first run on a machine: the datasets library's
    bars would show)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    hf = cwd / "hf"
    env = child_env(COLUMNS="0", LINES="0", HF_HOME=str(hf), HF_DATASETS_CACHE=str(hf / "datasets"))
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
    run = run_of(tmp_path / "runs" / "bytes_mlm")
    metrics = json.loads((run / "metrics.json").read_text())
    value, level = metrics["val/masked_loss"], metrics["baselines"]["unigram/masked_loss"]
    tail, link = lines[-5:-1], lines[-1]  # the last: the address that opens on the sample curve, unsmoothed
    assert (
        link.startswith("  then open http://127.0.0.1:6006/?smoothing=0&pinnedCards=")
        and "val_sample/masked_loss" in link
    )
    # Six steps of a tiny model leave nothing learned: the run says so in words.
    assert tail[0].startswith(f"val/masked_loss {value:.4f} (the objective)"), tail
    assert f"no context {level:.4f} (baselines/unigram/masked_loss)" in tail[0]
    assert f"gain {level - value:+.4f} nats" in tail[0]
    assert tail[1].startswith("this run did not leave the no-context level"), tail
    assert tail[2:] == [
        f"run directory: {run}",
        f"tensorboard --logdir {tmp_path / 'runs' / 'bytes_mlm'} --host 127.0.0.1",
    ]


def test_without_a_terminal_progress_is_plain_lines_and_hparams_carry_the_objective_and_gain(tmp_path, capsys):
    assert cli.main(["train", *tiny_bytes(tmp_path), "--check"]) == 0
    checked = capsys.readouterr().out
    assert cli.main(["train", *tiny_bytes(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^step 6/6 \(100%\)  validated  train/loss [\d.]+  elapsed \d+:\d\d  left 0:00$", out, re.M)
    assert "it/s" not in out and "v_num" not in out
    run = run_of(tmp_path / "runs" / "bytes_mlm")
    metrics = json.loads((run / "metrics.json").read_text())
    # --check counts the model the run builds: the byte vocabulary (261), not the BPE size of base.yaml
    assert f"mlm, linformer attention, {metrics['parameters']:,} parameters; nothing written" in checked
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    # the experiment config: at the log root, the experiment's folder (whatever folder the run's overrides name)
    root = EventAccumulator(str(tmp_path / "runs" / "bytes_mlm"), size_guidance={"tensors": 0})
    root.Reload()
    content = root.PluginTagToContent("hparams")
    exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    tags = {m.name.tag for m in exp.metric_infos}
    assert {"hp/val_masked_loss", "hp/context_gain", "hp/val_loss"} <= tags
    columns = {h.name for h in exp.hparam_infos}
    assert {"model.attention.kind", "model.attention.options.k", "optim.lr", "seed", "trainer.max_steps"} <= columns
    assert not any(c.startswith(("data.listops", "data.mqar", "data.classify", "trainer.num_nodes")) for c in columns)
    assert len(columns) <= 30
    # every hp/* at the step it validated (3 and 6), the module's hp/val_loss and hp/val_ppl too
    for tag in ("hp/val_masked_loss", "hp/context_gain", "hp/val_loss", "hp/val_ppl"):
        assert [e.step for e in acc.Scalars(tag)] == [3, 6], tag
    last = {t: acc.Scalars(t)[-1].value for t in ("hp/val_masked_loss", "hp/context_gain")}
    assert last["hp/val_masked_loss"] == pytest.approx(metrics["val/masked_loss"], abs=1e-6)
    gain = metrics["baselines"]["unigram/masked_loss"] - metrics["val/masked_loss"]
    assert last["hp/context_gain"] == pytest.approx(gain, abs=1e-6)


def lightning_console(monkeypatch, caplog, gpu: bool, quiet: bool, say) -> tuple[list[str], list[str]]:
    """What a CPU Trainer's creation and ``say()`` warn and log, on a machine with a GPU or without one (faked), with
    the lab's filters (``quiet``) or without them (the filters a run in this process installed are restored after)."""
    import logging
    import warnings

    import lightning as L
    from lightning.pytorch.accelerators import CUDAAccelerator

    from training.console import RANK_ZERO_LOGGERS, quiet_third_parties

    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: gpu))
    for name in RANK_ZERO_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    caplog.clear()
    with warnings.catch_warnings(record=True) as shown, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        quiet and quiet_third_parties()
        L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
        say()
    return [str(w.message) for w in shown], [r.getMessage() for r in caplog.records]


def test_lightnings_advice_on_a_gpu_machine_stays_off_the_console_and_its_device_line_stays(monkeypatch, caplog):
    """On a machine with a GPU (faked): a run that chose the CPU gets no "GPU available but not used" warning, and
    the Tensor-Cores advice that Lightning logs before a spawned rank's callbacks set the precision is not shown;
    the line that says which device is used is."""
    from lightning.fabric.utilities import rank_zero

    advice = (
        "You are using a CUDA device ('NVIDIA H200') that has Tensor Cores. To properly utilize them, you should set "
        "`torch.set_float32_matmul_precision('medium' | 'high')` which will trade-off precision for performance."
    )

    def console(quiet: bool) -> tuple[list[str], list[str]]:
        return lightning_console(monkeypatch, caplog, True, quiet, lambda: rank_zero.rank_zero_info(advice))

    warned, logged = console(quiet=False)  # the control: Lightning's own console says both
    assert any("GPU available but not used" in w for w in warned) and advice in logged
    warned, logged = console(quiet=True)
    assert not any("GPU available but not used" in w for w in warned) and advice not in logged
    assert "GPU available: True (cuda), used: False" in logged


@pytest.mark.processes  # two `linformer-lab train` processes
def test_a_first_run_on_a_machine_shows_none_of_the_datasets_librarys_bars_unless_the_user_asks(tmp_path):
    """Preparing a corpus for the first time (an empty Hugging Face cache), the datasets library draws "Generating
    train split", "Map" and "Filter" bars; a run switches them off, unless HF_DATASETS_DISABLE_PROGRESS_BARS says
    otherwise (the datasets library's own switch: the user's setting wins)."""

    def console(run: str, **setting: str) -> str:
        hf = tmp_path / run / "hf"  # a machine's first run: nothing prepared yet
        env = child_env(HF_HOME=str(hf), HF_DATASETS_CACHE=str(hf / "datasets"))
        env.pop("HF_DATASETS_DISABLE_PROGRESS_BARS", None)
        args = [*tiny_bytes(tmp_path / run), "trainer.max_steps=1", "trainer.val_check_interval=1"]
        done = subprocess.run(
            [sys.executable, "-m", "experiments.cli", "train", *args],
            cwd=tmp_path,
            env={**env, **setting},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout + done.stderr

    quiet = console("quiet")
    assert not [w for w in ("Generating train split", "Map:", "Filter:") if w in quiet], quiet[-2000:]
    asked = console("asked", HF_DATASETS_DISABLE_PROGRESS_BARS="0")
    assert "Generating train split" in asked and "Map:" in asked  # the control: the bars this test looks for


def test_the_lines_lightning_prints_that_the_lab_decided_stay_off_the_console(monkeypatch, caplog):
    """Each filter of training/console.py, against Lightning's own words: on a machine without a GPU or TPU, the
    lines that say so; "`Trainer.fit` stopped: `max_steps=N` reached."; the warning that the module overrides
    ``on_before_batch_transfer`` while a data module is passed (what the lab's language models do on purpose)."""
    from lightning.fabric.utilities import rank_zero
    from lightning.pytorch.utilities.rank_zero import rank_zero_warn

    hook = (
        "You have overridden `on_before_batch_transfer` in `LightningModule` but have passed in a "
        "`LightningDataModule`. It will use the implementation from `LightningModule` instance."
    )

    def say() -> None:
        rank_zero.rank_zero_info("`Trainer.fit` stopped: `max_steps=6` reached.")
        rank_zero_warn(hook)

    def console(quiet: bool) -> tuple[list[str], list[str]]:
        return lightning_console(monkeypatch, caplog, False, quiet, say)

    warned, logged = console(quiet=False)  # the control: Lightning's own console says all of them
    assert hook in warned
    assert {"GPU available: False, used: False", "`Trainer.fit` stopped: `max_steps=6` reached."} <= set(logged)
    assert any(line.startswith("TPU available: False") for line in logged)
    warned, logged = console(quiet=True)
    assert hook not in warned
    assert not [line for line in logged if line.startswith(("GPU available", "TPU available", "`Trainer.fit`"))]
