"""What TensorBoard shows of a run and of the log directory it belongs to.

A run logs through :class:`RunLogger` (Lightning's ``TensorBoardLogger`` without its ``epoch`` scalar, which is 0
for the whole of a run that validates within one long epoch). A new run records:

- its hyper-parameters as the HPARAMS tab's session start, with no metric value: the tab reads each metric from the
  run's own ``hp/*`` scalars (placeholders would draw NaN points at step 0);
- a custom-scalars chart per objective (:func:`objective_layout`): the fixed sample's ``val_sample/<name>`` and the
  no-context level ``no_context/<name>`` of every run in one chart; a run's last lines print the address that opens
  the time series on the same two cards, pinned and unsmoothed (:func:`objective_link`);
- the log directory's experiment config (:func:`write_experiment`), at the log directory's root: the experiment's
  folder for a single run (``runs/bytes_mlm``), the study's folder for a study's trials and its control's. It marks
  the axes (a study's parameters, a single run's overrides, and every hyper-parameter whose value differs between
  the directory's runs) as differing, which the tab lists first (then by name) and ticks, gives text and boolean
  values their discrete domain (the values seen), and lists every metric any run of the directory declared, so a
  directory that mixes tasks keeps every objective's column. Each new run merges its own into it, one process at
  a time (``fcntl.flock`` on the folder); the merged record is ``.hparams.json`` beside it, and the events
  file is replaced whole, atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence
from urllib.parse import quote, urlencode

from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hp
from tensorboard.summary.writer.record_writer import RecordWriter

from foundation.atomic import atomic_write, write_json
from foundation.checked import read_json
from foundation.confined import check_inside
from foundation.errors import ConfigError
from foundation.rundir import values_name

HOST, PORT = "127.0.0.1", 6006  # where `tensorboard --host 127.0.0.1` serves, at its default port
STATE = ".hparams.json"
EXPERIMENT_SUFFIX = ".experiment"  # the experiment config's events file: events.out.tfevents.<seconds>.experiment
DROPPED = ("epoch",)  # Lightning's scalars that say nothing here
# A sweep's bookkeeping (sweep/trial differs between every two trials) and the experiment's name (a study's and its
# control's differ; the control's role column says which is which): never an axis.
NOT_AXES = ("sweep/", "experiment")
NOT_APPLICABLE = "–"  # the value a run shows in a column of its log directory that does not apply to it
# A study's trial: its control role (the study's own trials: STUDY), seed and number, as sweeps/ passes them
CONTROL, STUDY, SEED, TRIAL = "control", "study", "seed", "sweep/trial"
# A budget curve's run (sweeps/run/trunks.py): its trunk ("trunk") or a budget's cooldown ("x1", "x4", ...). Each is
# an HPARAMS session of its own, so that the tab can show one budget's points side by side.
BUDGET = "budget"


@dataclass(frozen=True)
class LogPlace:
    """Where a run's HPARAMS experiment config goes (``root``; None: the run directory's parent) and the columns it
    lists first (``axes``: a single run's overrides, a study's parameters)."""

    root: Optional[Path] = None
    axes: tuple[str, ...] = ()
    # The columns some runs of the log directory lack (full attention has no ``k``, a study's arms no control role),
    # each with the value such a run shows (:func:`filled`): TensorBoard's table and parallel coordinates drop every
    # run without a value for a shown column.
    fill: tuple[tuple[str, str], ...] = ()
    # Trial IDs of a study's trials (:func:`trial_id`), not their folders: the study's long name, which every trial
    # shares, would fill the tab's column ("random_vs_lear…")
    trial_ids: bool = False


def filled(params: dict[str, Any], fill: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``params`` with a value in every column of ``fill``: the column's own where the run has one, as text (one
    column holds one type: its domain is the text values seen), else the column's filler."""
    out = dict(params)
    for name, filler in fill:
        out[name] = str(out[name]) if name in out else filler
    return out


def log_roots(run_dir: Path, output_dir: Path, log: LogPlace, params: dict[str, Any]) -> tuple[list[Path], str]:
    """The log directory whose HPARAMS tab lists the run (``log.root`` or the run directory's parent), and the run's
    Trial ID: a study's trial by its arm, seed and number (``log.trial_ids``: :func:`trial_id`), else its folder
    under ``output_dir`` when it is inside it (``bytes_mlm/version_0``), else under the log directory, after a single
    run's overrides (``kind=full bytes_mlm/version_1``) unless its folder already says them
    (``bytes_mlm/kind=full/version_0``: a run below a folder of the log directory).

    Only there: TensorBoard takes the first experiment config it finds among the runs it shows, so a config in
    ``output_dir`` too would compete with the experiments' and studies' own when ``--logdir runs`` shows several."""
    root = Path(log.root or run_dir.parent)
    if log.trial_ids and TRIAL in params:
        return [root], trial_id(params, log.axes)
    inside = output_dir.resolve() in run_dir.resolve().parents
    name = Path(os.path.relpath(run_dir.resolve(), (output_dir if inside else root).resolve())).as_posix()
    if log.axes and run_dir.resolve().parent == root.resolve():
        name = f"{values_name({a: params[a] for a in log.axes if a in params})} {name}"
    return [root], name


