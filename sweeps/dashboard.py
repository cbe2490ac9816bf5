"""``linformer-lab dashboard STUDY.yaml [--preset P] [--storage URL] [--replicate] [--host H] [--port N]``: Optuna's
dashboard (optuna-dashboard) on a study and its control, both in one page's list of studies, read only.

A journal study keeps its control in a second journal (``<study dir>/control/journal.log``, beside
``<study dir>/journal.log``): ``optuna-dashboard <study dir>/journal.log`` shows the study alone, blank while the
control runs first. This command opens every journal of the study that exists and serves them through one storage,
:class:`ReadOnlyStudies`, which numbers their studies and trials apart and refuses every write: the workers of a
running sweep append to those journals, and nothing here writes to them (the dashboard's notes and its buttons that
tell a trial fail with one line). An RDB study (``--storage URL``) holds its control in the same database: the two
are served through the same read-only storage, the database's other studies left out. The page refreshes what the
storages hold as the workers append.

The objectives carry their names (``val/masked_loss``, not "Objective 0"): the ``sweep`` command stores them on
every study and its control (:func:`sweeps.stored.name_metrics`); a study stored before they were is shown with the
study file's names. A trial interrupted by SIGTERM or Ctrl-C is a failed trial to Optuna, which has no other state
for it: its user attr ``interrupted`` says so and names the trial that continues it (:mod:`sweeps.run.trials`), and
the page shows it as the trial's note ("Interrupted, not failed").
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import socket
import wsgiref.simple_server
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from foundation.errors import ConfigError, check_number
from sweeps import stored
from sweeps.spec.study import Study, load_study

HOST = "127.0.0.1"
PORT = 8080
# Where Optuna keeps a study's metric names (``Study.set_metric_names``), which optuna-dashboard reads.
METRIC_NAMES = "study:metric_names"
# optuna-dashboard's keys of a trial's note (Markdown, shown above the trial's details), in the study's system attrs;
# tests/sweeps/test_dashboard.py checks them through the dashboard's own API.
NOTE_VERSION, NOTE_TEXT = "dashboard:{trial_id}:note_ver", "dashboard:{trial_id}:note_str:0"


class ReadOnly(RuntimeError):
    """A write asked of :class:`ReadOnlyStudies`."""


def _refuse(self: "ReadOnlyStudies", *args: Any, **kwargs: Any) -> Any:
    raise ReadOnly("linformer-lab dashboard is read only: the study's workers write its storage")


class ReadOnlyStudies(BaseStorage):
    """Several Optuna storages (a study's journal and its control's) as one, read only. Study and trial ids are
    numbered apart: the id ``i`` of storage ``k`` of ``n`` is ``i * n + k``. ``names``: each study's metric names by
    study name, shown where the stored study has none; when given, the studies listed are these alone (a database
    holds others)."""

    def __init__(self, storages: Sequence[BaseStorage], names: Optional[dict[str, list[str]]] = None) -> None:
        self.storages, self.names = list(storages), dict(names or {})

    def _split(self, any_id: int) -> tuple[BaseStorage, int]:
        return self.storages[any_id % len(self.storages)], any_id // len(self.storages)

    def _join(self, local: int, storage: BaseStorage) -> int:
        return local * len(self.storages) + self.storages.index(storage)

    def _shown(self, storage: BaseStorage, local: int, system_attrs: dict[str, Any]) -> dict[str, Any]:
        """A study's system attrs as the dashboard is shown them: its metric names where it has none stored, and a
        note on each interrupted trial (Optuna has no state for it: the dashboard says "Fail")."""
        shown, name = dict(system_attrs), storage.get_study_name_from_id(local)
        if METRIC_NAMES not in shown and name in self.names:
            shown[METRIC_NAMES] = self.names[name]
        for t in storage.get_all_trials(local, deepcopy=False):
            if stored.INTERRUPTED in t.user_attrs:
                number = self._join(t._trial_id, storage)
                shown[NOTE_VERSION.format(trial_id=number)] = 1
                shown[NOTE_TEXT.format(trial_id=number)] = (
                    f"**Interrupted, not failed**: {t.user_attrs[stored.INTERRUPTED]}. Optuna has no state for an "
                    'interrupted trial, hence "Fail"; it does not count toward the budget.'
                )
        return shown

    def _trial(self, trial: FrozenTrial, storage: BaseStorage) -> FrozenTrial:
        """A trial as the page shows it: numbered apart, its attributes as text (:func:`as_text`), and as its
        intermediate values where it reported none: a budget-curve trial's cooldown points (its objective at each
        budget, at that budget's step), any other trial's learning curve (the objective's sample curve from its
        TensorBoard events, :func:`training.sample_curve.run_curve`)."""
        shown = copy.copy(trial)
        shown._trial_id = self._join(trial._trial_id, storage)
        shown.user_attrs = {k: as_text(v) for k, v in trial.user_attrs.items()}
        run_dir, metric = trial.user_attrs.get("run_dir"), self._metric()
        points = stored.points_of(trial)
        if not trial.intermediate_values and points and isinstance(points, dict) and metric:
            # a budget-curve trial: its cooldown point at each budget, at that budget's step (its curve over budget)
            shown.intermediate_values = {
                int(p["global_step"]): float(p[metric])
                for p in points.values()
                if isinstance(p, dict) and metric in p and "global_step" in p
            }
        elif not trial.intermediate_values and isinstance(run_dir, str) and metric and Path(run_dir).is_dir():
            from training.sample_curve import run_curve

            curve = run_curve(run_dir, metric)
            if curve is not None:
                shown.intermediate_values = {int(step): float(v) for step, v in zip(*curve)}
        return shown

    def _metric(self) -> Optional[str]:
        """The objective whose curve a trial shows: the first metric of the studies (a study's and its control's)."""
        first = next(iter(self.names.values()), [])
        return first[0] if first and str(first[0]).startswith("val/") else None

    # --------------------------------------------------------------------------- studies
    def get_all_studies(self) -> list:  # Optuna's FrozenStudy, whose module is private
        shown = []
        for storage in self.storages:
            for one in storage.get_all_studies():
                if self.names and one.study_name not in self.names:  # a database's other studies
                    continue
                one = copy.copy(one)
                one.system_attrs = self._shown(storage, one._study_id, one.system_attrs)
                one.user_attrs = {k: as_text(v) for k, v in one.user_attrs.items()}
                one._study_id = self._join(one._study_id, storage)
                shown.append(one)
        return sorted(shown, key=lambda s: s._study_id)

    def get_study_id_from_name(self, study_name: str) -> int:
        for storage in self.storages:
            try:
                return self._join(storage.get_study_id_from_name(study_name), storage)
            except KeyError:
                continue
        raise KeyError(f"no study {study_name}")

    def get_study_name_from_id(self, study_id: int) -> str:
        storage, local = self._split(study_id)
        return storage.get_study_name_from_id(local)

    def get_study_directions(self, study_id: int) -> list[optuna.study.StudyDirection]:
        storage, local = self._split(study_id)
        return storage.get_study_directions(local)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        storage, local = self._split(study_id)
        return {k: as_text(v) for k, v in storage.get_study_user_attrs(local).items()}

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        storage, local = self._split(study_id)
        return self._shown(storage, local, storage.get_study_system_attrs(local))

    # --------------------------------------------------------------------------- trials
    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        storage, local = self._split(study_id)
        return self._join(storage.get_trial_id_from_study_id_trial_number(local, trial_number), storage)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        storage, local = self._split(trial_id)
        return self._trial(storage.get_trial(local), storage)

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Optional[Sequence[TrialState]] = None
    ) -> list[FrozenTrial]:
        storage, local = self._split(study_id)
        return [self._trial(t, storage) for t in storage.get_all_trials(local, deepcopy=deepcopy, states=states)]

    # --------------------------------------------------------------------------- writes: refused
    create_new_study = delete_study = set_study_user_attr = set_study_system_attr = _refuse
    create_new_trial = set_trial_param = set_trial_state_values = set_trial_intermediate_value = _refuse
    set_trial_user_attr = set_trial_system_attr = _refuse


LONG = 600  # an attribute's text beyond this (the study's identity) is named by its keys: the page would cut it


def as_text(value: Any) -> Any:
    """An attribute as the page shows it: text and numbers as they are, a mapping as ``key: value`` pairs on one line
    joined by semicolons (the page's table folds line breaks into spaces, which ran one pair's value into the next
    key; numbers to 4 significant figures; a long one by its keys), a list joined by commas; nothing of JSON's
    escapes (``\\u2265``)."""
    if isinstance(value, dict):
        text = "; ".join(f"{k}: {as_text(v)}" for k, v in value.items())
        return text if len(text) <= LONG else f"{', '.join(map(str, value))} (a record of {len(text):,} characters)"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(as_text(v)) for v in value)
    if isinstance(value, float):
        return float(f"{value:.4g}")
    return value


WRITES = ("POST", "PUT", "PATCH", "DELETE")
REFUSAL = (
    "linformer-lab dashboard is read only: the study's workers write its storage; change a study with "
    "`linformer-lab sweep`"
)
BANNER = (
    '<div style="position:fixed;left:0;right:0;bottom:0;z-index:99999;background:#fff3cd;color:#5c4400;'
    'padding:6px 12px;font:14px sans-serif;border-top:1px solid #e0c36a">Read only: this page shows a linformer-lab '
    "study and its control as their workers write them; it creates, deletes, renames and edits nothing "
    "(<code>linformer-lab sweep</code> changes a study). A trial's intermediate values are its objective's sample "
    "curve; a budget-curve trial's are its cooldown points, one at each budget's step.</div>"
)
# The page's write buttons, hidden by their labels as the page draws them (refused anyway). A script file of this
# server's own: the page's Content-Security-Policy runs no inline script.
HIDE_PATH = "/linformer-lab/read-only.js"
HIDE = (
    "new MutationObserver(function(){document.querySelectorAll('button,[role=menuitem]').forEach(function(b){"
    "var t=(b.innerText||b.getAttribute('aria-label')||b.getAttribute('title')||'').trim();"
    "if(/^(create study|create|delete|delete study|rename|rename study|edit|save|mark as (complete|failed|pruned)"
    "|fail trial|complete trial|prune trial|tell|upload|upload artifact)$/i.test(t)){b.style.display='none';}});})"
    ".observe(document.documentElement,{childList:true,subtree:true});"
)
STUDY_PAGE = re.compile(r"^/api/studies/(\d+)$")
IMPORTANCES = re.compile(r"^/api/studies/(\d+)/param_importances$")


def _json(start_response: Callable, status: str, body: dict) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def _replicates(study: Study) -> bool:
    """Whether a study's trials are replicates of their arms (a grid with several seeds; a control): no best trial."""
    return study.parent is not None or (study.is_grid and len(study.seeds) > 1)


