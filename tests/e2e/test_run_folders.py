"""A run or study folder is never left through a link, no lock outlives its owner, and a study or a resumed run is
refused when what decides its results changed (docs/reliability.md)."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from tiny import REPO, child_env

from experiments import cli
from foundation.atomic import atomic_write_text
from foundation.errors import ConfigError
from foundation.lock import Owner
from foundation.rundir import TOKENIZER
from sweeps import stored
from sweeps.run import storage
from sweeps.run.command import check_stored, open_study
from sweeps.run.storage import RunStorage
from sweeps.spec.study import load_study


def test_a_link_planted_in_a_folder_is_refused_and_its_target_never_written(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "outside.txt"
    run.mkdir()
    outside.write_text("someone else's file\n")
    (run / ".lock").symlink_to(outside)
    with pytest.raises(ConfigError, match=r"\.lock: a symbolic link"):
        Owner(run).record()
    (run / "checkpoints").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ConfigError, match="outside"):
        atomic_write_text(run / "checkpoints" / "last.ckpt", "weights", inside=run)
    assert outside.read_text() == "someone else's file\n" and not (tmp_path / "last.ckpt").exists()
    # The folder itself may be a link (runs -> /scratch/runs): only what lies inside it may not.
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "real").mkdir()
    atomic_write_text(tmp_path / "alias" / "config.yaml", "a: 1\n", inside=tmp_path / "alias")
    assert (tmp_path / "real" / "config.yaml").read_text() == "a: 1\n"


HOLD_AND_DIE = """
import os, signal, sys
from pathlib import Path
from foundation.lock import Owner
owner = Owner(Path(sys.argv[1]))
owner.record()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.processes
def test_a_lock_whose_owner_was_killed_is_taken_over_saying_so_in_one_line(tmp_path, capsys):
    died = subprocess.run([sys.executable, "-c", HOLD_AND_DIE, str(tmp_path)], cwd=REPO)
    assert died.returncode == -signal.SIGKILL
    with Owner(tmp_path, "run x") as owner:
        owner.record()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("run x: took over the lock of pid ")
    assert err[0].endswith("which ended without releasing it")
    Owner(tmp_path).release()  # released cleanly: nothing to take over
    assert capsys.readouterr().err == ""


# A worker SIGKILLed in the middle of a journal append, under the journal's lock, with the default relative runs/;
# and the symlink lock Optuna's own lock leaves behind in that case (its link, relative, dangles).
DIE_IN_AN_APPEND = """
import os, signal, sys
from sweeps import stored
from sweeps.spec.study import load_study
study = load_study(sys.argv[1])
backend_lock = stored.WholeLines(study.root / stored.JOURNAL)
backend_lock.acquire()
with open(study.root / stored.JOURNAL, "ab") as f:
    f.write(b'{"op_code": 5, "worker_id": "dead", "trial_id": 0, "par')
os.kill(os.getpid(), signal.SIGKILL)
"""
THEN_A_SWEEP_OPENS_IT = """
import sys
import time
from sweeps.run import storage
from sweeps.spec.study import load_study
from sweeps.run.command import open_study
from sweeps.run.storage import RunStorage
study = load_study(sys.argv[1])
with storage.RunStorage(study, None).own():
    open_study(RunStorage(study, None)).enqueue_trial({"seed": 1})
print("opened", len(open_study(RunStorage(study, None)).trials))
"""


@pytest.mark.processes
def test_a_worker_killed_during_a_journal_append_never_hangs_the_next_sweep(tmp_path, tiny_overrides):
    path = study_file(tmp_path, tiny_overrides, "killed_append", output_dir="runs")  # relative, as by default
    study = load_study(path)
    open_study(RunStorage(study, None)).enqueue_trial({"seed": 0})
    env = child_env()
    died = subprocess.run([sys.executable, "-c", DIE_IN_AN_APPEND, str(path)], cwd=tmp_path, env=env)
    assert died.returncode == -signal.SIGKILL
    optuna_lock = study.root / f"{stored.JOURNAL}.lock"
    if not os.path.lexists(optuna_lock):
        os.symlink(str(study.root / stored.JOURNAL), optuna_lock)  # Optuna's, relative: it dangles
    after = subprocess.run(
        [sys.executable, "-c", THEN_A_SWEEP_OPENS_IT, str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # the lock of a dead process used to make it wait for good, polling
    )
    assert after.returncode == 0 and "opened 2" in after.stdout, after.stderr[-2000:]
    assert "removed a torn last line" in after.stderr
    assert "removed Optuna's journal lock, left by a process that died" in after.stderr


# --------------------------------------------------------------------------------------- identity
def study_file(tmp_path: Path, tiny_overrides, name: str, base: Path = None, **overrides) -> Path:
    shared = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in tiny_overrides.args)}
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "study": name,
                "base": str(base or tiny_overrides.config),
                "overrides": {**shared, **overrides},
                "space": {"seed": {"type": "categorical", "choices": [0, 1]}},
                "sampler": {"kind": "grid"},
            }
        )
    )
    return path


