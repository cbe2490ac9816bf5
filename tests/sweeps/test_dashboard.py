"""The ``dashboard`` command (sweeps/dashboard.py): optuna-dashboard on a study and its control at once, their
objectives named, read only; asked through the dashboard's own WSGI app, as the browser asks it."""

from __future__ import annotations

import json
import socket
import warnings
import wsgiref.util

import optuna
import optuna_dashboard
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from studies import ARMS, CONTROL, write_study

from experiments import cli
from sweeps import stored
from sweeps.dashboard import METRIC_NAMES, ReadOnly, served
from sweeps.run.command import open_study
from sweeps.run.storage import RunStorage
from sweeps.spec import identity
from sweeps.spec.study import load_study


def ask(app, path: str) -> tuple[str, dict]:
    """GET ``path`` of a WSGI app: its status line and JSON body."""
    environ: dict = {"PATH_INFO": path}
    wsgiref.util.setup_testing_defaults(environ)
    status = []
    body = b"".join(app(environ, lambda line, headers, exc_info=None: status.append(line)))
    return status[0], json.loads(body)


def add(ostudy: optuna.Study, params: dict, value: float) -> None:
    dists = {p: CategoricalDistribution([v]) for p, v in params.items()}
    ostudy.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))


def study_file(tmp_path, tiny_overrides):
    path = write_study(
        tmp_path,
        tiny_overrides,
        "shown",
        {"seed": {"type": "categorical", "choices": [0, 1]}, "arm": {"choices": ARMS}},
        arms=["arm"],
        control=CONTROL,
    )
    return load_study(path)


def test_the_dashboard_lists_the_study_and_its_control_with_their_metric_names(tmp_path, tiny_overrides):
    study = study_file(tmp_path, tiny_overrides)
    add(open_study(RunStorage(study.control, None)), {"control": "reference", "seed": 0}, 2.5)
    ostudy = open_study(RunStorage(study, None))
    for seed, v in enumerate((3.0, 2.9)):
        add(ostudy, {"seed": seed, "arm": "full"}, v)
    words = "terminated (SIGTERM): put back, trial 3 continues it"
    ostudy.add_trial(
        optuna.trial.create_trial(
            params={"seed": 1, "arm": "linformer"},
            distributions={"seed": CategoricalDistribution([1]), "arm": CategoricalDistribution(["linformer"])},
            state=TrialState.FAIL,
            user_attrs={stored.INTERRUPTED: words},
        )
    )
    journals = {one.name: (one.root / stored.JOURNAL).read_bytes() for one in study.studies}

    view, lines = served(study, None)
    app = optuna_dashboard.wsgi(view)
    status, listed = ask(app, "/api/studies")
    assert status.startswith("200")
    ids = {s["study_name"]: s["study_id"] for s in listed["study_summaries"]}
    assert set(ids) == {study.name, study.control.name} and len(set(ids.values())) == 2
    for name, trials in ((study.name, 3), (study.control.name, 1)):
        status, detail = ask(app, f"/api/studies/{ids[name]}")
        assert status.startswith("200"), detail
        assert detail["objective_names"] == ["val/loss"]
        assert len(detail["trials"]) == trials
        assert len({t["trial_id"] for t in detail["trials"]}) == trials
    _, detail = ask(app, f"/api/studies/{ids[study.name]}")
    notes = {t["number"]: t["note"]["body"] for t in detail["trials"]}
    assert (
        notes[2]
        == f'**Interrupted, not failed**: {words}. Optuna has no state for an interrupted trial, hence "Fail"; it does not count toward the budget.'
    )
    assert notes[0] == ""
    assert lines[0].startswith(f"  control {study.control.name}: 1 trial: 1 complete; objective val/loss")
    assert lines[1].startswith(f"  study {study.name}: 3 trials: 2 complete, 1 interrupted; objective val/loss")
    with pytest.raises(ReadOnly):
        view.set_trial_user_attr(0, "note", "x")
    assert {one.name: (one.root / stored.JOURNAL).read_bytes() for one in study.studies} == journals


def test_a_study_stored_without_metric_names_gets_them_when_resumed_and_in_the_dashboard(tmp_path, tiny_overrides):
    study = study_file(tmp_path, tiny_overrides)
    for one in study.studies:  # stored as the sweep stored it before it named the objectives
        o = optuna.create_study(study_name=one.name, storage=stored.open_storage(one, None), directions=one.directions)
        o.set_user_attr("objective", stored.objective_of(one))
        o.set_user_attr(identity.IDENTITY, identity.identity_of(one))
        assert o.metric_names is None
    view, _ = served(study, None)
    assert all(view.get_study_system_attrs(s._study_id)[METRIC_NAMES] == ["val/loss"] for s in view.get_all_studies())
    for one in study.studies:
        open_study(RunStorage(one, None))  # what every sweep, resumed or replicated, opens its studies with
        reloaded = optuna.load_study(study_name=one.name, storage=stored.open_storage(one, None))
        assert reloaded.metric_names == ["val/loss"]


