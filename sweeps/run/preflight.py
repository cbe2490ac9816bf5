"""The preflight of a sweep: every distinct trial shape of a study and its control trains a few optimiser steps on
the device its trials will use, each in a fresh (spawned) process as a trial would, before anything of the study is
written (``sweep STUDY --preflight``; at the start of every sweep unless ``--no-preflight``).

A *shape* is what changes a trial's cost: its config without the keys that do not (:func:`shape_key`: seeds, the
optimiser, the steps and validation interval, names and folders, initialisation scales). Trials that differ only in
those share one measurement. Each shape's process builds the run's data and model with
:mod:`training.train`'s own building blocks (``build_datamodule``, ``build_module_or_refuse``, ``trainer_arguments``,
the ``Accelerate`` callback that compiles), trains :data:`STEPS` steps with the trial's settings (precision, compile,
engine, batch; its FLOP count and throughput callbacks too, which a trial's first step pays) and validates once,
writing nothing (no logger, no run directory; one checkpoint into a temporary folder). It measures:

* ``setup_s``: from the start of the trial's work to its first batch (data prepared, model built, trainer set up);
* ``first_step_s``: the first step, which compiles (``trainer.compile``) and warms the libraries up;
* ``step_s``: seconds per step after :data:`WARMUP` more steps, read in blocks: the shape trains on until the last
  two blocks agree within :data:`AGREE` (the other shapes are idle, each measured in turn; what else the machine
  runs is not), and ``step_noise`` says how far apart they were (``step_agreed``: whether they settled); the time
  between steps included; ``load``: the machine's one-minute load average after it;
* ``short_step_s`` and ``short_steps``, for a run with a length curriculum (``optim.short_steps``): ``step_s`` is then
  timed with the curriculum off (every step at the full length), and its short steps in a second short fit;
* ``validation_s``: one validation pass at the trial's ``trainer.limit_val_batches``; ``checkpoint_s``: one save of
  the trial's checkpoint (a trial saves one after every validation), into a temporary folder;
* ``start_s``: the process's start and its import of the training stack (a sweep worker pays it once);
* ``peak_mb`` against ``total_mb``: on a GPU the allocator's peak (``torch.cuda.max_memory_allocated``) against the
  device's memory; on the CPU the growth of the process's peak resident set (``resource.getrusage``) against the
  machine's physical memory (stated as such: ``memory: "rss"``).

A shape that fails (a compile error, out of memory, a shape or dtype error, a missing package, a process killed) is
one line naming its arm, its setting and the way out (:func:`failure_line`); the command prints one per failed shape
and exits 2 before anything of the study is written. The projection from these numbers: :mod:`sweeps.run.plan`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import lightning as L
from omegaconf import DictConfig, OmegaConf

from foundation.configfile import flatten, to_container
from foundation.errors import ConfigError
from sweeps.spec import budgets
from sweeps.spec.study import Study

STEPS = 10  # optimiser steps a shape trains at least: the first (compile, warm-up), WARMUP more, then the timed ones
WARMUP = 2
# The timed steps are read as consecutive blocks (two at least); a shape trains on, MORE_BLOCKS blocks at most,
# until the seconds per step of its last two blocks agree within AGREE (the machine's other load comes and goes).
AGREE = 0.15
MORE_BLOCKS = 4
TIMEOUT_S = float(os.environ.get("LINFORMER_LAB_PREFLIGHT_TIMEOUT_S", "900"))  # per shape, compile included
# Keys that do not change what a trial costs per step: a trial's seed, the optimiser's numbers, how long it trains
# and how often it validates (the projection multiplies by them), names, folders, initialisation scales.
COST_FREE = ("seed", "experiment", "run_dir", "resume", "output_dir", "init_from", "answers_on", "model.init_std")
COST_FREE_PREFIXES = (
    "optim.",
    "trainer.max_steps",
    "trainer.val_check_interval",
    "trainer.log_every_n_steps",
    "trainer.spectrum_every_n_val",
    "trainer.cpu_threads",
    "model.position_scale",
    "model.attention.options.init",
)
# The settings a failure line names, when the shape has them
NAMED = (
    "model.attention.kind",
    "model.attention.options.k",
    "model.attention.options.engine",
    "model.max_len",
    "model.d_model",
    "model.n_layers",
    "data.batch_size",
    "trainer.precision",
    "trainer.compile",
)


@dataclass
class Shape:
    """One distinct trial shape: its first config (the one measured), the arm it belongs to and every trial of the
    study and its control with this shape, as (study name, params, steps, validations)."""

    key: str
    label: str  # e.g. "random_vs_learned_cpu: projection=random" or "control reference (kind=full)"
    cfg: DictConfig
    trials: list[tuple[str, dict, int, int]] = field(default_factory=list)
    measured: Optional[dict] = None  # what its process measured (see the module docstring)
    failure: Optional[str] = None  # its one line when it failed
    differs: tuple[str, ...] = ()  # the keys beyond NAMED in which the study's shapes differ
    grid: bool = True  # its trials are grid points (else an open study's range ends)

    @property
    def setting(self) -> str:
        flat = flatten(to_container(self.cfg))
        return " ".join(f"{k}={flat[k]}" for k in (*NAMED, *self.differs) if flat.get(k) is not None)


def costly(cfg: DictConfig) -> dict[str, Any]:
    """The config keys that change a trial's cost per step (every key but :data:`COST_FREE` ones), flat."""
    flat = flatten(to_container(cfg))
    return {
        k: v for k, v in flat.items() if k not in COST_FREE and not any(k.startswith(p) for p in COST_FREE_PREFIXES)
    }