def trial_id(params: dict[str, Any], axes: Sequence[str]) -> str:
    """A study's trial as the HPARAMS tab's Trial ID, short enough for its column: a control trial by its role, any
    other by its arms' values, then its seed and number (``degraded s0 #2``, ``random s3 #11``), and a budget curve's
    run its place on the curve (``random s3 #11 x4``, ``random s3 #11 trunk``)."""
    role = params.get(CONTROL)
    shown = (
        [role]
        if role not in (None, STUDY)
        else [params[a] for a in axes if a in params and a not in (CONTROL, SEED, BUDGET)]
    )
    seed = [f"s{params[SEED]}"] if SEED in params else []
    budget = [str(params[BUDGET])] if BUDGET in params else []
    return " ".join([*(str(v) for v in shown if v != NOT_APPLICABLE), *seed, f"#{params[TRIAL]}", *budget])


class RunLogger(TensorBoardLogger):
    """Lightning's TensorBoard logger without the scalars of :data:`DROPPED`."""

    def log_metrics(self, metrics: dict[str, Any], step: Optional[int] = None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if k not in DROPPED}, step)


def objective_layout(metric: str, level: Optional[str]) -> dict[str, dict[str, list]]:
    """The custom-scalars chart of ``metric`` (``val/masked_loss``): the fixed sample's curve (about 20 points a run)
    and the no-context level. The full set's two or three validations stay on their own card: smoothed as a line of
    two points, they would be drawn far from their values."""
    name = metric.removeprefix("val/")
    tags = [f"^val_sample/{name}$", *([f"^{level}$"] if level else [])]
    title = f"{name}: fixed validation sample" + (", no-context level" if level else "")
    return {"objective": {title: ["Multiline", tags]}}


def objective_link(metric: str, level: Optional[str], port: int = PORT) -> str:
    """The address that opens TensorBoard's time series on ``metric``'s sample curve and its no-context level, pinned
    first, unsmoothed (its ``smoothing`` and ``pinnedCards`` query parameters)."""
    name = metric.removeprefix("val/")
    cards = [{"plugin": "scalars", "tag": t} for t in (f"val_sample/{name}", *([level] if level else []))]
    pinned = json.dumps(cards, separators=(",", ":"))
    query = urlencode({"smoothing": 0, "pinnedCards": pinned}, safe="[]{}:,/", quote_via=quote)
    return f"http://{HOST}:{port}/?{query}#timeseries"


def record_run(
    logger: TensorBoardLogger,
    roots: Sequence[Path],
    params: dict[str, Any],
    metrics: Sequence[str],
    axes: Sequence[str],
    layout: dict[str, dict[str, list]],
    name: str,
) -> None:
    """A new run's HPARAMS session start (``params``, no metric value; the tab's "Trial ID" ``name``) and
    custom-scalars ``layout`` in its events, its ``hparams.yaml``, and its share of the experiment config at each of
    ``roots`` (:func:`write_experiment`)."""
    logger.log_hyperparams(params)  # hparams.yaml; with no metrics and no default one, nothing in the events
    writer = logger.experiment
    shown = as_shown(params)
    writer._get_file_writer().add_summary(hp.hparams_pb(shown, trial_id=name, start_time_secs=time.time()))
    writer.add_custom_scalars(layout)
    for root in roots:
        write_experiment(root, shown, metrics, axes)


