"""A run's files are the run's: the run identity binds them, a resume refuses what is missing, foreign, cut short or
out of range in one line and writes nothing, and a resume without a checkpoint starts from clean event files.

Three tiny runs are trained once (two of one config, one of another seed); each case spoils a copy of one of them
the way a careless user or a crash would (files deleted, swapped between runs, truncated, replaced by folders,
edited values) and runs ``linformer-lab train … resume=true`` in this process.
"""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path
from typing import Callable

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tiny import REPO, TINY_MODEL

from experiments import cli
from foundation.rundir import CHECKPOINT
from training.runfiles import RUN_ID

CONFIG = REPO / "experiments" / "configs" / "base.yaml"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_cache):
    """Finished tiny runs: ``a`` and ``twin`` (same config, seed 0: only their identities differ) and ``seed1``."""
    root = tmp_path_factory.mktemp("runfiles")
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"review {i}: the film was {'good' if i % 3 else 'bad'} and long\n" for i in range(400)))
    tiny = [
        "experiment=tiny",
        f"data.source={corpus}",
        f"output_dir={root / 'runs'}",
        *TINY_MODEL,
        "data.max_texts=300",
        "data.batch_size=8",
        "data.tokenizer.vocab_size=300",
        f"data.cache_dir={data_cache}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=1",
        "trainer.limit_val_batches=1",
        "trainer.log_every_n_steps=1",
        "trainer.accelerator=cpu",
        "optim.warmup_steps=1",
    ]
    for name, seed in (("a", 0), ("twin", 0), ("seed1", 1)):
        assert cli.main(["train", str(CONFIG), *tiny, f"seed={seed}", f"run_dir={root / name}"]) == 0
    return types.SimpleNamespace(root=root, tiny=tiny, corpus=corpus)


def copy_of(runs, name: str, spoil: Callable[[Path], None], source: str = "a") -> Path:
    run = runs.root / f"case_{name}"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(runs.root / source, run)
    spoil(run)
    return run


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}


def resume(runs, run: Path, *extra: str) -> list[str]:
    return ["train", str(CONFIG), *runs.tiny, "seed=0", f"run_dir={run}", "resume=true", *extra]


def refused(runs, capsys, run: Path, *extra: str) -> str:
    """Resume ``run``: exit 2, one ``error:`` line (returned), no traceback, nothing in ``run`` touched."""
    before = snapshot(run)
    capsys.readouterr()
    code = cli.main(resume(runs, run, *extra))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert snapshot(run) == before
    return lines[0]


def edit_checkpoint(run: Path, change: Callable[[dict], None]) -> None:
    state = torch.load(run / CHECKPOINT, weights_only=True)
    change(state)
    torch.save(state, run / CHECKPOINT)


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def events(run: Path) -> list[Path]:
    return sorted(run.glob("events.out.tfevents.*"))


def first_events(run: Path) -> Path:
    """The event file holding the training curves (the later of the first process's two)."""
    return max(events(run), key=lambda p: p.stat().st_size)


def test_a_run_records_one_identity_in_its_config_data_record_checkpoint_and_metrics(runs):
    a, twin = runs.root / "a", runs.root / "twin"
    ident = (a / "config.yaml").read_text().splitlines()[0].removeprefix("# run ")
    assert RUN_ID.fullmatch(ident)
    assert json.loads((a / "data.json").read_text())["run_id"] == ident
    assert json.loads((a / "metrics.json").read_text())["run_id"] == ident
    assert torch.load(a / CHECKPOINT, weights_only=True)["resume_state"]["run_id"] == ident
    assert json.loads((twin / "data.json").read_text())["run_id"] != ident  # a second run of the same config: another


@pytest.mark.parametrize(
    "source, words",
    [
        ("twin", "holds files of different runs"),  # the same config and seed: only the identity tells
        ("seed1", "holds files of different runs"),
    ],
)
def test_another_runs_checkpoint_is_refused_in_one_line(runs, capsys, source, words):
    run = copy_of(runs, f"swap_{source}", lambda r: shutil.copy(runs.root / source / CHECKPOINT, r / CHECKPOINT))
    line = refused(runs, capsys, run)
    assert words in line and "last.ckpt: run " in line and "config.yaml: run " in line


