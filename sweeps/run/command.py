"""``linformer-lab sweep STUDY.yaml [--preset P] [--storage URL] [--n-trials N] [--workers W] [--add-seeds N]
[--replicate | --budget F | --budgets F1,F2,...] [--new-study] [--check] [--preflight | --no-preflight]
[--no-gate]``.

Launches, or resumes, an Optuna study. The command validates the study file, the sampler's and pruner's
arguments and the storage URL (exit 2 before any trial; ``--check`` stops there, writing nothing), takes
ownership of a journal study (a second ``sweep`` of it gets one line naming the owner), refuses a stored
study whose search space or objective the file has changed (:mod:`sweeps.spec.identity`; ``--new-study`` sets the
earlier one aside), opens the study, fails and re-enqueues trials left running by dead workers, enqueues the
grid points not yet run, then starts W worker processes on this machine (each with cores/W torch threads,
its output in ``<study dir>/logs/``) and prints one line per finished trial. Every worker repeats:
fail stale trials; stop when ``n_trials`` trials are finished (or the timeout has passed); wait while
the remaining budget is taken by running trials (one of them may yet die); else run one trial.
The same command on another machine, against the same ``--storage`` RDB URL, joins the study. The budget is counted by
the workers, not by Optuna's ``MaxTrialsCallback`` (which cannot count it: docs/architecture.md); a trial's own failure
is caught by ``optimize(catch=(TrialFailed,))`` (:class:`sweeps.run.trials.TrialFailed`) and the worker goes on.
A trial that fails on an input error is put back uncounted and stops its worker: the command then ends with one
``error:`` line and exit 2. SIGTERM (and Ctrl-C) is passed on to the workers as SIGTERM, which a worker only notes:
at its next safe point (never inside a journal write) its running trial saves a checkpoint and is put back; the
command exits 143 (130 for Ctrl-C). Before anything is written, a journal study's folder is checked for links and
wrong-type names (:meth:`sweeps.run.storage.RunStorage.check_folder`).

Before anything is written, every distinct trial shape trains a few steps in a fresh process on the trials' device
(:mod:`sweeps.run.preflight`; ``--preflight`` stops after it and the projected cost, ``--no-preflight`` skips it); a
failed shape is one ``error:`` line each and exit 2. The projection (:mod:`sweeps.run.plan`) is printed before the
first trial and written as ``plan.json``. The control's trials run first, as a gate (:mod:`sweeps.run.gate`): a
control that does not pass stops the sweep before the arms with exit code 4 (``--no-gate`` runs them anyway).

What costs seconds is checked before what costs minutes (:func:`check_before_preflight`): a database storage is opened
within its connect timeout, the stored study compared with the file, and a journal study's lock tried for a running
``sweep``, all before the preflight.

The study file is read and checked once, here: the workers get the loaded :class:`~sweeps.spec.study.Study` whole,
its points' configs checked, and ``--add-seeds`` grows it (:meth:`~sweeps.spec.study.Study.with_seeds`) without
reading the file again. Each process opens a study's storage once (:class:`sweeps.run.storage.RunStorage`).

GPUs: the N GPUs this process may use (``CUDA_VISIBLE_DEVICES`` if set, else all; counted through NVML
without initialising CUDA here) are dealt out as whole blocks of g = N // W per worker: worker i gets GPUs
i·g … i·g + g − 1 as its ``CUDA_VISIBLE_DEVICES``, and N mod W stay idle (one line says so). A trial then sees
its worker's g GPUs as cuda:0 … cuda:g − 1: ``trainer.devices=g trainer.strategy=ddp_spawn`` trains each
trial on all of them (a trial asking for more than g is refused before any trial starts). With more workers
than GPUs (one line says so), worker i shares GPU i mod N with the others dealt the same one. Trials on
``trainer.accelerator=cpu`` get no GPU.

``--add-seeds N`` adds N replicate seeds to a grid study and to its control: the next unused seed
numbers (above every seed of the file, of the control and of the stored trials), stored on the study
(user attr ``added_seeds``) so that every later ``sweep`` and ``report`` includes them. The grid points
already run are not run again; only the new seeds' points are enqueued. Plan N from the report's power
calculation before running, and do not stop adding seeds once a verdict appears: stopping on a result
inflates the error rates the verdicts promise (docs/verdicts.md).

``--replicate`` runs the study's replication instead (:mod:`sweeps.spec.replication`): its arms and control on the
fresh seeds of the file's ``replicate:`` block, as the study ``<study>_<preset>_replicate`` beside the original. Its
seeds are checked, before anything is written, against those ``--add-seeds`` stored on the original; every flag above
applies to it as to any study (``--add-seeds`` grows the replication, with seeds above its own).

``--budgets 1,2,4,8,16`` runs the study's budget curves (:mod:`sweeps.spec.budgets`, :mod:`sweeps.run.trunks`): each
trial is one trunk per seed and arm at a constant learning rate, and a cooldown branched off it per budget, as the
derived study ``<study>_<preset>_curve``; listing more budgets later trains the trunks on.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Optional

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from foundation.confined import open_inside
from foundation.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, ConfigError, Terminated, check_number
from foundation.lock import check_free
from foundation.rundir import key_value
from sweeps import stored
from sweeps.run import gate, plan, preflight, storage, trunks
from sweeps.run.storage import GridPointTaken, RunStorage
from sweeps.spec import identity, replication
from sweeps.spec.schema import ADDED_SEEDS, MAX_TRIALS, SEED_PARAM
from sweeps.spec.study import Study, load_study
from sweeps.spec.validation import requested_devices
from sweeps.stored import check_objective, name_metrics, objective_of
from training.answer import Objective, link_of
from training.config import MAX_STEPS
from training.console import clock
from training.train import check_machine

POLL_S = 1.0
MAX_WORKERS = 1024  # a bound for the flag; the command starts no more than the trials left and the cores
HOST = "127.0.0.1"


def make_sampler(study: Study, seed: int) -> optuna.samplers.BaseSampler:
    spec = study.spec.sampler
    seed %= 2**32  # a worker's seed is the file's plus an offset (see _work_on)
    if spec.kind == "tpe":
        # constant_liar: concurrent workers see each other's running trials and spread out
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.n_startup_trials, constant_liar=True)
    # random; and grid, whose points the `sweep` command enqueues once, so that its sampler never proposes
    return optuna.samplers.RandomSampler(seed=seed)


def make_pruner(study: Study) -> optuna.pruners.BasePruner:
    p = study.spec.pruner
    if p.kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps)
    if p.kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=p.min_resource, reduction_factor=p.reduction_factor)
    return optuna.pruners.NopPruner()


def check_optuna_arguments(study: Study) -> None:
    """The sampler's and the pruner's arguments, checked and the objects built here, before anything is written
    (Optuna refuses some only when they are built, others only inside a trial): one line naming the key."""
    for one in study.studies:
        s, p = one.spec.sampler, one.spec.pruner
        check_number("sampler.seed", s.seed, 0, 2**32 - 1, integer=True)
        check_number("sampler.n_startup_trials", s.n_startup_trials, 0, MAX_TRIALS, integer=True)
        check_number("pruner.n_startup_trials", p.n_startup_trials, 0, MAX_TRIALS, integer=True)
        check_number("pruner.n_warmup_steps", p.n_warmup_steps, 0, MAX_STEPS, integer=True)
        check_number("pruner.min_resource", p.min_resource, 1, MAX_STEPS, integer=True)
        check_number("pruner.reduction_factor", p.reduction_factor, 2, 1000, integer=True)
        try:
            make_sampler(one, s.seed)
            make_pruner(one)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"sampler/pruner: {str(err).splitlines()[0]}") from None


def open_study(runs: RunStorage, study: Optional[Study] = None) -> optuna.Study:
    """Create the study (``study``, else the storage's), storing its identity (:mod:`sweeps.spec.identity`), or load
    it: then its stored identity must be the file's (Optuna would silently keep the stored directions, and a changed
    config would pool trials of two questions in one study), and a study without one (not created by this suite) is
    refused."""
    study = study or runs.study
    opened = runs.storage
    options = dict(study_name=study.name, storage=opened, pruner=make_pruner(study))
    sampler = make_sampler(study, study.spec.sampler.seed)
    try:
        ostudy = optuna.load_study(**options, sampler=sampler)
    except KeyError:  # not there yet: created here, its identity stored at once
        try:
            ostudy = optuna.create_study(**options, sampler=sampler, directions=study.directions)
        except optuna.exceptions.DuplicatedStudyError:  # another launcher created it meanwhile
            ostudy = _created_elsewhere(study, opened, options, sampler)
        else:
            ostudy.set_user_attr("objective", objective_of(study))
            ostudy.set_user_attr(identity.IDENTITY, identity.identity_of(study))
    check_objective(study, ostudy, runs.url)
    name_metrics(ostudy, study)  # optuna-dashboard's names of the objectives, set when missing
    return ostudy


def _created_elsewhere(study: Study, opened: object, options: dict, sampler: object) -> optuna.Study:
    """A study another launcher has just created: loaded once that launcher has stored its identity (a few
    seconds at most; check_objective refuses it after that)."""
    deadline = time.monotonic() + 10
    while True:
        ostudy = optuna.load_study(**options, sampler=sampler)
        if identity.IDENTITY in ostudy.user_attrs or time.monotonic() > deadline:
            return ostudy
        time.sleep(0.5)


def check_before_preflight(study: Study, runs: RunStorage, new_study: bool) -> Optional[Path]:
    """What costs seconds, checked before the preflight spends minutes: a database storage opened (within its connect
    timeout), the stored study the file's (unless ``--new-study`` sets it aside), no other ``sweep`` owning a journal
    study now, and where ``--new-study`` would move it (returned; None when there is nothing to move)."""
    if runs.url is not None:
        runs.storage  # noqa: B018  (connected here, or one line)
    if not new_study:
        check_stored(study, runs.url)
    if runs.journal is not None:
        check_free(study.root, f"study {study.name} ({study.root})")
    return runs.aside_path() if new_study else None


def check_stored(study: Study, url: Optional[str]) -> None:
    """A study already started must have the file's objective and space: checked before the command writes
    anything."""
    for one in study.studies:
        ostudy = RunStorage(one, url).stored_study()
        if ostudy is not None:
            check_objective(one, ostudy, url)


# --------------------------------------------------------------------------------------- GPUs
def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries (indices or UUIDs).

    ``torch.cuda.device_count()`` counts through NVML, honouring ``CUDA_VISIBLE_DEVICES``, and does not
    initialise CUDA in this process (torch's documented contract: it does not "poison fork")."""
    import torch

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [d.strip() for d in listed.split(",") if d.strip()][:count]


