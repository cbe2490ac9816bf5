"""Crash-safe runs: a run killed with SIGKILL and resumed ends exactly like one never interrupted.

The kill is real (a `linformer-lab train` subprocess); the comparison is on CPU in deterministic mode with one
thread per process, where the same computation gives the same floats.
"""

import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path

import lightning as L
import optuna
import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter
from torch.utils.data import TensorDataset

from datamodules.sampling import EpochShuffle, ResumableLoader
from experiments import cli
from foundation.checkpoint import AtomicCheckpointIO, read_checkpoint
from foundation.errors import ConfigError
from foundation.rundir import CHECKPOINT
from sweeps import stored
from sweeps.run import storage
from sweeps.spec.study import load_study
from training import config as run_config
from training.resume import LastCheckpoint
from training.train import train

TOLERANCE = 1e-6


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar event of every event file in ``run_dir``, as (step, value) lists per tag, raw: no
    de-duplication or purging such as TensorBoard's reader may apply."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in LegacyEventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def launch(args: list[str]) -> subprocess.Popen:
    script = Path(sys.executable).with_name("linformer-lab")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "experiments.cli"]
    return subprocess.Popen([*command, "train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_after_first_checkpoint(args: list[str], run_dir: Path) -> int:
    """Start a run, SIGKILL it as soon as its first checkpoint exists, return its exit status."""
    proc = launch(args)
    ckpt, deadline = run_dir / CHECKPOINT, time.monotonic() + 300
    try:
        while not ckpt.is_file():
            if proc.poll() is not None:
                pytest.fail(f"the run ended before its first checkpoint: {proc.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


def append_scalars(path: Path, tag: str, steps: range, value: float) -> None:
    """Append scalar events to a TensorBoard event file, as a process killed before its next checkpoint
    leaves them (whether they reach the disk depends on when its writer flushed)."""
    with open(path, "ab") as fh:
        writer = RecordWriter(fh)
        for step in steps:
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
            writer.write(Event(wall_time=time.time(), step=step, summary=summary).SerializeToString())


@pytest.fixture
def one_thread():
    """Same floats in every process: one intra-op thread (the test process's setting is restored)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def assert_same_curves(resumed_curves: dict, reference_curves: dict) -> None:
    """Every TensorBoard tag of a resumed run at the uninterrupted run's steps, none duplicated or missing, with its
    values (timings aside)."""
    assert resumed_curves.keys() == reference_curves.keys()
    for tag, points in reference_curves.items():
        if tag == "val/ppl_vs_wallclock":  # its x axis is seconds, not steps: one point per validation
            assert len(resumed_curves[tag]) == len(points)
            continue
        # ("epoch" is logged with the training and the validation metrics: twice at validation steps)
        extra = Counter(step for step, _ in resumed_curves[tag]) - Counter(step for step, _ in points)
        missing = Counter(step for step, _ in points) - Counter(step for step, _ in resumed_curves[tag])
        assert not extra and not missing, f"{tag}: duplicated {sorted(extra)}, missing {sorted(missing)}"
        if not tag.startswith("perf/"):  # perf/* are timings
            resumed_values = [v for _, v in sorted(resumed_curves[tag])]  # hp/*: a NaN placeholder at step 0
            assert resumed_values == pytest.approx([v for _, v in sorted(points)], abs=TOLERANCE, nan_ok=True), tag


@pytest.mark.processes
def test_a_run_killed_mid_training_resumes_to_the_same_weights_metrics_and_curves(tiny_overrides, tmp_path, one_thread):
    # 130 training blocks of 32 tokens in batches of 16: 9 batches an epoch. Checkpoints after the validations
    # at steps 4, 8, 12: the kill lands mid-epoch 0 and the resumed run crosses into epoch 1.
    args = [
        str(tiny_overrides.config),
        *tiny_overrides.args,
        "data.max_texts=8",
        "data.batch_size=16",
        "trainer.max_steps=12",
        "trainer.val_check_interval=4",
        "trainer.deterministic=true",
        "trainer.cpu_threads=1",
    ]
    killed, straight = tmp_path / "killed", tmp_path / "straight"

    assert kill_after_first_checkpoint([*args, f"run_dir={killed}"], killed) == -signal.SIGKILL
    assert not (killed / "metrics.json").exists()
    saved_at = read_checkpoint(killed / CHECKPOINT)["global_step"]
    assert saved_at in (4, 8)
    # What the killed process may have logged after its checkpoint (0-based steps saved_at, ...), and the event
    # file of a later attempt killed before its first checkpoint: the resumed run must drop both.
    events = max(killed.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns)  # training's file
    append_scalars(events, "train/loss", range(saved_at, saved_at + 3), 999.0)
    append_scalars(killed / "events.out.tfevents.0.stray", "val/loss", range(saved_at + 3, saved_at + 4), 999.0)

    assert cli.main(["train", *args, f"run_dir={killed}", "resume=true"]) == 0
    assert cli.main(["train", *args, f"run_dir={straight}"]) == 0

    resumed, reference = (read_checkpoint(d / CHECKPOINT) for d in (killed, straight))
    assert resumed["global_step"] == reference["global_step"] == 12
    assert resumed["state_dict"].keys() == reference["state_dict"].keys()
    error = max(
        (resumed["state_dict"][k] - reference["state_dict"][k]).abs().max().item() for k in reference["state_dict"]
    )
    assert error <= TOLERANCE, f"max |resumed - uninterrupted| weight difference {error:.3g}"

    resumed_metrics, reference_metrics = (json.loads((d / "metrics.json").read_text()) for d in (killed, straight))
    for key in ("val/loss", "val/ppl", "val/accuracy", "tokens", "global_step"):
        assert resumed_metrics[key] == pytest.approx(reference_metrics[key], abs=TOLERANCE), key

    assert_same_curves(scalars(killed), scalars(straight))

    # A truncated checkpoint: one line and exit code 2 on resume, and the run directory left as it was.
    data = (killed / CHECKPOINT).read_bytes()
    (killed / CHECKPOINT).write_bytes(data[: len(data) // 2])
    before = {p: p.stat().st_mtime_ns for p in killed.rglob("*")}
    assert cli.main(["train", *args, f"run_dir={killed}", "resume=true"]) == 2
    assert {p: p.stat().st_mtime_ns for p in killed.rglob("*")} == before


class Crash(Exception):
    """What the crashing callback raises."""


class CrashAt(L.Callback):
    """Stops a run with an exception at the start of a step (after a checkpoint, before the next)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise Crash(f"crashed at step {self.step}")


class RecordLabels(L.Callback):
    """The MLM labels (where the masks fell) of every training step, by global step."""

    def __init__(self) -> None:
        self.labels: dict[int, torch.Tensor] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.labels[trainer.global_step] = batch["labels"].clone()


@pytest.mark.processes  # the loader's worker processes
def test_a_run_resumed_with_loader_workers_draws_the_masks_of_the_uninterrupted_run(
    tiny_overrides, tmp_path, one_thread
):
    """With data.num_workers=2 the loader's workers restart on resume; the MLM masks must not restart with
    their RNG: every batch after the resume is masked as in the run that was never interrupted."""
    args = [
        *tiny_overrides.args,
        "data.num_workers=2",
        "trainer.max_steps=8",
        "trainer.val_check_interval=4",
        "trainer.deterministic=true",
        "trainer.cpu_threads=1",
    ]
    config = lambda *more: run_config.load(tiny_overrides.config, [*args, *more])  # noqa: E731
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    reference, resumed = RecordLabels(), RecordLabels()
    train(config(f"run_dir={straight}"), callbacks=[reference])
    with pytest.raises(Crash):
        train(config(f"run_dir={killed}"), callbacks=[CrashAt(6)])
    assert read_checkpoint(killed / CHECKPOINT)["global_step"] == 4
    train(config(f"run_dir={killed}", "resume=true"), callbacks=[resumed])

    assert sorted(resumed.labels) == [4, 5, 6, 7]
    for step, labels in resumed.labels.items():
        assert torch.equal(labels, reference.labels[step]), f"the masks of step {step} differ after the resume"
    ours, theirs = (read_checkpoint(d / CHECKPOINT)["state_dict"] for d in (killed, straight))
    error = max((ours[k] - theirs[k]).abs().max().item() for k in theirs)
    assert error <= TOLERANCE, f"max |resumed - uninterrupted| weight difference {error:.3g}"


def _die_while_saving(path: Path) -> None:
    """Child process: start overwriting ``path`` with a new checkpoint and get SIGKILLed half-way."""

    def dying_save(obj, fh):
        fh.write(b"PK\x03\x04 half a zip archive")
        fh.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = dying_save
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)


@pytest.mark.processes
def test_a_kill_during_a_checkpoint_save_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.arange(3.0)}, "global_step": 4}, path)
    child = multiprocessing.get_context("fork").Process(target=_die_while_saving, args=(path,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    state = read_checkpoint(path)
    assert state["global_step"] == 4 and torch.equal(state["state_dict"]["w"], torch.arange(3.0))
    # The killed writer's temporary file is removed by the next save.
    assert any(p.name.endswith(".tmp") for p in path.parent.iterdir())
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 8}, path)
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]
    assert read_checkpoint(path)["global_step"] == 8