@pytest.mark.parametrize("name", ["config.yaml", "data.json", "metrics.json"])
def test_a_file_of_another_run_is_refused_in_one_line(runs, capsys, name):
    run = copy_of(runs, f"other_{name}", lambda r: shutil.copy(runs.root / "twin" / name, r / name))
    assert "holds files of different runs" in refused(runs, capsys, run)


def strip_identities(run: Path) -> None:
    """The run with the identity line and keys removed from every file (a copied run made to pass for another)."""
    config = run / "config.yaml"
    config.write_text("\n".join(config.read_text().splitlines()[1:]) + "\n")
    for name in ("data.json", "metrics.json"):
        data = json.loads((run / name).read_text())
        data.pop("run_id")
        (run / name).write_text(json.dumps(data))
    edit_checkpoint(run, lambda s: s["resume_state"].pop("run_id"))


def another_seeds_checkpoint_stripped(runs) -> Callable[[Path], None]:
    def strip(r: Path) -> None:
        strip_identities(r)
        shutil.copy(runs.root / "seed1" / CHECKPOINT, r / CHECKPOINT)
        edit_checkpoint(r, lambda s: s["resume_state"].pop("run_id"))

    return strip


@pytest.mark.parametrize("case", ["its own files", "another seed's checkpoint"])
def test_a_run_whose_files_carry_no_identity_is_refused_saying_how_to_start_afresh(runs, capsys, case):
    strip = strip_identities if case == "its own files" else another_seeds_checkpoint_stripped(runs)
    line = refused(runs, capsys, copy_of(runs, f"stripped_{case.split()[0]}", strip))
    assert "its files carry no run identity (checkpoints/last.ckpt, config.yaml, data.json, metrics.json)" in line
    assert "start afresh, without resume=true (a new version) or with run_dir=<a new folder>" in line


def classifier(runs) -> Path:
    """A finished tiny classifier run (it keeps checkpoints/best.ckpt), trained once."""
    run = runs.root / "classifier"
    if not run.exists():
        rows = runs.root / "rows.csv"
        rows.write_text(
            "text,label\n" + "".join(f"review {i} was {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(60))
        )
        args = [*runs.tiny, "task=classify", "data.tokenizer.kind=byte", f"data.source={rows}", "data.val_fraction=0.2"]
        assert cli.main(["train", str(CONFIG), *args, f"run_dir={run}"]) == 0
    return run


def test_a_classifiers_best_checkpoint_is_bound_to_the_run_like_its_last(runs, capsys):
    run = classifier(runs)
    ident = (run / "config.yaml").read_text().splitlines()[0].removeprefix("# run ")
    assert torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)["resume_state"]["run_id"] == ident
    args = [
        "task=classify",
        "data.tokenizer.kind=byte",
        f"data.source={runs.root / 'rows.csv'}",
        "data.val_fraction=0.2",
    ]
    for name, spoil in {
        "another run's": lambda r: edit_checkpoint_at(r / "checkpoints" / "best.ckpt", "0" * 32),
        "identity-less": lambda r: edit_checkpoint_at(r / "checkpoints" / "best.ckpt", None),
    }.items():
        copy = runs.root / f"best_{name.split()[0]}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(run, copy)
        spoil(copy)
        line = refused(runs, capsys, copy, *args)
        assert "holds files of different runs" in line and "checkpoints/best.ckpt: " in line


def edit_checkpoint_at(path: Path, run_id) -> None:
    state = torch.load(path, weights_only=True)
    state["resume_state"]["run_id"] = run_id
    torch.save(state, path)


def test_a_run_whose_checkpoint_alone_lacks_the_identity_is_refused(runs, capsys):
    run = copy_of(runs, "half", lambda r: edit_checkpoint(r, lambda s: s["resume_state"].pop("run_id")))
    assert "last.ckpt: no identity" in refused(runs, capsys, run)