def as_shown(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as the HPARAMS tab shows them: the seed as text. The tab prints a number in five significant
    digits, so seeds 100000 and 100001 would both read 1.0000e+5; as text each reads as itself, and the tab lists
    the seeds seen as a filter."""
    return {k: (str(v) if k == SEED and not isinstance(v, bool) else v) for k, v in params.items()}


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """``root`` (made if missing) locked by this process (``flock`` on the folder itself) while the body runs."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def merged(state: dict[str, Any], params: dict[str, Any], metrics: Sequence[str], axes: Sequence[str]) -> dict:
    """The experiment record ``state`` (``{"values": {name: [value, ...]}, "axes": [...], "metrics": [...]}``) with
    one more run's ``params``, ``metrics`` and ``axes`` in it."""
    values = {k: list(v) for k, v in state.get("values", {}).items()}
    for name, value in params.items():
        seen = values.setdefault(name, [])
        if not any(type(v) is type(value) and v == value for v in seen):  # (True == 1, yet not the same value)
            seen.append(value)
    known_axes = list(state.get("axes", []))
    known_metrics = list(state.get("metrics", []))
    return {
        "values": values,
        "axes": known_axes + [a for a in axes if a in params and a not in known_axes],
        "metrics": known_metrics + [m for m in metrics if m not in known_metrics],
    }


def well_formed(state: Any) -> bool:
    """Whether ``state`` is an experiment record as :func:`merged` makes it: ``values`` a mapping of names to lists of
    scalars (or nulls), ``axes`` and ``metrics`` lists of names (an edited ``"axes": "seed"`` is not)."""
    if not isinstance(state, dict) or not isinstance(state.get("values", {}), dict):
        return False
    values = state.get("values", {})
    names = [state.get("axes", []), state.get("metrics", [])]
    if not all(isinstance(seen, list) for seen in [*values.values(), *names]):
        return False
    scalars = [v for seen in values.values() for v in seen]
    return all(v is None or isinstance(v, (str, int, float)) for v in scalars) and all(
        isinstance(name, str) for name in [*values, *names[0], *names[1]]
    )


def check_record(root: Path) -> None:
    """Before a new run's folder is made: its share of the experiment config at ``root`` can be written, the record
    ``.hparams.json`` and the experiment's events file, where there, files inside ``root`` (no link, no folder); one
    line otherwise. A record whose content is unreadable or of another form is made anew (:func:`write_experiment`)."""
    root = Path(root)
    if not root.is_dir():
        return
    for path in [root / STATE, *root.glob(f"events.out.tfevents.*{EXPERIMENT_SUFFIX}")]:
        check_inside(root, path)  # a link is one line
        if path.exists() and not path.is_file():
            raise ConfigError(
                f"{path}: a folder where the HPARAMS record of the runs in {root} belongs (a file); remove it or move "
                "it aside"
            )


def varied(state: dict[str, Any]) -> list[str]:
    """The axes: the recorded ones (overrides, a study's parameters), then every hyper-parameter with two values
    that apply between the directory's runs (:data:`NOT_AXES` aside; a column that only applies to some runs, as
    Linformer's options beside full attention, is told by the kind's column). The tab sorts them by name and ticks
    the first five."""
    values = state["values"]
    return [a for a in state["axes"] if a in values] + [
        k
        for k, v in values.items()
        if len([x for x in v if x != NOT_APPLICABLE]) > 1 and k not in state["axes"] and not k.startswith(NOT_AXES)
    ]


def columns(state: dict[str, Any]) -> list[str]:
    """The HPARAMS columns: the axes (:func:`varied`), then the rest, in first-seen order."""
    first = varied(state)
    return first + [k for k in state["values"] if k not in first]


def _hparam(name: str, seen: list) -> hp.HParam:
    """Text and booleans get their discrete domain (the values seen); numbers none (the tab filters by range)."""
    if all(isinstance(v, bool) for v in seen):
        return hp.HParam(name, hp.Discrete(sorted(set(seen))))
    if all(isinstance(v, str) for v in seen):
        return hp.HParam(name, hp.Discrete(sorted(set(seen))))
    return hp.HParam(name)


def experiment_events(state: dict[str, Any]) -> bytes:
    """The events file that holds the experiment config of ``state``."""
    summary = hp.hparams_config_pb(
        [_hparam(name, state["values"][name]) for name in columns(state)],
        [hp.Metric(m) for m in state["metrics"]],
        time_created_secs=time.time(),
    )
    # The tab orders its columns by `differs` (True first), then by name, and ticks the first ones: the axes.
    content = summary.value[0].metadata.plugin_data
    data = plugin_data_pb2.HParamsPluginData.FromString(content.content)
    axes = set(varied(state))
    for info in data.experiment.hparam_infos:
        info.differs = info.name in axes
    content.content = data.SerializeToString()
    out = io.BytesIO()
    records = RecordWriter(out)
    records.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
    records.write(event_pb2.Event(wall_time=time.time(), step=0, summary=summary).SerializeToString())
    return out.getvalue()


def write_experiment(root: Path, params: dict[str, Any], metrics: Sequence[str], axes: Sequence[str]) -> None:
    """Merge one run into the experiment config at ``root``: ``.hparams.json`` and a new events file that replaces
    the earlier one (module docstring)."""
    root = Path(root)
    with _locked(root):
        try:
            state = read_json(root / STATE) if (root / STATE).is_file() else {}
        except ConfigError:  # unreadable (not this code's): the runs from here on make it anew
            state = {}
        state = merged(state if well_formed(state) else {}, params, metrics, axes)  # (of another form: made anew)
        write_json(root / STATE, state, root)
        earlier = sorted(root.glob(f"events.out.tfevents.*{EXPERIMENT_SUFFIX}"))
        path = root / f"events.out.tfevents.{time.time():.6f}{EXPERIMENT_SUFFIX}"  # (sorted as TensorBoard's names)
        data = experiment_events(state)
        atomic_write(path, lambda f: f.write(data), root)
        for old in earlier:
            if old != path:
                old.unlink(missing_ok=True)