def _batches(loader: ResumableLoader, epoch: int, limit: int | None = None) -> list[list[int]]:
    loader.sampler.set_epoch(epoch)
    out = []
    for batch in loader:
        out.append(batch[0].tolist())
        if limit is not None and len(out) == limit:
            break
    return out


@pytest.mark.parametrize("stop_after", [0, 2, 4])  # 4 batches an epoch: 4 is the epoch's end
def test_a_resumed_loader_hands_out_exactly_the_remaining_batches(stop_after):
    dataset = TensorDataset(torch.arange(10))

    def make():
        return ResumableLoader(
            dataset, EpochShuffle(dataset, seed=3), batch_size=3, generator=torch.Generator().manual_seed(3)
        )

    uninterrupted = make()
    reference = _batches(uninterrupted, 0) + _batches(uninterrupted, 1)
    assert sorted(sum(reference[:4], [])) == list(range(10)) and reference[:4] != reference[4:]

    first = make()
    seen = _batches(first, 0, limit=stop_after) if stop_after else []
    state = first.state_dict()
    assert state == {"epoch": 0, "batches": stop_after}
    second = make()
    second.load_state_dict(state)
    rest = _batches(second, 0) + _batches(second, 1)
    assert seen + rest == reference


def test_a_failing_rename_or_sync_during_a_save_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.arange(3.0)}, "global_step": 4}, path)
    for target in ("replace", "fsync"):

        def fail(*args, _target=target, **kwargs):
            raise OSError(f"injected {_target} failure")

        with monkeypatch.context() as patch:
            patch.setattr(os, target, fail)
            with pytest.raises(OSError, match=f"injected {target} failure"):
                AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 8}, path)
        state = read_checkpoint(path)
        assert state["global_step"] == 4 and torch.equal(state["state_dict"]["w"], torch.arange(3.0))
        assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # the temporary is gone too