def read_only(app: Callable, view: ReadOnlyStudies, study: Study) -> Callable:
    """optuna-dashboard's WSGI ``app`` served read only: every write refused with a 403 and one line (the page keeps
    no write button it can find, and says it is read only), parameter importance over each study's arms alone
    (:func:`sweeps.control.arm_importance`: never the seed; an arm that explains nothing beyond the seed spread left
    out), and no best trial for a study of replicate seeds."""
    by_name = {one.name: one for one in study.studies}

    def one_of(study_id: str) -> Optional[Study]:
        try:
            return by_name.get(view.get_study_name_from_id(int(study_id)))
        except (KeyError, IndexError, ValueError):
            return None

    def serve(environ: dict, start_response: Callable) -> Iterable[bytes]:
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "")
        if method in WRITES:
            return _json(start_response, "403 Forbidden", {"reason": REFUSAL})
        if path == HIDE_PATH:
            data = HIDE.encode()
            start_response("200 OK", [("Content-Type", "text/javascript"), ("Content-Length", str(len(data)))])
            return [data]
        if (found := IMPORTANCES.match(path)) and (one := one_of(found.group(1))) is not None:
            return _json(start_response, "200 OK", {"param_importances": importances(view, int(found.group(1)), one)})
        captured: dict[str, Any] = {}

        def keep(status: str, headers: list, exc_info: Any = None) -> Callable:
            captured.update(status=status, headers=headers)
            return lambda data: None

        body = b"".join(app(environ, keep))
        kind = dict((k.lower(), v) for k, v in captured["headers"]).get("content-type", "")
        if kind.startswith("text/html"):
            body = body.replace(b"<body>", f'<body>{BANNER}<script src="{HIDE_PATH}"></script>'.encode(), 1)
        elif (found := STUDY_PAGE.match(path)) and captured["status"].startswith("200"):
            one = one_of(found.group(1))
            if one is not None and _replicates(one):
                detail = json.loads(body)
                detail["best_trials"] = []
                body = json.dumps(detail).encode()
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        start_response(captured["status"], [*headers, ("Content-Length", str(len(body)))])
        return [body]

    return serve