def worker_gpus(gpus: list[str], workers: int) -> tuple[list[Optional[str]], Optional[str]]:
    """Each worker's ``CUDA_VISIBLE_DEVICES`` (None: leave it as it is) and a one-line note, or None.

    Blocks of g = N // W GPUs per worker; more workers than GPUs: worker i on GPU i mod N."""
    n = len(gpus)
    if n == 0:
        return [None] * workers, None
    if workers > n:
        return [gpus[i % n] for i in range(workers)], (
            f"warning: {workers} workers share {n} GPU(s) (worker i on GPU i mod {n}): trials on one GPU slow each "
            f"other down and add their memory; --workers {n} gives each worker its own"
        )
    g = n // workers
    note = (
        None
        if n % workers == 0
        else (
            f"note: {n} GPUs for {workers} workers: {g} per worker, {n % workers} idle (--workers divides them evenly "
            f"when it divides {n})"
        )
    )
    return [",".join(gpus[i * g : (i + 1) * g]) for i in range(workers)], note


def study_gpus(study: Study, workers: int) -> list[str]:
    """The GPUs the study's workers share (none when its trials run on the CPU), after refusing trials that ask
    for more GPUs than each of ``workers`` workers would have (Lightning would fail every one of them)."""
    if all(s.shared.trainer.accelerator == "cpu" for s in study.studies):
        return []
    gpus = visible_gpus()
    if gpus:  # the layout the command asks for (fewer workers may start: more GPUs each)
        _check_trial_gpus(study, max(1, len(gpus) // workers))
    return gpus


def _check_trial_gpus(study: Study, per_worker: int) -> None:
    for s in study.studies:
        t = s.shared.trainer
        asked = requested_devices(t.devices)
        if t.accelerator != "cpu" and asked is not None and asked > per_worker:
            raise ConfigError(
                f"trainer.devices={t.devices}: each sweep worker has {per_worker} GPU(s) (the visible "
                f"GPUs divided by --workers); use fewer --workers or fewer devices per trial"
            )


def _optuna_quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


# --------------------------------------------------------------------------------------- worker
def work(
    study: Study,
    url: Optional[str],
    workers: int,
    index: int,
    threads: int,
    deadline: Optional[float],
    log_path: Optional[str],
    gpus: Optional[str] = None,
) -> int:
    """One worker process: run the control's trials, then the study's, until each budget is met. ``study``: the
    study the command loaded and checked (its points resolved, added seeds included), not loaded again here.
    ``gpus``: its ``CUDA_VISIBLE_DEVICES`` (set before anything here initialises CUDA). Returns an exit code."""
    if log_path is not None:  # lightning, torch and optuna write to fd 1/2: send them all to the log
        fd = open_inside(Path(log_path).parents[1], Path(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
        print(f"worker {index}: CUDA_VISIBLE_DEVICES={gpus}", flush=True)
    import torch

    torch.set_num_threads(threads)
    try:
        for one in study.studies:
            # The control never waits for its last running trials: the workers go on to the study itself
            # (a control trial whose worker died is retried by the next `sweep` command).
            _work_on(one, url, workers, index, deadline, wait_for_running=one is study)
    except ConfigError as err:  # an input error every trial would meet: its trial is put back, uncounted
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _work_on(
    study: Study, url: Optional[str], workers: int, index: int, deadline: Optional[float], wait_for_running: bool
) -> None:
    """Run ``study``'s trials until its budget is met. Before each trial: fail and retry the trials of dead workers;
    stop at the budget (or deadline); wait while running trials take the rest of it (one may yet die and be
    re-enqueued by its heartbeat); else run one trial (``optimize(n_trials=1)``). A trial's own failure
    (:class:`~sweeps.run.trials.TrialFailed`) is recorded on it and the worker goes on; an input error and a stop end
    the worker."""
    from sweeps.run.objective import STOP_ASKED
    from sweeps.run.trials import TrialFailed, run_trial

    runs = RunStorage(study, url, workers)
    ostudy = open_study(runs)
    # A distinct sampler seed per worker and per resumption: identical seeds would propose identical params.
    ostudy.sampler = make_sampler(study, study.spec.sampler.seed + 1000 * len(ostudy.trials) + index)
    while True:
        runs.fail_stale_trials(ostudy)
        trials = ostudy.get_trials(deepcopy=False)
        state = storage.budget_state(trials, study)
        n = study.n_trials
        if (n is not None and state.finished >= n) or (deadline is not None and time.time() > deadline):
            return
        if STOP_ASKED.is_set():
            raise Terminated("SIGTERM")
        taken = n is not None and state.finished + state.running >= n
        # a grid study runs its enqueued points only: none waiting means nothing to start
        grid_empty = study.is_grid and not any(t.state == TrialState.WAITING for t in trials)
        if taken or grid_empty:
            if state.running == 0 or not wait_for_running:
                return
            time.sleep(POLL_S)  # a running trial may yet die and be re-enqueued
            continue
        try:
            ostudy.optimize(
                lambda trial: run_trial(study, trial, runs), n_trials=1, gc_after_trial=True, catch=(TrialFailed,)
            )
        except UpdateFinishedTrialError:  # another worker took this one's trial for a dead worker's (its heartbeat
            continue  # late) and failed and retried it: its copy runs, this worker goes on
        except GridPointTaken:  # the waiting point seen above was claimed by another worker first: look again
            continue


def _work_entry(**kwargs) -> None:
    from sweeps.run.objective import note_stop

    # A signal never cuts a journal write or a trial's bookkeeping: SIGTERM is only noted (the worker stops at the
    # next safe point, see sweeps.run.trials) and Ctrl-C reaches the workers as SIGTERM from the command.
    signal.signal(signal.SIGTERM, note_stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _optuna_quiet()
    try:
        code = work(**kwargs)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except Terminated:  # its trial's checkpoint is saved and a copy of the trial enqueued
        code = EXIT_TERMINATED
    sys.exit(code)


# --------------------------------------------------------------------------------------- command
def _describe(t: FrozenTrial, study: Study) -> str:
    params = " ".join(key_value(k, v) for k, v in t.params.items())
    if t.state == TrialState.COMPLETE:
        outcome = " ".join(f"{m}={v:.4g}" for m, v in zip(study.metrics, t.values))
    elif t.state == TrialState.PRUNED:
        outcome = f"at step {t.last_step}" if t.last_step is not None else ""
    else:
        outcome = t.user_attrs.get(stored.INTERRUPTED) or t.user_attrs.get("fail_reason") or "its worker died"
    took = f"{t.duration.total_seconds():.0f} s" if t.duration is not None else ""
    state = "INTERRUPTED" if stored.INTERRUPTED in t.user_attrs else t.state.name
    return f"trial {t.number:>3}  {state:<8} {params}  {outcome}  {took}".rstrip()


def prepare(study: Study, runs: RunStorage, points: Optional[list[dict]] = None) -> optuna.Study:
    """Open (or create) the study, recover trials of dead workers, enqueue grid points not yet run (``points``: only
    these, e.g. those the gate runs before the arms)."""
    ostudy = open_study(runs, study)
    ostudy.set_user_attr("study_file", str(study.path))
    ostudy.set_user_attr("preset", study.preset)
    runs.fail_stale_trials(ostudy)
    trunks.extend(study, ostudy)  # a curve study asked for more budgets: its finished points go on
    if study.is_grid:
        for point in study.points[: study.n_trials] if points is None else points:
            ostudy.enqueue_trial(point, skip_if_exists=True)
    return ostudy


def footer(study: Study, url: Optional[str]) -> str:
    where = f" --storage {stored.storage_display(study, url)}" if url else ""
    return "\n".join(
        [
            f"report:      linformer-lab report {study.file_args}{where}",
            f"tensorboard: tensorboard --logdir {study.root} --host {HOST}",
            *(f"             then open {link_of(Objective(m))}" for m in study.metrics if m.startswith("val/")),
            f"dashboard:   linformer-lab dashboard {study.file_args}{where} --host {HOST}  (the study and its control)",
        ]
    )


def _progress(study: Study, trials: list[FrozenTrial]) -> str:
    n = study.n_trials
    return f"{storage.budget_state(trials, study).finished}/{n if n is not None else '∞'}"


def _met(study: Study, trials: list[FrozenTrial]) -> bool:
    return study.n_trials is None or storage.budget_state(trials, study).finished >= study.n_trials


def usable_workers(asked: int, trials_left: Optional[int], cores: int) -> int:
    """Worker processes worth starting: no more than the trials left (None: an open study) and the cores here."""
    return max(1, min(asked, cores, trials_left if trials_left is not None else asked))


def _trials_left(study: Study, ostudies: dict[str, optuna.Study]) -> Optional[int]:
    if any(s.n_trials is None for s in study.studies):
        return None
    return sum(max(0, s.n_trials - storage.budget_state(ostudies[s.name].trials, s).finished) for s in study.studies)


def _stop(procs: list) -> None:
    """SIGTERM to every worker still alive (each saves its trial and puts it back), then wait for them."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=120)


def _layout(study: Study, workers: int) -> tuple[int, int, int]:
    """(workers that will start, torch threads each, GPUs visible) as :func:`start_workers` sets them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    started = usable_workers(workers, sum(len(preflight.trial_points(s)) for s in study.studies), cores)
    return started, max(1, cores // started), len(study_gpus(study, workers))


def _preflight(study: Study, workers: int) -> Optional[list[preflight.Shape]]:
    """The preflight (:mod:`sweeps.run.preflight`) on the first worker's device and threads; None after printing one
    ``error:`` line per failed shape."""
    started, threads, _ = _layout(study, workers)
    gpus = worker_gpus(study_gpus(study, workers), started)[0][0]
    try:
        return preflight.check(study, threads, gpus)
    except preflight.PreflightFailed as failed:
        for line in failed.lines:
            print(f"error: {line}", file=sys.stderr)
        print("error: the preflight failed: nothing of the study was written", file=sys.stderr)
        return None


def _plan(
    study: Study,
    shapes: list[preflight.Shape],
    ostudies: dict[str, optuna.Study],
    workers: int,
    visible: list,
    gated: bool = False,
) -> dict:
    """The projection of the trials left, printed and written beside the study (plan.json)."""
    left = plan.left_of(study, {s.name: ostudies[s.name].get_trials(deepcopy=False) for s in study.studies})
    started, threads, _ = _layout(study, workers)
    projected = plan.project(study, shapes, started, threads, len(visible), left, gated)
    print("\n".join(plan.lines(projected)), flush=True)
    plan.write(study, projected)
    return projected


def run(
    study: Study,
    stores: dict[str, RunStorage],
    workers: int,
    shapes: Optional[list[preflight.Shape]] = None,
    gated: bool = False,
) -> int:
    """Prepare the study and its control (``stores``: their storages, by name), start the workers, report each
    finished trial, summarise. ``shapes``: the preflight's measurements, projected and written as plan.json.
    ``gated``: the control's trials (and the study's points it reuses) first, then the arms only if the control
    passes (:mod:`sweeps.run.gate`)."""
    url = stores[study.name].url
    visible = study_gpus(study, workers)
    gated = gated and study.control is not None
    first = gate.first_points(study) if gated else None
    ostudies = {s.name: prepare(s, stores[s.name], first if s is study else None) for s in study.studies}
    for s in study.studies:
        print(
            f"study {s.name}: {_progress(s, ostudies[s.name].trials)} trials finished; "
            f"storage {stored.storage_display(s, url)}",
            flush=True,
        )
    if all(_met(s, ostudies[s.name].trials) for s in study.studies):
        print("budget already met: nothing to run")
        return 0
    projected = _plan(study, shapes, ostudies, workers, visible, gated) if shapes else None
    deadline = time.time() + study.spec.budget.timeout_s if study.spec.budget.timeout_s else None
    before = {(s.name, t.number) for s in study.studies for t in ostudies[s.name].trials}
    target = study if not gated or study.is_grid else study.control  # an open study's sampler waits for the gate
    procs = start_workers(target, url, workers, visible, _trials_left(study, ostudies), deadline)
    pace = ((started := time.time()), _finished(target, ostudies)[0])  # one clock for the sweep, across the gate
    on_sigterm = signal.signal(signal.SIGTERM, _terminated)
    try:
        follow(target, ostudies, procs, pace)
        if gated and not any(p.exitcode for p in procs):
            start = lambda: start_workers(study, url, workers, visible, _trials_left(study, ostudies), deadline)  # noqa: E731
            if (stopped := _after_control(study, ostudies, procs, start, pace)) is not None:
                print(f"gate: {stopped}", file=sys.stderr)
                print(footer(study, url))
                return gate.EXIT_GATED
    except KeyboardInterrupt:  # passed on as SIGTERM: each worker puts its trial back at a safe point
        _stop(procs)
        print("interrupted: run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:  # a scheduler's preemption: each worker saves its trial's checkpoint and puts it back
        _stop(procs)
        print("terminated: the running trials saved their checkpoints; run the same command again", file=sys.stderr)
        return EXIT_TERMINATED
    finally:
        signal.signal(signal.SIGTERM, on_sigterm)
    met = summarise(study, ostudies, started, deadline)
    if projected is not None:
        _measured(study, ostudies, projected, started, shapes or [])
    print(footer(study, url))
    stopped = input_error(study, ostudies, before)
    if stopped is not None:
        print(f"error: {stopped}", file=sys.stderr)
        return 2
    return 2 if any(p.exitcode == 2 for p in procs) else (0 if met else 1)


def _measured(
    study: Study, ostudies: dict[str, optuna.Study], projected: dict, started: float, shapes: list[preflight.Shape]
) -> None:
    """The sweep's measured wall time against the projection, and why when it is far off (``shapes``: the
    preflight's, with the trials of each)."""
    took, elapsed_s = _took(study, ostudies, shapes, started), time.time() - started
    print("\n".join([plan.measured_line(projected, elapsed_s), *plan.why_off(projected, elapsed_s, took)]))


def _took(
    study: Study, ostudies: dict[str, optuna.Study], shapes: list[preflight.Shape], started: float
) -> list[tuple[str, float, float]]:
    """(shape label, projected seconds, measured seconds) of each trial this sweep (started at ``started``) ran from
    its start to its end."""
    index = {(name, repr(sorted(p.items()))): (s, steps, n_val) for s in shapes for name, p, steps, n_val in s.trials}
    out = []
    for one in study.studies:
        for t in ostudies[one.name].get_trials(deepcopy=False):
            found = index.get((one.name, repr(sorted(t.params.items()))))
            if found is None or t.duration is None or t.datetime_start.timestamp() < started:
                continue
            shape, steps, n_val = found
            out.append((shape.label, plan.trial_seconds(shape.measured, steps, n_val), t.duration.total_seconds()))
    return out


def _after_control(
    study: Study,
    ostudies: dict[str, optuna.Study],
    procs: list[mp.Process],
    start: object,
    pace: Optional[tuple[float, int]] = None,
) -> Optional[str]:
    """The gate, once the control has run: the paragraph that stops the sweep, or None after the arms have run
    (their points enqueued, workers started by ``start`` and followed on the sweep's clock ``pace``; added to
    ``procs``)."""
    passed, said = gate.decide(study, ostudies[study.name], ostudies[study.control.name].get_trials(deepcopy=False))
    if not passed:
        return said
    print(f"gate: {said}", flush=True)
    if study.is_grid:
        for point in study.points[: study.n_trials]:
            ostudies[study.name].enqueue_trial(point, skip_if_exists=True)
    if not _met(study, ostudies[study.name].trials):
        more = start()
        procs += more
        follow(study, ostudies, more, pace)
    return None


def _terminated(signum: int, frame: object) -> None:
    raise Terminated("SIGTERM")


def input_error(study: Study, ostudies: dict[str, optuna.Study], before: set[tuple[str, int]]) -> Optional[str]:
    """The line that says why the sweep stopped, when trials of this run failed on an input error (put back,
    uncounted), else None."""
    from sweeps.run.trials import INPUT_ERROR

    failed = [
        (s, t)
        for s in study.studies
        for t in ostudies[s.name].get_trials(deepcopy=False)
        if (s.name, t.number) not in before and t.user_attrs.get(INPUT_ERROR)
    ]
    if not failed:
        return None
    s, t = failed[-1]
    return (
        f"the sweep stopped: trial {t.number} of {s.name} failed on an input error that every trial would meet "
        f"({t.user_attrs[INPUT_ERROR]}); its {len(failed)} failed trial(s) are put back and not counted: fix it "
        "and run the same command again"
    )


def start_workers(
    study: Study, url: Optional[str], workers: int, visible: int, left: Optional[int], deadline: Optional[float]
) -> list[mp.Process]:
    """Start no more workers than the trials left and the cores here (saying so), each with cores/W torch threads
    and its own GPUs, its output in ``<study dir>/logs/worker_<i>.log``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if usable_workers(workers, left, cores) < workers:
        print(
            f"--workers {workers}: starting {usable_workers(workers, left, cores)} "
            f"({left if left is not None else 'open'} trial(s) left, {cores} core(s) here)",
            flush=True,
        )
        workers = usable_workers(workers, left, cores)
    threads = max(1, cores // workers)
    gpus, gpu_note = worker_gpus(visible, workers)
    if gpu_note:
        print(gpu_note, flush=True)
    logs = study.root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    procs = []
    for i in range(workers):
        kwargs = dict(
            study=study,  # loaded and checked once, here: a worker gets it whole (pickled), its points resolved
            url=url,
            workers=workers,
            index=i,
            threads=threads,
            deadline=deadline,
            log_path=str(logs / f"worker_{i}.log"),
            gpus=gpus[i],
        )
        procs.append(ctx.Process(target=_work_entry, kwargs=kwargs, name=f"sweep-worker-{i}"))
        procs[-1].start()
    on_gpus = f" × GPUs {' | '.join(gpus)}" if gpus[0] is not None else ""
    print(f"{workers} worker(s) × {threads} thread(s){on_gpus}; logs in {logs}/", flush=True)
    return procs


def progress_line(done: int, total: Optional[int], done_before: int, elapsed_s: float) -> str:
    """``progress: 5/12 trials, 3.2 min elapsed, about 4.5 min left``: the time left at the pace of the trials that
    finished since this command started (their workers run side by side, so the pace counts them all)."""
    shown = f"progress: {done}/{total if total is not None else '∞'} trials, {clock(elapsed_s)} elapsed"
    finished_here = done - done_before
    if total is None or finished_here <= 0:
        return shown
    return f"{shown}, about {clock(elapsed_s / finished_here * max(0, total - done))} left"


def _finished(study: Study, ostudies: dict[str, optuna.Study]) -> tuple[int, Optional[int]]:
    """Trials finished and the budget, over the study and its control (None: an open study)."""
    done = sum(storage.budget_state(ostudies[s.name].get_trials(deepcopy=False), s).finished for s in study.studies)
    budgets = [s.n_trials for s in study.studies]
    return done, (None if any(n is None for n in budgets) else sum(budgets))


def follow(
    study: Study, ostudies: dict[str, optuna.Study], procs: list[mp.Process], pace: Optional[tuple[float, int]] = None
) -> None:
    """Until every worker has exited: one line per newly finished trial, then one progress line for those found
    together, and one line per worker that exits with an error. ``pace``: the sweep's start and the trials finished
    before it (default: now), so that the clock runs on across the gate."""
    started, done_before = pace if pace is not None else (time.time(), _finished(study, ostudies)[0])
    seen = {(s.name, t.number) for s in study.studies for t in ostudies[s.name].trials if t.state.is_finished()}
    alive = list(procs)
    while alive:
        done = wait([p.sentinel for p in alive], timeout=2.0)
        for p in [p for p in alive if p.sentinel in done]:
            p.join()
            alive.remove(p)
            if p.exitcode != 0:
                print(f"{p.name} (pid {p.pid}) exited with code {p.exitcode}: see {study.root / 'logs'}/", flush=True)
        new = 0
        for s in study.studies:
            for t in ostudies[s.name].get_trials(deepcopy=False):
                if t.state.is_finished() and (s.name, t.number) not in seen and stored.DISCARDED not in t.user_attrs:
                    seen.add((s.name, t.number))
                    new += 1
                    print(("control " if s.parent is not None else "") + _describe(t, s), flush=True)
        if new:
            print(progress_line(*_finished(study, ostudies), done_before, time.time() - started), flush=True)


def summarise(study: Study, ostudies: dict[str, optuna.Study], started: float, deadline: Optional[float]) -> bool:
    """One line per study (and control) with its counts; whether every budget was met (or the deadline passed)."""
    met = True
    for s in study.studies:
        trials = ostudies[s.name].get_trials(deepcopy=False)
        excluded = stored.excluded_numbers(trials)
        counts = ", ".join(
            f"{sum(t.state == st and t.number not in excluded for t in trials)} {st.name.lower()}"
            for st in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        )
        print(
            f"study {s.name}: {_progress(s, trials)} trials finished ({counts}) "
            f"in {(time.time() - started) / 60:.1f} min"
        )
        if not (_met(s, trials) or (deadline is not None and time.time() > deadline)):
            met = False
            missing = s.n_trials - storage.budget_state(trials, s).finished
            print(
                f"budget not met: {missing} trial(s) of {s.name} missing; "
                f"see {study.root / 'logs'}/, then run the same command again"
            )
    return met


# --------------------------------------------------------------------------------------- seeds
def with_added_seeds(study: Study, stores: dict[str, RunStorage], add: int = 0) -> Study:
    """``study`` (as its file says) grown by the seeds earlier ``--add-seeds`` stored on it, and ``add`` more (the
    next unused numbers, checked, then stored), through :meth:`Study.with_seeds`: the file is not read again.
    ``stores``: the storages of the study and its control, by name. Creates the study in its storage when it is
    not there yet."""
    ostudy = open_study(stores[study.name])
    added = [int(s) for s in ostudy.user_attrs.get(ADDED_SEEDS, [])]
    if add:
        trials = ostudy.get_trials(deepcopy=False)
        if study.control is not None:
            trials += open_study(stores[study.control.name]).get_trials(deepcopy=False)
        used = set(added) | {t.params[SEED_PARAM] for t in trials if isinstance(t.params.get(SEED_PARAM), int)}
        for s in [study, study.control] if study.control is not None else [study]:
            used |= set(s.seeds)
        family = set().union(*stored.family_seeds(study, stores[study.name].url).values())  # held by no other study
        new = replication.next_unused(max(used, default=-1) + 1, add, family)
        grown = study.with_seeds(added + new)  # checked before they are stored
        added += new
        ostudy.set_user_attr(ADDED_SEEDS, added)
        print(
            f"study {study.name}: added seeds {', '.join(map(str, new))} (to its control too); seeds now "
            f"{', '.join(map(str, grown.seeds))}",
            flush=True,
        )
        return grown
    return study.with_seeds(added) if added else study


def planned(study: Study, stores: dict[str, RunStorage], ostudy: Optional[optuna.Study], add: int) -> Study:
    """The study as ``sweep`` would run it, read only, for ``--preflight``'s plan: grown by the seeds an earlier
    ``--add-seeds`` stored on it (``ostudy``: the study as its storage holds it, None before its first sweep) and by
    ``add`` more (the numbers the sweep would take, unless a stored trial holds a higher seed: the count is what the
    plan needs)."""
    added = [int(s) for s in ostudy.user_attrs.get(ADDED_SEEDS, [])] if ostudy is not None else []
    if add:
        used = {*added, *study.seeds, *(study.control.seeds if study.control is not None else ())}
        family = set().union(*stored.family_seeds(study, stores[study.name].url).values())
        added += replication.next_unused(max(used, default=-1) + 1, add, family)
    return study.with_seeds(added) if added else study


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study file, e.g. sweeps/random_vs_learned.yaml")
    parser.add_argument("--preset", help="preset of the study file (default: cpu when it has one), e.g. gpu")
    parser.add_argument(
        "--storage",
        help="Optuna RDB URL, e.g. postgresql+psycopg2://user@host/db "
        "(default: a journal file under runs/<study>_<preset>/)",
    )
    parser.add_argument("--n-trials", type=int, help="total finished trials wanted (overrides budget.n_trials)")
    parser.add_argument("--timeout-s", type=float, help="start no trial after this many seconds")
    parser.add_argument("--workers", type=int, default=1, help="worker processes on this machine (default 1)")
    parser.add_argument(
        "--add-seeds",
        type=int,
        metavar="N",
        help="add N replicate seeds (the next unused numbers) to a grid study and its control, "
        "then resume it; plan N from the report's power calculation before running",
    )
    derived = parser.add_mutually_exclusive_group()  # one derived study at a time: argparse names both flags
    derived.add_argument(
        "--replicate",
        action="store_true",
        help="run the study's replication: its arms and control again on fresh seeds (the file's replicate: block, "
        "else the next hundred above the design's), as a study of its own beside the original",
    )
    derived.add_argument(
        "--budget",
        type=float,
        metavar="F",
        help="re-ask the study at F times its steps (the schedule stretched to the new end) on fresh seeds, as a "
        "study of its own beside the original, <study>_<preset>_x<F>",
    )
    parser.add_argument(
        "--budgets",
        metavar="F1,F2,...",
        help="the study as curves over these budgets (times its steps, e.g. 1,2,4,8,16) on fresh seeds: one trunk "
        "per seed and arm at a constant learning rate, a cooldown branched off it per budget, as "
        "<study>_<preset>_curve",
    )
    _add_run_flags(parser)


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that say how the study starts: afresh, after a preflight, behind its control's gate, or not at all."""
    parser.add_argument(
        "--new-study",
        action="store_true",
        help="start the study afresh: its folder (journal, trials, report) is moved aside to <folder>.<time>, "
        "nothing is deleted; for a study file whose search space or objective changed",
    )
    preflights = parser.add_mutually_exclusive_group()  # only the preflight, or none: argparse names both flags
    preflights.add_argument(
        "--preflight",
        action="store_true",
        help="train every distinct trial shape of the study and its control a few steps, each in a fresh process on "
        "the trials' device; print its seconds per step, peak memory and the study's projected cost; write nothing",
    )
    preflights.add_argument(
        "--no-preflight",
        action="store_true",
        help="start the trials without the preflight (also LINFORMER_LAB_PREFLIGHT=0)",
    )
    parser.add_argument(
        "--no-gate",
        action="store_true",
        help="run the arms even when the control's reference is uninformative or its power check fails (by default "
        "the sweep stops after the control, exit code 4); also LINFORMER_LAB_GATE=0",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the study file (schema, every trial config, sampler, pruner, grid size, storage URL) and "
        "exit without writing anything",
    )


def main(args: argparse.Namespace) -> int:
    check_number("--workers", args.workers, 1, MAX_WORKERS, integer=True)
    if args.n_trials is not None:
        check_number("--n-trials", args.n_trials, 1, MAX_TRIALS, integer=True)
    if args.timeout_s is not None:
        check_number("--timeout-s", args.timeout_s, 0, 365 * 86400, low_open=True)
    if args.add_seeds is not None:
        check_number("--add-seeds", args.add_seeds, 1, 10_000, integer=True)
    derived = {"replicate": args.replicate, "factor": args.budget, "curve": args.budgets}
    study = load_study(args.study, args.preset, args.n_trials, args.timeout_s, **derived)
    stores = storage.run_storages(study, args.storage, args.workers)  # opened lazily: nothing read or written yet
    runs = stores[study.name]  # the study's storage; its control's lies inside its folder
    if args.storage is None:  # its folder holds no link and no name of the wrong type, before any journal is read
        runs.check_folder()
    stored.check_family(study, args.storage)  # seeds no other study of its family holds; a derived one's original
    check_optuna_arguments(study)
    stored.check_url(args.storage, args.workers)
    study_gpus(study, args.workers)  # before any storage is touched: trials the GPUs cannot hold are refused
    if args.add_seeds:  # before any storage is touched: a study that cannot grow is refused first
        study.with_seeds([max(study.seeds, default=0) + 1])
    if args.new_study and args.storage is not None:
        raise ConfigError("--new-study: only for the default journal storage; with --storage, rename the study")
    if args.check:
        trials = f"{study.n_trials} trial(s)" if study.n_trials is not None else "trials until the timeout"
        control = f" and a control of {study.control.n_trials}" if study.control is not None else ""
        print(f"study OK: {study.name}, {trials}{control}; nothing written")
        return 0
    for s in study.studies:  # the accelerator its trials ask for is on this machine: refused before any write
        check_machine(s.shared)
    _optuna_quiet()
    aside = check_before_preflight(study, runs, args.new_study)
    shapes = None
    if args.preflight or not (args.no_preflight or preflight.turned_off()):
        shapes = _preflight(study, args.workers)  # before any write: a shape that fails refuses the study
        if shapes is None:
            return 2
        if args.preflight:
            opened = {s.name: stores[s.name].stored_study() for s in study.studies}  # read only, once
            study = planned(study, stores, opened[study.name], args.add_seeds or 0)
            shapes = preflight.with_trials_of(shapes, study)
            gated = study.control is not None and not (args.no_gate or gate.turned_off())
            trials = {name: (o.get_trials(deepcopy=False) if o is not None else []) for name, o in opened.items()}
            left = plan.left_of(study, trials)  # what a sweep would train: resumed, extended
            projected = plan.project(study, shapes, *_layout(study, args.workers), left, gated=gated)
            print("\n".join(plan.lines(projected)))
            print("preflight OK: nothing written")
            return 0
    if args.new_study:
        with runs.own():  # no other sweep runs it
            aside = runs.set_aside(aside)
        if aside is not None:
            print(f"study {study.name}: the earlier study moved to {aside}; starting afresh", flush=True)
    with runs.own() or contextlib.nullcontext():  # one sweep command per study
        study = with_added_seeds(study, stores, args.add_seeds or 0)
        if shapes is not None and study.added_seeds:  # seeds added now or by an earlier `--add-seeds`: projected too
            shapes = preflight.with_trials_of(shapes, study)
        return run(study, stores, args.workers, shapes, gated=not (args.no_gate or gate.turned_off()))