def test_a_study_whose_overrides_base_or_data_changed_is_refused_listing_the_changes(tmp_path, tiny_overrides):
    base = tmp_path / "base.yaml"
    base.write_text(f"defaults: [{tiny_overrides.config}]\nmodel:\n  dropout: 0.1\n")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"review {i}: the film was long\n" for i in range(50)))
    path = study_file(tmp_path, tiny_overrides, "moving", base, **{"data.source": str(corpus)})
    open_study(RunStorage(load_study(path), None))
    check_stored(load_study(path), None)  # the same study: accepted

    study_file(tmp_path, tiny_overrides, "moving", base, **{"data.source": str(corpus), "optim.lr": 0.002})
    with pytest.raises(ConfigError, match=r"another identity: config\.optim\.lr: 0\.001 there, 0\.002 here"):
        check_stored(load_study(path), None)
    study_file(tmp_path, tiny_overrides, "moving", base, **{"data.source": str(corpus)})
    base.write_text(base.read_text().replace("0.1", "0.2"))  # the base file edited
    with pytest.raises(ConfigError, match=r"config\.model\.dropout: 0\.1 there, 0\.2 here"):
        check_stored(load_study(path), None)
    base.write_text(base.read_text().replace("0.2", "0.1"))
    with corpus.open("a") as f:  # the corpus edited
        f.write("one review more\n")
    with pytest.raises(ConfigError, match=r"another identity: data: '\w+' there, '\w+' here"):
        check_stored(load_study(path), None)


def test_an_init_of_auto_is_the_draw_it_resolves_to_in_a_studys_identity(tmp_path, tiny_overrides):
    """Linformer's ``init: auto`` stands for ``normal`` bidirectional and ``jl`` causal: a study recorded with
    either spelling is the study of the other, and a draw that differs from what it recorded is refused."""
    init = "model.attention.options.init"
    path = study_file(tmp_path, tiny_overrides, "drawn", **{init: "normal"})
    open_study(RunStorage(load_study(path), None))
    study_file(tmp_path, tiny_overrides, "drawn", **{init: "auto"})
    check_stored(load_study(path), None)  # auto is normal here: accepted
    study_file(tmp_path, tiny_overrides, "drawn", **{init: "jl"})
    with pytest.raises(ConfigError, match=r"config\.model\.attention\.options\.init: 'normal' there, 'jl' here"):
        check_stored(load_study(path), None)

    causal = {"task": "clm", "model.attention.causal": True}
    path = study_file(tmp_path, tiny_overrides, "drawn_causal", **causal, **{init: "auto"})
    open_study(RunStorage(load_study(path), None))
    study_file(tmp_path, tiny_overrides, "drawn_causal", **causal, **{init: "jl"})
    check_stored(load_study(path), None)  # auto is jl on the causal form
    study_file(tmp_path, tiny_overrides, "drawn_causal", **causal, **{init: "normal"})
    with pytest.raises(ConfigError, match=r"options\.init: 'jl' there, 'normal' here"):
        check_stored(load_study(path), None)


def test_a_study_of_the_same_name_that_another_program_made_is_refused_never_adopted(tmp_path, tiny_overrides, capsys):
    path = study_file(tmp_path, tiny_overrides, "theirs")
    study = load_study(path)
    theirs = optuna.create_study(study_name=study.name, storage=stored.open_storage(study, None))
    theirs.add_trial(
        optuna.trial.create_trial(
            params={"seed": 0}, distributions={"seed": optuna.distributions.IntDistribution(0, 1)}, value=0.123
        )
    )
    journal = (study.root / stored.JOURNAL).read_bytes()
    capsys.readouterr()
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was not created by linformer-lab" in err[0], err
    assert (study.root / stored.JOURNAL).read_bytes() == journal
    assert cli.main(["report", str(path)]) == 2