def shape_key(cfg: DictConfig) -> str:
    """:func:`costly` as one string."""
    return repr(sorted(costly(cfg).items(), key=lambda kv: kv[0]))


def validations(cfg: DictConfig) -> int:
    """Validation passes of a trial: one every ``val_check_interval`` steps, and one at the end when the last step
    was not one of them (training/train.py's ``_final_scores``)."""
    steps, every = cfg.trainer.max_steps, cfg.trainer.val_check_interval
    return steps // every + (1 if steps % every else 0)


def trial_points(study: Study) -> list[dict]:
    """The params of the trials a study runs: a grid's points up to its budget; an open study's range ends (what its
    validation builds), which stand for its sampled trials."""
    if study.is_grid:
        return list((study.points or [])[: study.n_trials])
    return study.range_ends()


def shapes_of(study: Study) -> list[Shape]:
    """Every distinct trial shape of the study and its control, the control's first, each with its trials (an open
    study's range ends, one each: its sampled trials are projected at their mean, :func:`sweeps.run.plan.project`)."""
    found: dict[str, Shape] = {}
    for s in study.studies:
        for params in trial_points(s):
            cfg = s.config(params)
            key = shape_key(cfg)
            label = _label(s, params)
            shape = found.setdefault(key, Shape(key, label, cfg, grid=s.is_grid))
            work = budgets.work(cfg, s.budgets) if s.budgets else (cfg.trainer.max_steps, validations(cfg))
            shape.trials.append((s.name, params, *work))  # a curve trial: its trunk's and cooldowns' steps
    shapes = list(found.values())
    flats = [costly(shape.cfg) for shape in shapes]
    differs = tuple(
        sorted({k for f in flats for k in f if k not in NAMED and len({repr(g.get(k)) for g in flats}) > 1})
    )
    for shape in shapes:
        shape.differs = differs
    return shapes


def with_trials_of(shapes: list[Shape], study: Study) -> list[Shape]:
    """The measured ``shapes`` holding the trials of ``study`` as it is now: ``--add-seeds`` grows a study after the
    preflight measured the file's grid, and a seed adds trials to a shape, never a shape."""
    now = {s.key: s.trials for s in shapes_of(study)}
    return [replace(s, trials=now.get(s.key, [])) for s in shapes]