def _finished_run(tiny_overrides, run_dir: Path) -> dict:
    args = [str(tiny_overrides.config), *tiny_overrides.args, f"run_dir={run_dir}"]
    assert cli.main(["train", *args]) == 0
    return json.loads((run_dir / "metrics.json").read_text())


def test_resuming_a_finished_run_is_a_no_op_that_says_so(tiny_overrides, tmp_path, capsys):
    run_dir = tmp_path / "finished"
    recorded = _finished_run(tiny_overrides, run_dir)
    before = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*")}
    capsys.readouterr()
    assert (
        cli.main(["train", str(tiny_overrides.config), *tiny_overrides.args, f"run_dir={run_dir}", "resume=true"]) == 0
    )
    assert "already finished at step 6" in capsys.readouterr().out
    assert {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*")} == before
    assert json.loads((run_dir / "metrics.json").read_text()) == recorded
    assert any(k.startswith("val/") for k in recorded)


def test_a_run_killed_after_its_final_checkpoint_resumes_to_the_same_metrics(tiny_overrides, tmp_path):
    run_dir = tmp_path / "killed_at_the_end"
    recorded = _finished_run(tiny_overrides, run_dir)
    (run_dir / "metrics.json").unlink()  # what a kill between the last checkpoint and metrics.json leaves
    assert (
        cli.main(["train", str(tiny_overrides.config), *tiny_overrides.args, f"run_dir={run_dir}", "resume=true"]) == 0
    )
    again = json.loads((run_dir / "metrics.json").read_text())
    same = ("global_step", "tokens", "train_time_s", "parameters", "val/loss", "val/ppl", "val/accuracy")
    for key in same:
        assert again[key] == pytest.approx(recorded[key], rel=1e-6, abs=1e-9), key
    assert again["ppl_vs_wallclock"] == recorded["ppl_vs_wallclock"]


def test_training_a_finished_run_further_keeps_its_earlier_metrics(tiny_overrides, tmp_path):
    run_dir = tmp_path / "extended"
    recorded = _finished_run(tiny_overrides, run_dir)
    assert (
        cli.main(
            [
                "train",
                str(tiny_overrides.config),
                *tiny_overrides.args,
                f"run_dir={run_dir}",
                "resume=true",
                "trainer.max_steps=9",
            ]
        )
        == 0
    )
    assert json.loads((run_dir / "metrics.step_6.json").read_text()) == recorded
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 9


# --------------------------------------------------------------------------------------- owners and endings
def long_run(tiny_overrides, run_dir: Path) -> list[str]:
    return [
        str(tiny_overrides.config),
        *tiny_overrides.args,
        "trainer.max_steps=100000",
        "trainer.val_check_interval=2",
        "trainer.cpu_threads=1",
        f"run_dir={run_dir}",
    ]


class Preempted(LastCheckpoint):
    """``last.ckpt`` as in every run, and a SIGTERM to this process after the step past its first save: what a
    scheduler's preemption does, at a known step."""

    first_saved = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.first_saved is not None and trainer.global_step == self.first_saved + 1:
            os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler, installed for the fit, takes it

    def _save(self, trainer):
        super()._save(trainer)
        self.first_saved = self.first_saved or trainer.global_step


def test_sigterm_saves_a_resumable_checkpoint_and_exits_143(tiny_overrides, tmp_path, monkeypatch, capsys):
    """In this process, as the command runs it (a real process under DDP: tests/training/test_ddp.py, -m slow)."""
    run_dir = tmp_path / "preempted"
    args = long_run(tiny_overrides, run_dir)
    monkeypatch.setattr("training.train.LastCheckpoint", Preempted)
    assert cli.main(["train", *args]) == 143
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("terminated: ")], err[-2000:]
    assert "Traceback" not in err
    assert not (run_dir / "metrics.json").exists()  # an unfinished run does not look finished
    saved = read_checkpoint(run_dir / CHECKPOINT)["global_step"]
    assert saved == 3  # the step it reached (one past the validation at step 2), not only the last validation's
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # this process's own handler is back
    # It resumes from there and finishes.
    monkeypatch.setattr("training.train.LastCheckpoint", LastCheckpoint)
    resumed = [a for a in args if a != "trainer.max_steps=100000"]
    assert cli.main(["train", *resumed, f"trainer.max_steps={saved + 2}", "resume=true"]) == 0
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == saved + 2