def test_optunas_metric_names_live_where_the_dashboard_view_supplies_them():
    storage = optuna.storages.InMemoryStorage()
    ostudy = optuna.create_study(study_name="named", storage=storage)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ostudy.set_metric_names(["val/masked_loss"])
    assert storage.get_study_system_attrs(storage.get_study_id_from_name("named"))[METRIC_NAMES] == ["val/masked_loss"]


def test_a_control_alone_is_shown_and_a_study_not_run_is_one_line(tmp_path, tiny_overrides, capsys):
    study = study_file(tmp_path, tiny_overrides)
    with pytest.raises(Exception, match="no study journal here; run `linformer-lab sweep"):
        served(study, None)
    assert cli.main(["dashboard", str(study.path), "--port", "0"]) == 2
    assert "--port: must be an integer in [1, 65535], got 0" in capsys.readouterr().err
    open_study(RunStorage(study.control, None))  # the control runs first
    view, lines = served(study, None)
    assert [s.study_name for s in view.get_all_studies()] == [study.control.name]
    assert lines[0].startswith(f"  control {study.control.name}: 0 trials; objective val/loss")
    assert lines[1].startswith(f"  study {study.name}: not run yet")


def test_a_database_study_is_shown_with_its_control_and_without_the_databases_other_studies(tmp_path, tiny_overrides):
    study = study_file(tmp_path, tiny_overrides)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    for one in study.studies:
        open_study(RunStorage(one, url))
    optuna.create_study(study_name="someone_elses", storage=url)
    view, lines = served(study, url)
    assert sorted(s.study_name for s in view.get_all_studies()) == sorted([study.name, study.control.name])
    assert all("0 trials; objective val/loss" in line for line in lines)


def test_the_dashboard_opens_a_study_at_a_larger_budget_as_the_sweep_prints_it(tmp_path, tiny_overrides, capsys):
    study = study_file(tmp_path, tiny_overrides)
    assert cli.main(["dashboard", str(study.path), "--budget", "4"]) == 2  # not run yet: one line, naming its flags
    err = capsys.readouterr().err
    assert "--budget 4" in err and err.count("\n") == 1, err
    larger = load_study(study.path, factor=4)
    open_study(RunStorage(larger.control, None))
    view, _ = served(larger, None)
    assert [s.study_name for s in view.get_all_studies()] == [larger.control.name]


def test_the_dashboard_opens_a_studys_budget_curves_as_the_sweep_names_them(tmp_path, tiny_overrides, capsys):
    study = study_file(tmp_path, tiny_overrides)
    assert cli.main(["dashboard", str(study.path), "--budgets", "1,2"]) == 2  # not run yet: one line, naming its flags
    err = capsys.readouterr().err
    assert "--budgets 1,2" in err and err.count("\n") == 1, err
    assert cli.main(["dashboard", str(study.path), "--budgets", "2,1"]) == 2  # checked as the sweep checks it
    assert "--budgets" in capsys.readouterr().err
    curves = load_study(study.path, curve="1,2")
    open_study(RunStorage(curves.control, None))
    view, _ = served(curves, None)
    assert [s.study_name for s in view.get_all_studies()] == [curves.control.name]
    assert curves.control.name != load_study(study.path).control.name  # the curve study's own, not the design's