@pytest.mark.parametrize("name", ["config.yaml", "data.json", "hparams.yaml", "tokenizer.json"])
def test_a_file_missing_beside_the_checkpoint_is_refused_never_re_created(runs, capsys, name):
    run = copy_of(runs, f"missing_{name}", lambda r: (r / name).unlink())
    extra = ("optim.lr=0.5",) if name == "config.yaml" else ()  # a changed rate is no longer accepted
    line = refused(runs, capsys, run, *extra)
    assert f"{name}: missing beside checkpoints/last.ckpt" in line and "never re-creates it" in line
    assert not (run / name).exists()


def test_data_json_deleted_with_the_corpus_changed_is_refused_and_the_evidence_kept(runs, capsys):
    run = copy_of(runs, "no_data_json", lambda r: (r / "data.json").unlink())
    text = runs.corpus.read_text()
    runs.corpus.write_text(text.replace("film", "movie"))
    try:
        assert "data.json: missing beside" in refused(runs, capsys, run)
    finally:
        runs.corpus.write_text(text)


@pytest.mark.parametrize(
    "name, spoil, words",
    [
        ("config.yaml", lambda p: p.write_text("# run xyz\n" + p.read_text()), "must be 32 hexadecimal digits"),
        ("data.json", lambda p: p.write_text("{not json"), "not valid JSON"),
        ("data.json", lambda p: p.write_text("[1, 2]"), "must hold a JSON object"),
        ("data.json", lambda p: edit_json(p, fingerprint=7), "fingerprint must be the data's digest"),
        ("data.json", lambda p: edit_json(p, fingerprint=None), "fingerprint must be the data's digest"),
        ("data.json", lambda p: edit_json(p, run_id=12), "must be 32 hexadecimal digits"),
        ("data.json", lambda p: edit_json(p, run_id="../../etc"), "must be 32 hexadecimal digits"),
        ("metrics.json", lambda p: edit_json(p, global_step=10**300), "global_step must be a whole number"),
        ("metrics.json", lambda p: edit_json(p, global_step=-1), "global_step must be a whole number"),
        ("metrics.json", lambda p: edit_json(p, global_step=True), "global_step must be a whole number"),
        ("metrics.json", lambda p: edit_json(p, global_step=2.0), "global_step must be a whole number"),
        ("metrics.json", lambda p: edit_json(p, global_step="2"), "global_step must be a whole number"),
        ("metrics.json", lambda p: edit_json(p, global_step=1), "records the end at step 1 but"),
        ("metrics.json", lambda p: p.write_text('{"global_step": 2'), "not valid JSON"),
        ("metrics.json", lambda p: edit_json(p, run_id=None, global_step=2), "metrics.json: no identity"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_file_a_resume_reads_is_parsed_and_range_checked(runs, capsys, name, spoil, words):
    run = copy_of(runs, f"spoil_{name}", lambda r: spoil(r / name))
    assert words in refused(runs, capsys, run, "trainer.max_steps=3")


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda s: s.update(global_step=10**30), "global_step must be a whole number"),
        (lambda s: s.update(global_step=-3), "global_step must be a whole number"),
        (lambda s: s.update(global_step=1), "records global_step 1 but its training loop counted 2 steps"),
        (lambda s: s["resume_state"]["events"].update({"../x": 3}), "record of the run"),
        (lambda s: s["resume_state"]["events"].update({"events.out.tfevents.x": -1}), "record of the run"),
        (lambda s: s["resume_state"].update(rng_by_rank="x"), "record of the run"),
        (lambda s: s.update(resume_state=[1, 2]), "record of the run"),
        (lambda s: s["resume_state"].update(run_id="not an id"), "must be 32 hexadecimal digits"),
        (lambda s: s["hyper_parameters"].pop("config"), "records no run config"),
    ],
)
def test_an_edited_checkpoint_is_refused_in_one_line(runs, capsys, change, words):
    run = copy_of(runs, "edited_ckpt", lambda r: edit_checkpoint(r, change))
    assert words in refused(runs, capsys, run, "trainer.max_steps=3")