def _label(study: Study, params: dict) -> str:
    from sweeps.spec.schema import CONTROL_PARAM

    if study.parent is not None:
        role = params[CONTROL_PARAM]
        bundle = study.spec.space[CONTROL_PARAM].choices[role]
        return f"control {role} ({' '.join(f'{k.rsplit(chr(46), 1)[-1]}={v}' for k, v in bundle.items())})"
    arm = study.arm_label(params) if study.arms else ""
    return f"{study.name}: {arm}" if arm else study.name


# --------------------------------------------------------------------------------------- measuring one shape
def measure(cfg: DictConfig, steps: int = STEPS, threads: int = 0) -> dict[str, Any]:
    """Train ``steps`` steps of ``cfg`` and validate once, in this process, writing nothing; the numbers of the
    module docstring. A length curriculum (``optim.short_steps``) is timed apart: the shape's steps at its full length
    with the curriculum off (``step_s``), then its short steps (``short_step_s``, for its ``short_steps``), so the
    projection prices both phases. Raises what the trial would raise."""
    started = time.perf_counter()
    import torch

    imported = time.perf_counter() - started
    if threads > 0:
        torch.set_num_threads(threads)
    rss_before = _rss_mb()
    short_steps = int(cfg.optim.get("short_steps", 0) or 0)
    full_length = OmegaConf.merge(cfg, {"optim": {"short_steps": 0}}) if short_steps else cfg
    timer, checkpoint_s = _timed_fit(full_length, steps)
    measured = {"import_s": imported, **timer.result(), "checkpoint_s": checkpoint_s, "load": os.getloadavg()[0]}
    measured = {**measured, **_memory(timer.device, rss_before)}
    if short_steps:
        short, _ = _timed_fit(cfg, steps)
        measured = {**measured, "short_step_s": short.result()["step_s"], "short_steps": short_steps}
    return measured


def _timed_fit(cfg: DictConfig, steps: int) -> tuple["StepTimer", float]:
    """A short fit of ``cfg`` timed by a :class:`StepTimer`, one validation, one checkpoint save (its seconds)."""
    from lightning_modules.callbacks import Accelerate, RunMetrics, TrainingFlops, compile_failures
    from training.train import build_datamodule, build_module_or_refuse, compiles, trainer_arguments

    work = time.perf_counter()
    L.seed_everything(cfg.seed, verbose=False)
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")
    module = build_module_or_refuse(cfg, datamodule)
    timer = StepTimer(work, steps)
    arguments = {**trainer_arguments(cfg), "max_steps": timer.cap, "val_check_interval": timer.cap}
    trainer = L.Trainer(
        **arguments,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[Accelerate(compiles(cfg)), RunMetrics(flops := TrainingFlops()), flops, timer],
    )
    with compile_failures(compiles(cfg)):
        trainer.fit(module, datamodule=datamodule)
        if len(timer.validation) < 2:  # stopped once its step times agreed, before the validation at the cap
            trainer.validate(module, datamodule=datamodule, verbose=False)
    with tempfile.TemporaryDirectory() as scratch:  # a trial saves its checkpoint after every validation
        saving = time.perf_counter()
        trainer.save_checkpoint(Path(scratch) / "last.ckpt", weights_only=False)
        checkpoint_s = time.perf_counter() - saving
    return timer, checkpoint_s


def _rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def _memory(device: Any, rss_before: float) -> dict[str, Any]:
    import torch

    if device is not None and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory / 2**20
        return {"memory": "cuda", "peak_mb": torch.cuda.max_memory_allocated(device) / 2**20, "total_mb": total}
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    return {"memory": "rss", "peak_mb": max(0.0, _rss_mb() - rss_before), "total_mb": total}