class CtrlC(L.Callback):
    """What Python's SIGINT handler does: KeyboardInterrupt in the middle of a training step."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 2:
            raise KeyboardInterrupt


def test_ctrl_c_inside_training_is_an_interrupt_exit_130_not_lightnings_exit_1(tiny_overrides, tmp_path, monkeypatch):
    cfg = run_config.load(tiny_overrides.config, [*tiny_overrides.args, f"run_dir={tmp_path / 'r'}"])
    with pytest.raises(KeyboardInterrupt):  # Lightning turns it into sys.exit(1); train() turns it back
        train(cfg, callbacks=[CtrlC()])
    assert not (tmp_path / "r" / "metrics.json").exists()

    def interrupted(cfg, **log):
        raise KeyboardInterrupt

    monkeypatch.setattr("training.train.train", interrupted)
    assert cli.main(["train", str(tiny_overrides.config), *tiny_overrides.args]) == 130


HOLD = "import sys, time; from foundation.lock import Owner; o = Owner(sys.argv[1]); o.record(); print(1, flush=True); time.sleep(300)"


@pytest.mark.processes
def test_a_second_process_on_an_owned_run_gets_one_line_naming_the_owner(tiny_overrides, tmp_path, capsys):
    run_dir = tmp_path / "owned"
    _finished_run(tiny_overrides, run_dir)
    before = {str(p): p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"1"
        capsys.readouterr()
        args = [str(tiny_overrides.config), *tiny_overrides.args, f"run_dir={run_dir}", "resume=true"]
        assert cli.main(["train", *args, "trainer.max_steps=9"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and len(err.splitlines()) == 1
        assert f"in use by pid {holder.pid} on " in err
    finally:
        holder.kill()  # the operating system releases a dead owner's lock
        holder.wait()
        holder.stdout.close()
    assert {str(p): p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.name != ".lock"} == {
        k: v for k, v in before.items() if not k.endswith(".lock")
    }
    assert cli.main(["train", *args, "trainer.max_steps=9"]) == 0


# --------------------------------------------------------------------------------------- studies
def study_file(tmp_path: Path, tiny_overrides, name: str, seeds: tuple = (0, 1), **overrides) -> Path:
    base = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in tiny_overrides.args)}
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "study": name,
                "base": str(tiny_overrides.config),
                "overrides": {**base, **overrides},
                "space": {"seed": {"type": "categorical", "choices": list(seeds)}},
                "sampler": {"kind": "grid"},
            }
        )
    )
    return path


def test_a_torn_journal_line_is_cut_before_the_next_append_and_a_garbage_line_is_refused(
    tmp_path, tiny_overrides, capsys
):
    study = load_study(study_file(tmp_path, tiny_overrides, "torn"))
    ostudy = optuna.create_study(study_name=study.name, storage=stored.open_storage(study, None))
    ostudy.enqueue_trial({"seed": 0})
    journal = study.root / stored.JOURNAL
    whole = journal.read_bytes()
    with open(journal, "ab") as fh:  # what an append killed half-way leaves
        fh.write(b'{"op_code": 5, "worker_id": "dead", "trial_id": 0, "par')

    # A reader (report) tolerates the torn line and changes nothing; the owner (sweep) cuts it, saying so.
    reread = optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None, create=False))
    assert len(reread.trials) == 1 and journal.read_bytes().startswith(whole) and len(journal.read_bytes()) > len(whole)
    capsys.readouterr()
    with storage.RunStorage(study, None).own():
        assert journal.read_bytes() == whole
    assert "removed a torn last line (55 bytes)" in capsys.readouterr().err

    # A writer killed while others go on: the next append first cuts the torn line, under Optuna's lock.
    with open(journal, "ab") as fh:
        fh.write(b'{"op_code": 5, "wor')
    ostudy = optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None))
    ostudy.enqueue_trial({"seed": 1})
    lines = journal.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(line) for line in lines[:-1])
    assert len(optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None)).trials) == 2

    # A line that is not a record, before the last one: refused in one line, by readers and owners alike.
    journal.write_bytes(whole + b"garbage\n" + whole)
    for open_it in (lambda: stored.open_storage(study, None), lambda: storage.RunStorage(study, None).own()):
        with pytest.raises(ConfigError, match=r"journal.log: line \d+ of \d+ is not a journal record"):
            open_it()


@pytest.mark.processes
def test_a_second_sweep_of_a_study_gets_one_line_naming_its_owner(tmp_path, tiny_overrides, capsys):
    path = study_file(tmp_path, tiny_overrides, "owned_study")
    study = load_study(path)
    study.root.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(study.root)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"1"
        capsys.readouterr()
        assert cli.main(["sweep", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: study owned_study") and f"in use by pid {holder.pid} on " in err
        assert len(err.splitlines()) == 1
        assert sorted(p.name for p in study.root.iterdir()) == [".lock"]  # no journal: nothing was written
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="needs a machine without a CUDA GPU")
def test_a_sweep_asking_for_a_gpu_this_machine_lacks_is_refused_before_any_write(tmp_path, tiny, capsys):
    path = study_file(tmp_path, tiny, "gpuless", [0], **{"trainer.accelerator": "gpu"})
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trainer.accelerator: 'gpu' but this machine has no usable CUDA GPU" in err[0]
    assert not load_study(path).root.exists()  # no journal, no lock, no folder: nothing was written
    assert cli.main(["sweep", str(path), "--check"]) == 0  # a GPU study is still validated on a CPU machine


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="needs a machine without a CUDA GPU")
@pytest.mark.processes  # the sweep command's worker
def test_a_sweep_whose_trials_fail_on_an_input_error_stops_uncounted_and_puts_them_back_for_the_rerun(
    tmp_path, tiny, capsys, monkeypatch
):
    path = study_file(tmp_path, tiny, "gpuless", [0], **{"trainer.accelerator": "gpu"})
    # An input error only a trial meets: the parent's machine check, which refuses this one before any write
    # (the test below), is switched off, so the worker's run meets it.
    monkeypatch.setattr("sweeps.run.command.check_machine", lambda cfg: None)
    assert cli.main(["sweep", str(path)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.match(r"error: the sweep stopped: trial \d+ of gpuless failed on an input error", last), last
    assert "no usable CUDA GPU" in last
    study = load_study(path)
    trials = optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None)).trials
    # The failed trial is put back, not counted: the same command after the fix runs its copy, waiting here.
    assert storage.budget_state(trials, study).finished == 0
    waiting = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert [t.system_attrs["fixed_params"] for t in waiting] == [{"seed": 0}]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="needs a machine without a CUDA GPU")
@pytest.mark.processes  # the sweep command's worker
def test_the_same_sweep_after_the_fix_runs_the_study_the_machine_check_refused(tmp_path, tiny, capsys):
    # The accelerator is part of the study's identity (CPU and GPU numbers differ), so a wrong one must be
    # refused before the study exists: then the same command after the fix starts it.
    path = study_file(tmp_path, tiny, "gpuless", [0], **{"trainer.accelerator": "gpu"})
    assert cli.main(["sweep", str(path)]) == 2
    study_file(tmp_path, tiny, "gpuless", [0], **{"trainer.accelerator": "cpu"})  # the fix
    assert cli.main(["sweep", str(path)]) == 0
    study = load_study(path)
    trials = optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None)).trials
    assert [t.params["seed"] for t in trials if t.state == optuna.trial.TrialState.COMPLETE] == [0]
    assert storage.budget_state(trials, study).finished == 1


def test_a_grid_budget_counts_its_points_not_its_trials(tmp_path, tiny_overrides):
    study = load_study(study_file(tmp_path, tiny_overrides, "points", (0, 1, 2)))
    dist = {"seed": optuna.distributions.CategoricalDistribution([0, 1, 2, 5])}
    trials = [optuna.trial.create_trial(params={"seed": seed}, distributions=dist, value=1.0) for seed in (0, 1, 1, 5)]
    for number, t in enumerate(trials):
        t.number = number
    # Four finished trials, but only points 0 and 1 of the grid ran: seed 5 is no point of it (the file changed).
    assert storage.budget_state(trials).finished == 4
    assert storage.budget_state(trials, study).finished == 2


def test_a_study_whose_space_changed_is_refused_and_new_study_sets_the_earlier_aside(tmp_path, tiny_overrides, capsys):
    from sweeps.run.command import check_stored, open_study
    from sweeps.run.storage import RunStorage

    path = study_file(tmp_path, tiny_overrides, "moving", (0, 1))
    started = load_study(path)
    open_study(RunStorage(started, None))
    check_stored(started, None)  # the same file: accepted
    study_file(tmp_path, tiny_overrides, "moving", (0, 1, 2))  # more seeds: replicates, not another question
    check_stored(load_study(path), None)

    text = yaml.safe_load(path.read_text())
    text["space"]["optim.lr"] = {"type": "categorical", "choices": [0.001, 0.002]}
    path.write_text(yaml.safe_dump(text))
    changed = load_study(path)
    with pytest.raises(ConfigError, match=r"was started with another search space: space\.optim\.lr: added here"):
        check_stored(changed, None)
    journal = (started.root / stored.JOURNAL).read_bytes()
    runs = storage.RunStorage(changed, None)
    aside = runs.set_aside(runs.aside_path())
    assert not started.root.exists() and (aside / stored.JOURNAL).read_bytes() == journal  # nothing lost
    check_stored(changed, None)  # a new study
    capsys.readouterr()
    assert cli.main(["sweep", str(path), "--check"]) == 0
    assert "study OK: moving, 6 trial(s)" in capsys.readouterr().out
    assert not started.root.exists()  # --check writes nothing


def test_a_damaged_tokenizer_cache_is_rebuilt_saying_so(tmp_path, capsys):
    from datamodules.config import TokenizerConfig
    from datamodules.tokenizer import bpe_cache_path, build_tokenizer

    texts = [f"review {i}: the film was {'good' if i % 2 else 'bad'} and long" for i in range(200)]
    cfg = types.SimpleNamespace(**vars(TokenizerConfig(vocab_size=300)))
    first = build_tokenizer(cfg, texts, tmp_path)
    cached = bpe_cache_path(cfg, texts, tmp_path)
    cached.write_text(cached.read_text()[:100])  # truncated by a full disk, say
    capsys.readouterr()
    again = build_tokenizer(cfg, texts, tmp_path)
    assert f"{cached}: damaged cache (" in capsys.readouterr().err
    assert again.to_str() == first.to_str() and cached.read_text() == first.to_str()