def test_a_checkpoint_removed_from_a_finished_run_is_refused_not_trained_afresh(runs, capsys):
    run = copy_of(runs, "no_ckpt", lambda r: (r / CHECKPOINT).unlink())
    assert "records an end of this run but" in refused(runs, capsys, run)


@pytest.mark.parametrize(
    "spoil, words",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-40]), "shorter than the"),
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "shorter than the"),
        (lambda p: p.unlink(), "missing, its checkpoint recorded"),
        (lambda p: (p.unlink(), p.mkdir()), "not a file"),
        (lambda p: p.write_bytes(bytes(p.stat().st_size)), "damaged (no whole TensorBoard record at byte 0"),
    ],
    ids=["cut short", "cut to 100 bytes", "deleted", "a folder", "zeroed"],
)
def test_an_events_file_shorter_than_recorded_or_damaged_is_refused(runs, capsys, spoil, words):
    run = copy_of(runs, "events", lambda r: spoil(first_events(r)))
    assert words in refused(runs, capsys, run, "trainer.max_steps=3")


def curves(run: Path) -> tuple[list[int], int]:
    """The steps of ``train/loss`` over every event file, and how many HPARAMS entries they hold."""
    steps, hparams = [], 0
    for path in events(run):
        for event in LegacyEventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == "train/loss":
                    steps.append(event.step)
                hparams += value.tag == "_hparams_/session_start_info"  # one per HPARAMS entry of the run
    return sorted(steps), hparams


def test_a_resume_without_a_checkpoint_starts_from_clean_events(runs, capsys):
    """A run killed before its first checkpoint (its config, data record, events and HPARAMS written) resumed: its
    curves hold each step once and one HPARAMS entry, and it keeps its identity."""

    def killed_before_saving(r: Path) -> None:
        shutil.rmtree(r / "checkpoints")
        (r / "metrics.json").unlink()

    run = copy_of(runs, "killed_early", killed_before_saving)
    ident = (run / "config.yaml").read_text().splitlines()[0]
    assert curves(run)[1] == 1 and curves(run)[0]  # the killed process's curves and HPARAMS
    assert cli.main(resume(runs, run)) == 0, capsys.readouterr().err[-2000:]
    steps, hparams = curves(run)
    assert steps == [0, 1] and hparams == 1  # Lightning logs the n-th step at step n - 1
    assert (run / "config.yaml").read_text().splitlines()[0] == ident
    assert json.loads((run / "metrics.json").read_text())["run_id"] == ident.removeprefix("# run ")


def test_a_resume_cuts_longer_event_files_back_and_ends_with_each_step_once(runs, capsys):
    def logged_after_the_checkpoint(r: Path) -> None:
        path = first_events(r)
        path.write_bytes(path.read_bytes() + b"\x00" * 10)  # a killed process's half-written record past the save

    run = copy_of(runs, "longer", logged_after_the_checkpoint)
    assert cli.main(resume(runs, run, "trainer.max_steps=3")) == 0, capsys.readouterr().err[-2000:]
    steps, hparams = curves(run)
    assert steps == [0, 1, 2] and hparams == 1


def test_a_config_yaml_edited_to_match_a_changed_command_is_refused_by_the_checkpoints_recorded_config(runs, capsys):
    def edit_rate(r: Path) -> None:
        first, *rest = (r / "config.yaml").read_text().splitlines(keepends=True)
        config = yaml.safe_load("".join(rest))
        config["optim"]["lr"] = 0.5
        (r / "config.yaml").write_text(first + yaml.safe_dump(config))

    line = refused(runs, capsys, copy_of(runs, "edited_rate", edit_rate), "optim.lr=0.5")
    assert "another config (optim.lr (" in line and "0.5 here)" in line