class StepTimer(L.Callback):
    """A Lightning callback that times a short fit: the set-up up to the first batch, the first step, the steps
    after :data:`WARMUP` more in blocks, and the validation (the device synchronised at each edge it times). It
    stops the fit once ``steps`` are trained and its last two blocks agree (:data:`AGREE`), or at ``cap``."""

    def __init__(self, started: float, steps: int) -> None:
        self.started, self.steps = started, steps
        self.block = max(1, (steps - WARMUP - 1) // 2)  # steps per block: two blocks in ``steps``
        self.cap = steps + MORE_BLOCKS * self.block
        self.marks: list[float] = []  # end of each training step
        self.first_batch: Optional[float] = None
        self.validation: list[float] = []
        self.device = None

    def _now(self) -> float:
        import torch

        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.device = pl_module.device
        if self.first_batch is None:
            self.first_batch = self._now()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.marks.append(self._now())
        if len(self.marks) >= self.steps and self.agreed():
            trainer.should_stop = True

    def rates(self) -> list[float]:
        """Seconds per step of each whole block after the warm-up."""
        timed = self.marks[WARMUP:]
        n = (len(timed) - 1) // self.block
        return [(timed[(i + 1) * self.block] - timed[i * self.block]) / self.block for i in range(n)]

    def agreed(self) -> bool:
        rates = self.rates()
        return len(rates) >= 2 and abs(rates[-1] - rates[-2]) <= AGREE * min(rates[-2:])

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.validation = [self._now()]

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.validation.append(self._now())

    def result(self) -> dict[str, float]:
        if self.first_batch is None or len(self.marks) < WARMUP + 2:
            raise RuntimeError(f"the preflight trained {len(self.marks)} step(s) of {self.steps}")
        rates = self.rates()
        last = rates[-2:] if self.agreed() else sorted(rates)
        step_s = sum(rates[-2:]) / 2 if self.agreed() else last[len(last) // 2]
        return {
            "setup_s": self.first_batch - self.started,
            "first_step_s": self.marks[0] - self.first_batch,
            "step_s": step_s,
            # how far apart the blocks it rests on were, as a share of it; whether the last two agreed
            "step_noise": (max(last) - min(last)) / step_s if step_s > 0 else 0.0,
            "step_agreed": self.agreed(),
            "validation_s": self.validation[1] - self.validation[0] if len(self.validation) == 2 else 0.0,
        }


# --------------------------------------------------------------------------------------- failures
def failure_line(shape: Shape, err: BaseException) -> str:
    """One line: the arm, its setting, what failed and the way out."""
    text = " ".join(str(err).split())[:200]
    name = type(err).__name__
    said = f"{name}: {text}" if text else name
    if _is_oom(err):
        way = f"out of memory at this shape ({said}); use a smaller data.batch_size (now {shape.cfg.data.batch_size})"
        if shape.cfg.trainer.accumulate_grad_batches == 1:
            way += " with trainer.accumulate_grad_batches to keep the batch"
    elif _is_compile(err):
        way = f"compiling failed ({said}); set trainer.compile=false"
    elif isinstance(err, ImportError):
        way = f"a package is missing ({said}); install it into the project's .venv"
    elif isinstance(err, ConfigError):
        way = text
    else:
        way = f"{said}; every trial of this shape would fail so: change the setting or leave the arm out"
    return f"preflight: {shape.label} [{shape.setting}] failed: {way}"


# What torch's allocators say when an allocation fails: CUDA's "out of memory", the CPU's "DefaultCPUAllocator: can't
# allocate memory" (a RuntimeError, e.g. under an address-space limit)
OUT_OF_MEMORY = ("out of memory", "can't allocate memory")


def _is_oom(err: BaseException) -> bool:
    import torch

    said = str(err).lower()
    return isinstance(err, (MemoryError, torch.OutOfMemoryError)) or any(words in said for words in OUT_OF_MEMORY)


def _is_compile(err: BaseException) -> bool:
    from lightning_modules.callbacks import COMPILERS, CompileFailed

    chain = [err, err.__cause__, err.__context__]
    return any(isinstance(e, CompileFailed) or type(e).__module__.startswith(COMPILERS) for e in chain if e is not None)


# --------------------------------------------------------------------------------------- one process per shape
def _entry(conn: Any, container: dict, steps: int, threads: int, gpus: Optional[str], label: str) -> None:
    entered = time.time()  # the process has started and imported this module (and Lightning with it)
    quiet = os.open(os.devnull, os.O_WRONLY)  # Lightning's and torch's chatter: the answer comes through the pipe
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    try:
        cfg = OmegaConf.create(container)
        conn.send(("ok", {"entered": entered, **measure(cfg, steps, threads)}))
    except BaseException as err:  # noqa: BLE001  (every failure of the shape is its one line)
        shape = Shape("", label, OmegaConf.create(container))
        conn.send(("failed", failure_line(shape, err)))
    finally:
        conn.close()


def run_shape(shape: Shape, steps: int, threads: int, gpus: Optional[str]) -> None:
    """Measure ``shape`` in a fresh spawned process (as a sweep worker starts): sets ``measured`` or ``failure``."""
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe(duplex=False)
    container = OmegaConf.to_container(shape.cfg, resolve=True)
    proc = ctx.Process(target=_entry, args=(there, container, steps, threads, gpus, shape.label), daemon=True)
    spawned = time.time()
    proc.start()
    there.close()
    try:
        got = here.recv() if here.poll(TIMEOUT_S) else None
    except EOFError:  # the process died without an answer
        got = None
    proc.join(timeout=30)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if got is None:
        code = proc.exitcode
        why = f"its process ended with code {code} (killed: out of memory?)" if code else f"no answer in {TIMEOUT_S} s"
        shape.failure = (
            f"preflight: {shape.label} [{shape.setting}] failed: {why}; try a smaller data.batch_size "
            f"(now {shape.cfg.data.batch_size}) or trainer.compile=false"
        )
    elif got[0] == "failed":
        shape.failure = got[1]
    else:
        measured = dict(got[1])
        measured["start_s"] = max(0.0, measured.pop("entered") - spawned) + measured.pop("import_s")
        shape.measured = measured


def check(study: Study, threads: int, gpus: Optional[str], steps: int = STEPS) -> list[Shape]:
    """Measure every shape of ``study`` (each by :func:`run_shape`), printing one line per shape; raise
    :class:`PreflightFailed` with one line per failed shape."""
    shapes = shapes_of(study)
    print(
        f"preflight: {len(shapes)} trial shape(s), one at a time, each in a fresh process: {steps} steps or more, "
        f"until two blocks of steps agree within {AGREE:.0%}",
        flush=True,
    )
    for shape in shapes:
        run_shape(shape, steps, threads, gpus)
        print(shape.failure if shape.failure is not None else measured_line(shape), flush=True)
    failed = [s.failure for s in shapes if s.failure is not None]
    if failed:
        raise PreflightFailed(failed)
    return shapes


class PreflightFailed(ConfigError):
    """Shapes that failed their preflight: one line each (``lines``)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(lines[0])
        self.lines = lines


def measured_line(shape: Shape) -> str:
    m = shape.measured or {}
    where = "GPU memory" if m.get("memory") == "cuda" else "peak RSS growth of the machine's memory"
    return (
        f"preflight: {shape.label} [{shape.setting}]: {m['step_s']:.3f} s/step after warm-up {_noise(m)}, first step "
        f"{m['first_step_s']:.1f} s (compile and warm-up), set-up {m['setup_s']:.1f} s, validation "
        f"{m['validation_s']:.1f} s, peak {m['peak_mb']:.0f} MB of {m['total_mb']:.0f} MB ({where}); "
        f"{len(shape.trials)} {'trial(s)' if shape.grid else 'point(s) of its range'}"
    )


def _noise(m: dict) -> str:
    """``(±4 %: two blocks agreed)``: how far the measurement's blocks were apart, and whether they settled."""
    if "step_noise" not in m:
        return ""
    spread = f"±{50 * m['step_noise']:.0f} %"
    return f"({spread}: two blocks agreed)" if m.get("step_agreed") else f"({spread}: its blocks never agreed; busy?)"


def turned_off() -> bool:
    """``LINFORMER_LAB_PREFLIGHT=0`` (as ``--no-preflight``): for scripts that join a study already checked."""
    return os.environ.get("LINFORMER_LAB_PREFLIGHT", "1").strip().lower() in ("0", "false", "no", "off")