# --------------------------------------------------------------------------------------- resumed data
def test_a_run_resumed_on_an_edited_corpus_is_refused_and_its_tokenizer_kept(tmp_path, tiny_overrides, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"review {i}: the film was {'good' if i % 3 else 'bad'} and long\n" for i in range(400)))
    run = tmp_path / "run"
    args = [
        "train",
        str(tiny_overrides.config),
        *tiny_overrides.args,
        f"data.source={corpus}",
        f"run_dir={run}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
    ]
    assert cli.main(args) == 0
    tokenizer = (run / TOKENIZER).read_text()
    corpus.write_text(corpus.read_text().replace("film", "movie"))
    capsys.readouterr()
    assert cli.main([*args, "resume=true", "trainer.max_steps=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: resume: the data of") and "changed since it started" in err, err
    assert (run / TOKENIZER).read_text() == tokenizer
    assert not list(run.glob("metrics.step_*.json"))  # nothing of the run was touched


def test_a_resumed_run_never_replaces_its_tokenizer(tmp_path):
    from omegaconf import OmegaConf

    from training.resume import check_same_data

    run = tmp_path / "run"
    run.mkdir()
    (run / TOKENIZER).write_text('{"model": "the one it trained with"}')
    cfg = OmegaConf.create({"task": "recall", "data": {"source": "embedded"}})
    check_same_data(cfg, run, '{"model": "the one it trained with"}')
    with pytest.raises(ConfigError, match="tokenizer.json differs from the tokenizer the data gives now"):
        check_same_data(cfg, run, '{"model": "another"}')


def test_nested_interpolations_are_measured_not_built():
    from foundation.configfile import check_interpolations

    bomb = {"a": "x" * 100, **{f"k{i}": f"${{k{i - 1}}}" * 10 for i in range(1, 12)}, "k0": "${a}"}
    with pytest.raises(ConfigError, match="k4: its interpolations"):
        check_interpolations(bomb)
    check_interpolations({"a": "runs", "b": "${a}/x", "c": {"d": "${..b}${.e}", "e": "1"}})


# --------------------------------------------------------------------------------------- preempted studies
def sweep_process(path: Path, cwd: Path) -> subprocess.Popen:
    env = child_env(LINFORMER_LAB_HEARTBEAT_GRACE_S="5")
    return subprocess.Popen(
        [sys.executable, "-m", "experiments.cli", "sweep", str(path), "--workers", "2"],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a scheduler signals a job
    )


def finished_values(path: Path) -> dict[int, float]:
    study = load_study(path)
    trials = optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None, create=False)).trials
    excluded = stored.excluded_numbers(trials)
    counted = [t for t in trials if t.number not in excluded]
    assert [t.state for t in counted if t.state != optuna.trial.TrialState.COMPLETE] == []  # nothing failed
    assert storage.budget_state(trials, study).finished == study.n_trials
    return {t.params["seed"]: t.value for t in counted}


def preempted_study_ends_as_an_uninterrupted_one(tmp_path: Path, tiny, moments: list[float], seeds: int) -> None:
    settings = {"trainer.deterministic": True, "trainer.cpu_threads": 1, "trainer.max_steps": 6}
    straight = study_file(tmp_path, tiny, "straight", **settings)
    text = yaml.safe_load(straight.read_text())
    text["space"]["seed"]["choices"] = list(range(seeds))
    straight.write_text(yaml.safe_dump(text))
    preempted = tmp_path / "preempted.yaml"
    preempted.write_text(yaml.safe_dump({**text, "study": "preempted"}))

    started = time.monotonic()
    first = sweep_process(straight, tmp_path)
    assert first.wait(timeout=600) == 0, first.stderr.read().decode()[-3000:]
    first.stderr.close()
    took = time.monotonic() - started
    for moment in moments:  # SIGTERM to the whole group at a moment of the study, then the same command again
        proc = sweep_process(preempted, tmp_path)
        time.sleep(moment * took)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=300)
        err = proc.stderr.read().decode()
        proc.stderr.close()
        assert code in (0, 143, -signal.SIGTERM), err[-3000:]
        assert "Traceback" not in err, err[-3000:]
    last = sweep_process(preempted, tmp_path)
    assert last.wait(timeout=600) == 0, last.stderr.read().decode()[-3000:]
    last.stderr.close()
    assert finished_values(preempted) == pytest.approx(finished_values(straight), abs=1e-6)


@pytest.mark.slow  # about a minute: three sweep commands of two workers
@pytest.mark.processes
def test_a_study_preempted_by_sigterm_ends_with_its_budget_and_the_uninterrupted_numbers(tmp_path, tiny):
    preempted_study_ends_as_an_uninterrupted_one(tmp_path, tiny, [0.5], seeds=2)


@pytest.mark.slow  # two to four minutes: five interruptions at random moments
@pytest.mark.processes
def test_a_study_preempted_many_times_at_random_moments_ends_as_an_uninterrupted_one(tmp_path, tiny):
    draw = random.Random(int(os.environ.get("PREEMPT_SEED", "38")))
    moments = [draw.uniform(0.05, 0.9) for _ in range(5)]
    preempted_study_ends_as_an_uninterrupted_one(tmp_path, tiny, moments, seeds=4)


def test_a_trial_asked_to_stop_before_it_trains_is_put_back_uncounted(tmp_path, tiny_overrides, monkeypatch):
    from sweeps.run import objective, trials

    path = study_file(tmp_path, tiny_overrides, "stopped")
    study = load_study(path)
    ostudy = open_study(RunStorage(study, None))
    ostudy.enqueue_trial({"seed": 0})
    monkeypatch.setattr(objective.STOP_ASKED, "is_set", lambda: True)  # the worker's SIGTERM handler ran
    with pytest.raises(trials.Terminated, match="stopped by SIGTERM before it trained"):
        ostudy.optimize(lambda trial: trials.run_trial(study, trial, RunStorage(study, None)), n_trials=1)
    stored = ostudy.get_trials(deepcopy=False)
    assert storage.budget_state(stored, study).finished == 0  # not counted as failed
    waiting = [t for t in stored if t.state == optuna.trial.TrialState.WAITING]
    assert [t.system_attrs["fixed_params"] for t in waiting] == [{"seed": 0}]  # the next sweep trains it