def test_a_port_another_program_listens_on_is_only_the_error_line(tmp_path, tiny_overrides, capsys):
    study = study_file(tmp_path, tiny_overrides)
    open_study(RunStorage(study.control, None))
    with socket.create_server(("127.0.0.1", 0)) as busy:  # another program's server, on this machine only
        port = busy.getsockname()[1]
        assert cli.main(["dashboard", str(study.path), "--port", str(port)]) == 2
    out = capsys.readouterr()
    assert out.out == ""  # no address printed, no server started
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --host 127.0.0.1 --port {port}: cannot listen there (")


def call(app, method: str, path: str) -> tuple[str, bytes]:
    """``method path`` of a WSGI app: its status line and body."""
    environ: dict = {"PATH_INFO": path, "REQUEST_METHOD": method}
    wsgiref.util.setup_testing_defaults(environ)
    status = []
    body = b"".join(app(environ, lambda line, headers, exc_info=None: status.append(line)))
    return status[0], body


def served_read_only(study):
    from sweeps.dashboard import read_only

    view, _ = served(study, None)
    return read_only(optuna_dashboard.wsgi(view), view, study), view


def test_the_dashboard_refuses_every_write_in_one_line_and_says_it_is_read_only(tmp_path, tiny_overrides):
    study = study_file(tmp_path, tiny_overrides)
    open_study(RunStorage(study.control, None))
    add(open_study(RunStorage(study, None)), {"seed": 0, "arm": "full"}, 3.0)
    journals = {one.name: (one.root / stored.JOURNAL).read_bytes() for one in study.studies}
    app, view = served_read_only(study)
    (listed,) = [s for s in view.get_all_studies() if s.study_name == study.name]
    for method, path in (
        ("DELETE", f"/api/studies/{listed._study_id}"),
        ("POST", "/api/studies"),
        ("POST", f"/api/studies/{listed._study_id}/rename"),
        ("PUT", f"/api/studies/{listed._study_id}/note"),
        ("POST", f"/api/trials/{view.get_all_trials(listed._study_id)[0]._trial_id}/tell"),
    ):
        status, body = call(app, method, path)
        assert status.startswith("403"), (method, path, status)
        assert "read only" in json.loads(body)["reason"]
    assert {one.name: (one.root / stored.JOURNAL).read_bytes() for one in study.studies} == journals
    status, page = call(app, "GET", "/dashboard")
    assert status.startswith("200") and b"Read only" in page


def test_the_dashboard_ranks_the_arms_never_the_seed_and_shows_no_best_trial_of_replicates(tmp_path, tiny_overrides):
    study = study_file(tmp_path, tiny_overrides)
    ostudy = open_study(RunStorage(study, None))
    control = open_study(RunStorage(study.control, None))
    for seed, (full, linformer) in enumerate([(3.0, 2.0), (3.2, 2.1)]):
        add(ostudy, {"seed": seed, "arm": "full"}, full)
        add(ostudy, {"seed": seed, "arm": "linformer"}, linformer)
        # the control's roles explain nothing beyond the seeds: the seed moves both, their gap changes sign
        add(control, {"control": "reference", "seed": seed}, 1.0 + seed)
        add(control, {"control": "degraded", "seed": seed}, 1.05 + 0.9 * seed)
    app, view = served_read_only(study)
    ids = {s.study_name: s._study_id for s in view.get_all_studies()}
    _, ranked = ask(app, f"/api/studies/{ids[study.name]}/param_importances")
    assert [p["name"] for p in ranked["param_importances"][0]] == ["arm"]
    _, none = ask(app, f"/api/studies/{ids[study.control.name]}/param_importances")
    # the control's roles explain nothing beyond the seed spread: the chart says so, with a bar of 0
    assert none["param_importances"] == [
        [
            {
                "name": "control: nothing beyond the seed spread",
                "importance": 0.0,
                "distribution": "CategoricalDistribution",
            }
        ]
    ]
    _, detail = ask(app, f"/api/studies/{ids[study.name]}")
    assert detail["best_trials"] == [] and len(detail["trials"]) == 4


def one_trial_shown(study, value: float, user_attrs: dict) -> dict:
    """The page's JSON of the study's one trial (arm full, seed 0), stored with ``user_attrs``."""
    ostudy = open_study(RunStorage(study, None))
    ostudy.add_trial(
        optuna.trial.create_trial(
            params={"seed": 0, "arm": "full"},
            distributions={"seed": CategoricalDistribution([0]), "arm": CategoricalDistribution(["full"])},
            value=value,
            user_attrs=user_attrs,
        )
    )
    app, view = served_read_only(study)
    ids = {s.study_name: s._study_id for s in view.get_all_studies()}
    _, detail = ask(app, f"/api/studies/{ids[study.name]}")
    (trial,) = detail["trials"]
    return trial


def test_a_trial_shows_its_sample_curve_as_intermediate_values_and_its_attributes_as_text(tmp_path, tiny_overrides):
    from torch.utils.tensorboard import SummaryWriter

    study = study_file(tmp_path, tiny_overrides)
    run_dir = tmp_path / "run"
    with SummaryWriter(str(run_dir)) as writer:
        for step, value in ((5, 3.0), (10, 2.5), (15, 2.25)):
            writer.add_scalar("val_sample/loss", value, step)
    trial = one_trial_shown(study, 2.25, {"run_dir": str(run_dir), "metrics": {"val/loss": 2.2512345, "gate": "≥ 0.1"}})
    assert [(v["step"], v["value"]) for v in trial["intermediate_values"]] == [(5, 3.0), (10, 2.5), (15, 2.25)]
    attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
    assert attrs["metrics"] == "val/loss: 2.251; gate: ≥ 0.1"


def test_a_budget_curve_trial_shows_its_cooldown_points_as_intermediate_values(tmp_path, tiny_overrides):
    """A curve trial's run_dir is its largest budget's cooldown: its sample curve would show that cooldown alone.
    The page shows its point at every budget instead, at that budget's step: the trial's curve over budget."""
    study = study_file(tmp_path, tiny_overrides)
    metric = study.metrics[0]
    points = {"x1": {metric: 3.0, "global_step": 40}, "x2": {metric: 2.5, "global_step": 80}}
    points["x4"] = {metric: 2.4, "global_step": 160}
    attrs = {"run_dir": str(tmp_path / "nowhere"), "budget_points": points, "metrics": points["x4"]}
    trial = one_trial_shown(study, 2.4, attrs)
    assert [(v["step"], v["value"]) for v in trial["intermediate_values"]] == [(40, 3.0), (80, 2.5), (160, 2.4)]