def importances(view: ReadOnlyStudies, study_id: int, study: Study) -> list[list[dict]]:
    """The page's parameter importances of ``study`` (one list per objective): its arms only; an arm that explains
    nothing beyond the seed spread as a bar of 0 whose name says so."""
    from sweeps.control import arm_importance

    trials = view.get_all_trials(study_id, deepcopy=False)
    out = []
    for i, _ in enumerate(study.metrics):
        found = arm_importance(study, trials, i)
        named = {**found.importances, **{f"{p}: nothing beyond the seed spread": 0.0 for p in found.nothing}}
        out.append([{"name": p, "importance": v, "distribution": "CategoricalDistribution"} for p, v in named.items()])
    return out


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    """The server's request handler without a line per request on the console."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def served(study: Study, url: Optional[str]) -> tuple[ReadOnlyStudies, list[str]]:
    """The storage the dashboard serves for ``study`` (its control's included) and one line per study it holds. A
    study of the file that has not run yet is left out (the line says so); none at all is one ConfigError line."""
    names = {one.name: list(one.metrics) for one in study.studies}
    if url is not None:
        storages = [stored.open_storage(study, url, create=False)]
    else:  # each journal that exists, opened to read: nothing is created
        storages = [stored.open_storage(one, None) for one in study.studies if (one.root / stored.JOURNAL).is_file()]
    if not storages:
        raise ConfigError(
            f"{study.root / stored.JOURNAL}: no study journal here; run `linformer-lab sweep {study.file_args}` first"
        )
    view, lines = ReadOnlyStudies(storages, names), []
    held = {s.study_name for s in view.get_all_studies()}
    for one in study.studies:
        role = "control" if one.parent is not None else "study"
        where = stored.storage_display(one, url)
        if one.name not in held:
            lines.append(f"  {role} {one.name}: not run yet ({where})")
            continue
        ostudy = optuna.load_study(study_name=one.name, storage=view)
        holder = next(st for st in storages if one.name in {x.study_name for x in st.get_all_studies()})
        stored.check_objective(one, optuna.load_study(study_name=one.name, storage=holder), url)  # as stored
        lines.append(f"  {role} {one.name}: {counts(ostudy.trials)}; objective {', '.join(one.metrics)} ({where})")
    return view, lines


def counts(trials: list[FrozenTrial]) -> str:
    """``7 trials: 5 complete, 1 interrupted, 1 waiting``: a study's trials by state, interrupted ones apart."""
    states = [
        "interrupted"
        if stored.INTERRUPTED in t.user_attrs
        else "failed"
        if t.state == TrialState.FAIL
        else t.state.name.lower()
        for t in trials
    ]
    by_state = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(sorted(states)))
    return f"{len(trials)} trial{'' if len(trials) == 1 else 's'}" + (f": {by_state}" if trials else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study file, e.g. sweeps/random_vs_learned.yaml")
    parser.add_argument("--preset", help="preset of the study file (default: cpu when it has one)")
    parser.add_argument("--storage", help="Optuna RDB URL the study runs on (default: its journal files)")
    parser.add_argument("--replicate", action="store_true", help="show the study's replication (sweep --replicate)")
    parser.add_argument(
        "--budget", type=float, metavar="F", help="show the study re-asked at F times its steps (sweep --budget F)"
    )
    parser.add_argument(
        "--budgets",
        metavar="F1,F2,...",
        help="show the study's budget curves (sweep --budgets): a trial per seed and arm, its trunk's curve",
    )
    parser.add_argument("--host", default=HOST, help=f"address to listen on (default {HOST}: this machine only)")
    parser.add_argument("--port", type=int, default=PORT, help=f"port to listen on (default {PORT})")


def main(args: argparse.Namespace) -> int:
    check_number("--port", args.port, 1, 65535, integer=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(args.study, args.preset, replicate=args.replicate, factor=args.budget, curve=args.budgets)
    view, lines = served(study, args.storage)
    import optuna_dashboard

    app = read_only(optuna_dashboard.wsgi(view), view, study)
    check_port(args.host, args.port)  # before the address is printed
    try:
        server = wsgiref.simple_server.make_server(args.host, args.port, app, handler_class=_QuietHandler)
    except OSError as err:  # taken between the check and the server's start
        raise _cannot_listen(args.host, args.port, err) from None
    print(f"dashboard: http://{args.host}:{args.port}/dashboard  (read only; Ctrl-C stops it)", flush=True)
    print("\n".join(lines), flush=True)
    with server:
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0


def check_port(host: str, port: int) -> None:
    """``host:port`` takes a listening server: bound once as the server binds it (address reuse on, as Python's HTTP
    servers set it) and let go; one line when another program listens there or the address is not this machine's."""
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[:1]:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
    except OSError as err:
        raise _cannot_listen(host, port, err) from None


def _cannot_listen(host: str, port: int, err: OSError) -> ConfigError:
    return ConfigError(
        f"--host {host} --port {port}: cannot listen there ({err.strerror or err}); choose another --port"
    )
