"""Bad input to every command: one line naming the problem, exit code 2, no traceback, nothing written.

One table: each row builds its input in a scratch folder, runs ``linformer-lab COMMAND ...`` in this process,
and expects ``error: ...`` holding the given words. The folder must be the same afterwards (no file created,
changed or removed), so no half-written run directory is left behind. Also here: folders that take no file (the
Hugging Face cache, the run's folders), and a real process's one line. The helper that masks passwords is
``tests/foundation/test_redact.py``'s; that the project loads no checkpoint and no YAML in a way that can run code,
``tests/test_security.py``'s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Callable

import pytest
import torch
import yaml
from tiny import REPO, TINY_MODEL

from experiments import cli
from foundation.rundir import CHECKPOINT

CONFIG = REPO / "experiments" / "configs" / "base.yaml"

PASSWORD = "hunter2-Secret"


def _has_postgres_driver() -> bool:
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return False
    return True


# What an unreachable PostgreSQL URL gets: "cannot open" from the server, or, where the optional driver (the extra
# `postgres`) is not installed, as on a machine given only the project's required packages, the line that says so.
UNREACHABLE = "cannot open" if _has_postgres_driver() else "its database driver is not installed"


class RunsCode:
    """Pickles as a call of os.system: loading it with plain pickle would create ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def world(tmp_path_factory, data_cache):
    """A scratch folder with a trained tiny run and the bad files the rows use."""
    root = tmp_path_factory.mktemp("hostile")
    tiny = [
        "experiment=tiny",
        f"output_dir={root / 'runs'}",
        *TINY_MODEL,
        "data.max_texts=300",
        "data.batch_size=8",
        "data.tokenizer.vocab_size=300",
        f"data.cache_dir={data_cache}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "trainer.accelerator=cpu",
        "optim.warmup_steps=1",
    ]
    trained = root / "trained"
    assert cli.main(["train", str(CONFIG), *tiny, f"run_dir={trained}"]) == 0
    ckpt = trained / CHECKPOINT
    files = root / "files"
    files.mkdir()

    def write(name: str, text: str) -> Path:
        (files / name).write_text(text)
        return files / name

    good_study = {
        "study": "hostile",
        "base": str(CONFIG),
        "overrides": {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in tiny)},
        "space": {"seed": {"type": "categorical", "choices": [0, 1]}},
        "sampler": {"kind": "grid"},
    }
    state = torch.load(ckpt, weights_only=True)
    state["hyper_parameters"]["config"]["model"]["d_ff"] = 128  # weights of d_ff 64 under a d_ff 128 config
    torch.save(state, files / "foreign.ckpt")
    torch.save({"state_dict": {}, "payload": RunsCode(root / "code_ran")}, files / "runs_code.ckpt")
    (files / "truncated.ckpt").write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    shutil.copy(ckpt, files / "zeroed.ckpt")
    zero_inside(files / "zeroed.ckpt")
    return types.SimpleNamespace(
        root=root,
        tiny=tiny,
        trained=trained,
        ckpt=ckpt,
        files=files,
        write=write,
        study=lambda name, **changes: write(name, yaml.safe_dump({**good_study, **changes})),
    )


def resumable(world, name: str, change: Callable[[Path], None] = lambda ckpt: None) -> Path:
    """A copy of the trained run whose checkpoint ``change`` spoils."""
    run = world.root / name
    if not run.exists():
        shutil.copytree(world.trained, run)
        change(run / CHECKPOINT)
    return run


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:1000])


def train(world, *args: str) -> list[str]:
    return ["train", str(CONFIG), *world.tiny, *args]


def source(world, name: str, text: str) -> str:
    return f"data.source={world.write(name, text)}"


# 320 bytes that expand to 10^7 values: each line repeats the previous alias ten times.
ALIAS_BOMB = (
    "a: &a [1,1,1,1,1,1,1,1,1,1]\n"
    + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcde", "bcdef"))
    + "g: [*f]\n"
)

ALIAS_BOMB_FLOW = (
    "{a: &a [1,1,1,1,1,1,1,1,1,1], b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], "
    "e: [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]}"
)

PIPELINE_ABSOLUTE_VARIANT = (
    f"pretrain: {{{{config: {CONFIG}}}}}\nvariants: {{{{'{{w.root}}/elsewhere': []}}}}\n"
    f"tasks: {{{{t: {{{{config: {CONFIG}}}}}}}}}\n"
)

PIPELINE_BAD_OVERRIDE = f"pretrain: {{config: {CONFIG}}}\nvariants: {{a: ['model.attention.options.k=[1,2']}}\ntasks: {{t: {{config: {CONFIG}}}}}\n"


def spoil_config(ckpt: Path) -> None:
    (ckpt.parents[1] / "config.yaml").write_text("model: {d_model: 32\n")


def spoiled_run(w, name: str, spoil: Callable[[Path], None]) -> Path:
    """A copy of the trained run that ``spoil`` damages."""
    run = w.root / name
    if not run.exists():
        shutil.copytree(w.trained, run)
        spoil(run)
    return run


def set_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, **changes}))


def cut_events(run: Path) -> None:
    """The TensorBoard event file of the curves cut 40 bytes short of the size its checkpoint recorded."""
    sizes = torch.load(run / CHECKPOINT, weights_only=True)["resume_state"]["events"]
    name = max(sizes, key=sizes.get)
    (run / name).write_bytes((run / name).read_bytes()[: sizes[name] - 40])


def truncate_text(path: Path) -> None:
    path.write_text(path.read_text()[:10])


def metrics_folder(run: Path) -> None:
    (run / "metrics.json").unlink()
    (run / "metrics.json").mkdir()
    (run / "metrics.json" / "x").write_text("{}")


def changed_study(w) -> Path:
    """A study started with one search space, and its file now holding another."""
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage
    from sweeps.spec.study import load_study

    first = w.study("s_started.yaml", study="changed")
    if not (w.root / "runs" / "changed" / "journal.log").exists():
        open_study(RunStorage(load_study(first), None))
    space = {
        "seed": {"type": "categorical", "choices": [0, 1]},
        "optim.lr": {"type": "categorical", "choices": [0.001]},
    }
    return w.study("s_changed.yaml", study="changed", space=space)


def garbled(w) -> Path:
    """A study whose journal holds a line that is not a record between two that are."""
    journal = w.root / "runs" / "garbled" / "journal.log"
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_text('{"op_code": 0, "worker_id": "a"}\nnot a record\n{"op_code": 1, "worker_id": "a"}\n')
    return w.study("s_garbled.yaml", study="garbled")


def zero_inside(path: Path) -> None:
    """4 KiB of zeros inside the archive (past its first entry's header, before the directory at the end)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(4096)
    path.write_bytes(bytes(data))


def linked(w, name: str, inside: str) -> Path:
    """A copy of the trained run in which ``inside`` (a file or folder of it) is a link to a file outside it."""
    run = w.root / name
    if not run.exists():
        outside = w.files / f"{name}.outside"
        outside.write_text("not the run's\n")
        shutil.copytree(w.trained, run)
        target = run / inside.rstrip("/")
        remove(target)
        target.symlink_to(w.files if inside.endswith("/") else outside)
    return run


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def wrong_type(w, name: str, inside: str, folder: bool) -> Path:
    """A copy of the trained run in which ``inside`` is a folder (``folder``) or a file where the other belongs."""
    run = w.root / name
    if not run.exists():
        shutil.copytree(w.trained, run)
        target = run / inside
        remove(target)
        if folder:
            target.mkdir()
        else:
            target.write_text("x\n")
    return run


def study_folder(w, name: str, build: Callable[[Path], None]) -> Path:
    """A study file whose folder ``build`` prepares (a link, a wrong type)."""
    root = w.root / "runs" / name
    if not os.path.lexists(root):
        root.parent.mkdir(parents=True, exist_ok=True)
        build(root)
    return w.study(f"s_{name}.yaml", study=name)


def journal_with_a_link(root: Path) -> None:
    root.mkdir()
    (root / "journal.log").symlink_to(root.parent.parent / "files" / "victim.txt")
    (root.parent.parent / "files" / "victim.txt").write_text("someone else's file\n")


def lock_folder(root: Path) -> None:
    root.mkdir()
    (root / ".lock").mkdir()


def earlier_layout(w) -> str:
    """An experiment whose run lies directly in its folder (``runs/earlier/version_0``), as before runs were named by
    their overrides."""
    run = w.root / "runs" / "earlier" / "version_0"
    if not run.exists():
        shutil.copytree(w.trained, run)
    return "earlier"


def experiment_record(w, name: str, link: bool = False) -> str:
    """An experiment folder whose ``.hparams.json`` is a link to a file outside it, or a folder."""
    record = w.root / "runs" / name / ".hparams.json"
    if not os.path.lexists(record):
        record.parent.mkdir(parents=True)
        if link:
            (w.files / "outside.json").write_text("{}\n")
            record.symlink_to(w.files / "outside.json")
        else:
            record.mkdir()
    return name


def plan_folder(root: Path) -> None:
    root.mkdir()
    (root / "plan.json").mkdir()


def new_study_target_taken(w) -> Path:
    """A started study whose --new-study target names (this second and the next ones) already exist."""
    import time

    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage
    from sweeps.spec.study import load_study

    path = w.study("s_aside.yaml", study="aside")
    study = load_study(path)
    if not (study.root / "journal.log").exists():
        open_study(RunStorage(study, None))
    now = time.time()
    for ahead in range(0, 30):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now + ahead))
        study.root.with_name(f"aside.{stamp}").mkdir(exist_ok=True)
    return path


def overrides_changed(w) -> Path:
    """A study started with one shared config, and its file's overrides now another."""
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage
    from sweeps.spec.study import load_study

    first = w.study("s_ovr_started.yaml", study="overrides")
    if not (w.root / "runs" / "overrides" / "journal.log").exists():
        open_study(RunStorage(load_study(first), None))
    changed = yaml.safe_load(first.read_text())
    changed["overrides"]["optim.lr"] = 0.002
    return w.write("s_ovr_changed.yaml", yaml.safe_dump(changed))


def foreign_study(w) -> Path:
    """A journal holding a study of the same name that another program created (no identity of ours)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    journal = w.root / "runs" / "foreign" / "journal.log"
    if not journal.exists():
        journal.parent.mkdir(parents=True)
        theirs = optuna.create_study(study_name="foreign", storage=JournalStorage(JournalFileBackend(str(journal))))
        theirs.add_trial(
            optuna.trial.create_trial(
                params={"seed": 0}, distributions={"seed": optuna.distributions.IntDistribution(0, 1)}, value=0.1
            )
        )
        for leftover in journal.parent.glob("journal.log.lock"):
            leftover.unlink()
    return w.study("s_foreign.yaml", study="foreign")


# Strings that double at every level: 110 characters become 10^10 once resolved.
INTERPOLATION_BOMB = (
    "data:\n  subset: "
    + "x" * 100
    + "\n"
    + "".join(
        f"  {key}: {('${data.' + previous + '}') * 10}\n"
        for previous, key in zip(
            ("subset", "text_pair_column", "source", "cache_dir", "text_column"),
            ("text_pair_column", "source", "cache_dir", "text_column", "label_column"),
        )
    )
    + "experiment: "
    + "${data.label_column}" * 100
    + "\n"
)

STRING_LABELS = "text,label\n" + "".join(f"review {i},positive\n" for i in range(20))

# id: (argv from the world, words the error line must hold)
CASES: dict[str, tuple[Callable, str]] = {
    # ----------------------------------------------------------------------------------------- train
    "train/missing config": (lambda w: ["train", str(w.files / "nope.yaml")], "nope.yaml: not found"),
    "train/malformed yaml": (lambda w: ["train", str(w.write("bad.yaml", "model: {d_model: 32\n"))], "malformed YAML"),
    "train/yaml not a mapping": (lambda w: ["train", str(w.write("list.yaml", "- 1\n- 2\n"))], "must be a mapping"),
    "train/unknown key": (lambda w: train(w, "model.attention.kindd=full"), "model.attention.kindd: unknown key"),
    "train/wrong type": (lambda w: train(w, "model.d_model=wide"), "model.d_model"),
    "train/out of range": (lambda w: train(w, "model.dropout=1.5"), "model.dropout: must be in [0, 1)"),
    "train/k above n": (lambda w: train(w, "model.attention.options.k=64"), "model.attention.options.k"),
    "train/contradictory": (lambda w: train(w, "task=clm"), "task: 'clm' needs model.attention.causal=true"),
    "train/bad override": (lambda w: train(w, "model.d_model"), "expected key=value"),
    "train/missing data file": (lambda w: train(w, f"data.source={w.files / 'none.txt'}"), "not found"),
    "train/empty data file": (lambda w: train(w, source(w, "empty.txt", "")), "data.source"),
    "train/malformed data file": (lambda w: train(w, source(w, "bad.jsonl", '{"text": "a"\n')), "data.source"),
    "train/missing text column": (lambda w: train(w, source(w, "notext.csv", "body\na\nb\n")), "data.text_column"),
    "train/label column of the wrong type": (
        lambda w: train(w, "task=classify", "data.tokenizer.kind=byte", source(w, "labels.csv", STRING_LABELS)),
        "data.label_column",
    ),
    "train/resume truncated checkpoint": (
        lambda w: train(w, f"run_dir={resumable(w, 'r_trunc', truncate)}", "resume=true"),
        "truncated",
    ),
    "train/resume another architecture": (
        lambda w: train(w, f"run_dir={resumable(w, 'r_arch')}", "resume=true", "model.d_model=64"),
        "differs at model.d_model (32 there, 64 here)",
    ),
    "train/resume with another config": (
        lambda w: train(w, f"run_dir={resumable(w, 'r_arch')}", "resume=true", "optim.lr=0.5", "model.dropout=0.3"),
        "differs at model.dropout (0.1 there, 0.3 here), optim.lr (",
    ),
    # metrics.json is replaced at the end: a resumed run that would train 2 steps and only then fail to write it
    "train/resume with metrics.json a folder": (
        lambda w: train(w, f"run_dir={spoiled_run(w, 'r_mdir', metrics_folder)}", "resume=true", "trainer.max_steps=4"),
        "metrics.json is a folder where a file belongs",
    ),
    "train/resume with a truncated metrics.json": (
        lambda w: train(
            w,
            f"run_dir={spoiled_run(w, 'r_mtrunc', lambda r: truncate_text(r / 'metrics.json'))}",
            "resume=true",
            "trainer.max_steps=4",
        ),
        "metrics.json: not valid JSON",
    ),
    "train/resume with metrics.step_N.json a folder": (
        lambda w: train(
            w,
            f"run_dir={spoiled_run(w, 'r_kdir', lambda r: (r / 'metrics.step_2.json').mkdir())}",
            "resume=true",
            "trainer.max_steps=4",
        ),
        "metrics.step_2.json: not a file",
    ),
    # a run's files are the run's (training/runfiles.py): none missing, none of another run, each range-checked
    "train/resume by overrides of a run in the earlier layout": (
        lambda w: train(w, f"experiment={earlier_layout(w)}", "seed=1", "resume=true"),
        "runs/earlier/version_0 is a run of this experiment in its folder, not in the folder these overrides name",
    ),
    # the experiment's HPARAMS record (training/tensorboard.py), checked before the run's folder is made
    "train/.hparams.json a link to a file outside": (
        lambda w: train(w, f"experiment={experiment_record(w, 'hp_link', link=True)}"),
        ".hparams.json: a symbolic link (to ",
    ),
    "train/.hparams.json a folder": (
        lambda w: train(w, f"experiment={experiment_record(w, 'hp_dir')}"),
        ".hparams.json: a folder where the HPARAMS record of the runs in",
    ),
    "train/resume with config.yaml deleted and another learning rate": (
        lambda w: train(
            w,
            f"run_dir={spoiled_run(w, 'r_nocfg', lambda r: (r / 'config.yaml').unlink())}",
            "resume=true",
            "optim.lr=0.5",
        ),
        "config.yaml: missing beside checkpoints/last.ckpt",
    ),
    "train/resume with data.json deleted": (
        lambda w: train(
            w, f"run_dir={spoiled_run(w, 'r_nodata', lambda r: (r / 'data.json').unlink())}", "resume=true"
        ),
        "data.json: missing beside checkpoints/last.ckpt",
    ),
    "train/resume with hparams.yaml deleted": (
        lambda w: train(
            w, f"run_dir={spoiled_run(w, 'r_nohp', lambda r: (r / 'hparams.yaml').unlink())}", "resume=true"
        ),
        "hparams.yaml: missing beside checkpoints/last.ckpt",
    ),
    "train/resume with hparams.yaml a folder": (
        lambda w: train(w, f"run_dir={wrong_type(w, 'w_hp', 'hparams.yaml', True)}", "resume=true"),
        "hparams.yaml is a folder where a file belongs",
    ),
    "train/resume with an events file cut short": (
        lambda w: train(w, f"run_dir={spoiled_run(w, 'r_evcut', cut_events)}", "resume=true", "trainer.max_steps=4"),
        "shorter than the",
    ),
    "train/resume with an absurd metrics.json global_step": (
        lambda w: train(
            w,
            f"run_dir={spoiled_run(w, 'r_mstep', lambda r: set_json(r / 'metrics.json', global_step=10**300))}",
            "resume=true",
            "trainer.max_steps=4",
        ),
        "metrics.json: global_step must be a whole number",
    ),
    "train/resume with metrics.json of another step than its checkpoint": (
        lambda w: train(
            w,
            f"run_dir={spoiled_run(w, 'r_mother', lambda r: set_json(r / 'metrics.json', global_step=1))}",
            "resume=true",
            "trainer.max_steps=4",
        ),
        "records the end at step 1 but",
    ),
    "train/resume with its identity edited in data.json": (
        lambda w: train(
            w, f"run_dir={spoiled_run(w, 'r_rid', lambda r: set_json(r / 'data.json', run_id='0' * 32))}", "resume=true"
        ),
        "holds files of different runs",
    ),
    "train/resume with a malformed config.yaml": (
        lambda w: train(w, f"run_dir={resumable(w, 'r_cfg', spoil_config)}", "resume=true"),
        "config.yaml: malformed YAML",
    ),
    "train/gpu on a machine without one": (
        lambda w: (
            train(w, "trainer.accelerator=gpu")
            if torch.cuda.device_count() == 0
            else train(w, "trainer.accelerator=mps")
        ),
        "no usable CUDA GPU" if torch.cuda.device_count() == 0 else "no MPS device",
    ),
    "train/cache_dir is a file": (lambda w: train(w, f"data.cache_dir={w.write('c_file.txt', 'x')}"), "is a file"),
    "train/cache_dir inside a file": (
        lambda w: train(w, f"data.cache_dir={w.write('c_file.txt', 'x')}/sub"),
        "which is a file, not a folder",
    ),
    "train/experiment name past 255 bytes": (lambda w: train(w, "experiment=" + "é" * 130), "more than the 255"),
    "train/path past 4096 bytes": (lambda w: train(w, "output_dir=" + "/a" * 2100), "more than the 4096"),
    "train/a config file with two model keys": (
        lambda w: ["train", str(w.write("twice.yaml", "model:\n  d_model: 32\nmodel:\n  d_ff: 64\n"))],
        "key 'model' given twice",
    ),
    "train/tpu without its package": (lambda w: train(w, "trainer.accelerator=tpu"), "needs the torch_xla package"),
    "train/resume checkpoint that runs code": (
        lambda w: train(
            w, f"run_dir={resumable(w, 'r_code', lambda c: shutil.copy(w.files / 'runs_code.ckpt', c))}", "resume=true"
        ),
        "holds objects that could run code when loaded (posix.system); refused",
    ),
    "train/run_dir holds a run": (lambda w: train(w, f"run_dir={w.trained}"), "already holds a run"),
    # not valid YAML, or a shape the loader cannot take
    "train/override not valid yaml": (
        lambda w: train(w, "model.attention.options.k=[1,2"),
        "model.attention.options.k: value '[1,2'",
    ),
    "train/override a bad key": (lambda w: train(w, "model..k=3"), "the key must be dotted names"),
    "train/defaults not a list of names": (
        lambda w: ["train", str(w.write("d5.yaml", "defaults: 5\n"))],
        "defaults: must be a file name or a list of file names",
    ),
    "train/nul byte in a name": (lambda w: train(w, "experiment=a\x00b"), "experiment"),
    "train/control character in a path": (lambda w: train(w, 'output_dir="runs\\nx"'), "output_dir"),
    "train/run_dir is a file": (lambda w: train(w, f"run_dir={w.write('a_file.txt', 'x')}"), "is a file, not a folder"),
    "train/max_len past any allocation": (lambda w: train(w, "model.max_len=100000000"), "model.max_len"),
    "train/model larger than the machine": (
        lambda w: train(w, "model.d_model=65536", "model.d_ff=262144", "model.n_heads=1", "model.n_layers=64"),
        "more than this machine's",
    ),
    # values Lightning, torch or Optuna would refuse only after the run directory exists
    "train/val_check_interval 0": (lambda w: train(w, "trainer.val_check_interval=0"), "trainer.val_check_interval"),
    "train/limit_val_batches -1": (lambda w: train(w, "trainer.limit_val_batches=-1"), "trainer.limit_val_batches"),
    "train/accumulate 0": (lambda w: train(w, "trainer.accumulate_grad_batches=0"), "trainer.accumulate_grad_batches"),
    "train/one beta": (lambda w: train(w, "optim.betas=[0.9]"), "optim.betas: must be two numbers"),
    "train/precision banana": (lambda w: train(w, "trainer.precision=banana"), "trainer.precision: 'banana'"),
    "train/strategy unknown": (lambda w: train(w, "trainer.strategy=warp"), "trainer.strategy: 'warp'"),
    "train/devices 0": (lambda w: train(w, "trainer.devices=0"), "trainer.devices"),
    "train/seed negative": (lambda w: train(w, "seed=-1"), "seed: must be an integer"),
    # out of range
    "train/lr inf": (lambda w: train(w, "optim.lr=inf"), "optim.lr: must be a finite number in (0, inf], got inf"),
    "train/lr nan": (lambda w: train(w, "optim.lr=nan"), "optim.lr"),
    "train/negative warm-up": (lambda w: train(w, "optim.warmup_steps=-5"), "optim.warmup_steps"),
    "train/eps zero": (lambda w: train(w, "optim.eps=0"), "optim.eps"),
    "train/batch 0": (lambda w: train(w, "data.batch_size=0"), "data.batch_size"),
    "train/huge batch": (lambda w: train(w, "data.batch_size=1e30"), "data.batch_size"),
    # escaping the output folder
    "train/experiment escapes": (lambda w: train(w, "experiment=../../x"), "must be a relative name inside"),
    "train/experiment absolute": (lambda w: train(w, f"experiment={w.root / 'elsewhere'}"), "not absolute"),
    # resource exhaustion
    "train/yaml alias bomb": (lambda w: ["train", str(w.write("bomb.yaml", ALIAS_BOMB))], "expands to more than"),
    "train/override alias bomb": (
        lambda w: train(w, "model.attention.options=" + ALIAS_BOMB_FLOW),
        "expands to more than",
    ),
    "train/yaml file too large": (
        lambda w: ["train", str(w.write("big.yaml", "# " + "x" * (1 << 20) + "\n"))],
        "more than the",
    ),
    "train/yaml interpolation bomb": (
        lambda w: ["train", str(w.write("ibomb.yaml", INTERPOLATION_BOMB))],
        "would resolve to more than 100,000 characters",
    ),
    # links and wrong types in a run directory: found before anything is written
    "train/resume with its lock a link": (
        lambda w: train(w, f"run_dir={linked(w, 'l_lock', '.lock')}", "resume=true", "trainer.max_steps=4"),
        ".lock is a symbolic link",
    ),
    "train/resume with its checkpoints folder a link": (
        lambda w: train(w, f"run_dir={linked(w, 'l_ckpt', 'checkpoints/')}", "resume=true", "trainer.max_steps=4"),
        "checkpoints is a symbolic link",
    ),
    "train/resume with metrics.json a link": (
        lambda w: train(w, f"run_dir={linked(w, 'l_metrics', 'metrics.json')}", "resume=true", "trainer.max_steps=4"),
        "metrics.json is a symbolic link",
    ),
    "train/resume with its lock a folder": (
        lambda w: train(w, f"run_dir={wrong_type(w, 'w_lock', '.lock', True)}", "resume=true"),
        ".lock is a folder where a file belongs",
    ),
    # a resume that could not save its checkpoint: refused before it trains, not at its first save
    "train/resume with checkpoints a file": (
        lambda w: train(w, f"run_dir={wrong_type(w, 'w_ckdir', 'checkpoints', False)}", "resume=true"),
        "checkpoints is a file where a folder belongs",
    ),
    "train/resume with last.ckpt a folder": (
        lambda w: train(w, f"run_dir={wrong_type(w, 'w_last', str(CHECKPOINT), True)}", "resume=true"),
        "last.ckpt is a folder where a file belongs",
    ),
    # silent corruption
    "train/resume zeroed checkpoint": (
        lambda w: train(w, f"run_dir={resumable(w, 'r_zero', zero_inside)}", "resume=true"),
        "damaged",
    ),
    # ----------------------------------------------------------------------------------------- sweep
    "sweep/missing study": (lambda w: ["sweep", str(w.files / "none.yaml")], "not found"),
    "sweep/malformed yaml": (lambda w: ["sweep", str(w.write("s_bad.yaml", "study: [x\n"))], "malformed YAML"),
    "sweep/unknown key": (
        lambda w: ["sweep", str(w.study("s_key.yaml", samplerr={"kind": "grid"}))],
        "samplerr: unknown key (allowed here: study, base,",
    ),
    "sweep/wrong type": (
        lambda w: ["sweep", str(w.study("s_type.yaml", budget={"n_trials": "many"}))],
        "budget.n_trials",
    ),
    "sweep/out of range": (lambda w: ["sweep", str(w.study("s_ok.yaml")), "--workers", "0"], "--workers"),
    "sweep/timeout nan": (lambda w: ["sweep", str(w.study("s_ok.yaml")), "--timeout-s", "nan"], "--timeout-s"),
    "sweep/timeout nan in the file": (
        lambda w: ["sweep", str(w.study("s_nan.yaml", budget={"timeout_s": "nan"}))],
        "budget.timeout_s",
    ),
    "sweep/workers past any machine": (
        lambda w: ["sweep", str(w.study("s_ok.yaml")), "--workers", "100000"],
        "--workers",
    ),
    "sweep/alias bomb": (lambda w: ["sweep", str(w.write("s_bomb.yaml", ALIAS_BOMB))], "expands to more than"),
    "sweep/contradictory": (
        lambda w: [
            "sweep",
            str(
                w.study(
                    "s_prune.yaml",
                    sampler={"kind": "tpe"},
                    pruner={"kind": "median"},
                    objective=[
                        {"metric": "val/loss", "direction": "minimize"},
                        {"metric": "tokens_per_sec", "direction": "maximize"},
                    ],
                )
            ),
        ],
        "pruner",
    ),
    "sweep/bad run config": (
        lambda w: ["sweep", str(w.study("s_run.yaml", overrides={"model.dropout": 2.0}))],
        "model.dropout",
    ),
    "sweep/unreachable storage": (
        lambda w: [
            "sweep",
            str(w.study("s_ok.yaml")),
            "--storage",
            f"postgresql+psycopg2://lab:{PASSWORD}@127.0.0.1:9/optuna",
        ],
        f"--storage postgresql+psycopg2://lab:***@127.0.0.1:9/optuna: {UNREACHABLE}",
    ),
    "sweep/sqlite with workers": (
        lambda w: ["sweep", str(w.study("s_ok.yaml")), "--workers", "2", "--storage", f"sqlite:///{w.files / 'x.db'}"],
        "SQLite cannot take parallel workers",
    ),
    # ----------------------------------------------------------------------------------------- report
    "report/missing study": (lambda w: ["report", str(w.files / "none.yaml")], "not found"),
    "report/never run": (lambda w: ["report", str(w.study("s_ok.yaml"))], "no study journal here"),
    "sweep/study name past 255 bytes": (lambda w: ["sweep", str(w.study("s_long.yaml", study="s" * 300))], "255"),
    "sweep/sampler seed -1": (
        lambda w: ["sweep", str(w.study("s_seed.yaml", sampler={"kind": "tpe", "seed": -1}, budget={"n_trials": 2}))],
        "sampler.seed",
    ),
    "sweep/median pruner negative warm-up": (
        lambda w: [
            "sweep",
            str(
                w.study(
                    "s_warm.yaml",
                    sampler={"kind": "tpe"},
                    pruner={"kind": "median", "n_warmup_steps": -3},
                    budget={"n_trials": 2},
                )
            ),
        ],
        "pruner.n_warmup_steps",
    ),
    "sweep/hyperband reduction factor 0": (
        lambda w: [
            "sweep",
            str(
                w.study(
                    "s_hyper.yaml",
                    sampler={"kind": "tpe"},
                    pruner={"kind": "hyperband", "reduction_factor": 0},
                    budget={"n_trials": 2},
                )
            ),
        ],
        "pruner.reduction_factor",
    ),
    "sweep/a grid of 10^9 points": (
        lambda w: [
            "sweep",
            str(w.study("s_huge.yaml", space={"seed": {"type": "int", "low": 0, "high": 10**9 - 1, "step": 1}})),
        ],
        "up to 1,000,000,000 combinations of values (seed 1000000000)",
    ),
    "sweep/storage not a URL": (
        lambda w: ["sweep", str(w.study("s_ok.yaml")), "--storage", "not a url"],
        "not a database URL",
    ),
    "sweep/a study whose space changed since it started": (
        lambda w: ["sweep", str(changed_study(w))],
        "was started with another search space: space.optim.lr: added here",
    ),
    "report/a study whose space changed since it started": (
        lambda w: ["report", str(changed_study(w))],
        "was started with another search space: space.optim.lr: added here",
    ),
    "sweep/journal with a garbage line": (lambda w: ["sweep", str(garbled(w))], "line 2 of 3 is not a journal record"),
    "sweep/a link in the study folder": (
        lambda w: ["sweep", str(study_folder(w, "linked", journal_with_a_link))],
        "journal.log is a symbolic link",
    ),
    "sweep/its lock a folder": (
        lambda w: ["sweep", str(study_folder(w, "lockdir", lock_folder))],
        ".lock is a folder where a file belongs",
    ),
    "sweep/the study folder a file": (
        lambda w: ["sweep", str(study_folder(w, "afile", lambda root: root.write_text("x\n")))],
        "is a file, not a folder",
    ),
    "sweep/--new-study onto a name that exists": (
        lambda w: ["sweep", str(new_study_target_taken(w)), "--new-study"],
        "already exists, where the earlier study would be moved",
    ),
    "sweep/plan.json a folder": (
        lambda w: ["sweep", str(study_folder(w, "plandir", plan_folder))],
        "plan.json is a folder where a file belongs",
    ),
    "sweep/--budget with --replicate": (
        lambda w: ["sweep", str(w.study("s_ok.yaml")), "--budget", "4", "--replicate"],
        "argument --replicate: not allowed with argument --budget",
    ),
    "sweep/--preflight with --no-preflight": (
        lambda w: ["sweep", str(w.study("s_ok.yaml")), "--preflight", "--no-preflight"],
        "argument --no-preflight: not allowed with argument --preflight",
    ),
    "sweep/--budget that changes no step count": (
        lambda w: ["sweep", str(w.study("s_ok.yaml")), "--budget", "1.2"],
        "--budget 1.2: trainer.max_steps=2 stays 2 steps at 1.2 × (a whole number of steps): this factor changes no "
        "step count; use --budget 1.26 or more",
    ),
    "sweep/a study whose overrides changed since it started": (
        lambda w: ["sweep", str(overrides_changed(w))],
        "was started with another identity: config.optim.lr: 0.001 there, 0.002 here",
    ),
    "sweep/a study of the same name that another program created": (
        lambda w: ["sweep", str(foreign_study(w))],
        "was not created by linformer-lab",
    ),
    "report/a study of the same name that another program created": (
        lambda w: ["report", str(foreign_study(w))],
        "was not created by linformer-lab",
    ),
    "report/journal with a garbage line": (
        lambda w: ["report", str(garbled(w))],
        "line 2 of 3 is not a journal record",
    ),
    "report/sqlite file that does not exist": (
        lambda w: ["report", str(w.study("s_ok.yaml")), "--storage", f"sqlite:///{w.files / 'typo.db'}"],
        "no database file",
    ),
    "report/unreachable storage": (
        lambda w: [
            "report",
            str(w.study("s_ok.yaml")),
            "--storage",
            f"postgresql+psycopg2://lab:{PASSWORD}@127.0.0.1:9/optuna",
        ],
        "lab:***@127.0.0.1:9/optuna",
    ),
    # ----------------------------------------------------------------------------------------- analyze
    "analyze/missing run": (lambda w: ["analyze", str(w.files / "none")], "no such run directory"),
    "analyze/truncated checkpoint": (lambda w: ["analyze", str(w.files / "truncated.ckpt")], "truncated"),
    "analyze/not a checkpoint": (
        lambda w: ["analyze", str(w.write("notes.ckpt", "just text\n"))],
        "not a PyTorch checkpoint",
    ),
    "analyze/checkpoint that runs code": (lambda w: ["analyze", str(w.files / "runs_code.ckpt")], "could run code"),
    "analyze/another architecture": (
        lambda w: ["analyze", str(w.files / "foreign.ckpt")],
        "another architecture (tensor encoder.blocks.0.ffn.0.bias has shape (64,) there",
    ),
    "analyze/wrong type": (lambda w: ["analyze", str(w.trained), "--samples", "many"], "--samples"),
    "analyze/out of range": (lambda w: ["analyze", str(w.trained), "--energy", "1.5"], "--energy"),
    "analyze/zeroed checkpoint": (lambda w: ["analyze", str(w.files / "zeroed.ckpt")], "damaged"),
    # ----------------------------------------------------------------------------------------- bench
    "bench/unknown variant": (lambda w: ["bench", "--variants", "bigbird"], "--variants"),
    "bench/wrong type": (lambda w: ["bench", "--n", "many"], "--n"),
    "bench/out of range": (lambda w: ["bench", "--batch", "0"], "--batch: must be >= 1"),
    "bench/contradictory": (lambda w: ["bench", "--d-model", "30", "--heads", "4"], "not divisible"),
    "bench/negative threads": (lambda w: ["bench", "--threads", "-4"], "--threads"),
    "bench/nan min time": (lambda w: ["bench", "--min-time", "nan"], "--min-time"),
    "bench/out is a file": (lambda w: ["bench", "--out", str(w.write("bench_file.txt", "x"))], "is a file"),
    "bench/batch past the memory": (
        lambda w: ["bench", "--batch", "100000000", "--out", str(w.root / "bench_out")],
        "--batch: 100000000 needs about",
    ),
    # ----------------------------------------------------------------------------------------- pipeline
    "pipeline/variant named by an absolute path": (
        lambda w: ["pipeline", str(w.write("p_abs.yaml", PIPELINE_ABSOLUTE_VARIANT.format(w=w)))],
        "variants./",
    ),
    "pipeline/malformed yaml": (
        lambda w: ["pipeline", str(w.write("p_bad.yaml", "pretrain: {config: x\n"))],
        "malformed YAML",
    ),
    "pipeline/unknown key": (
        lambda w: ["pipeline", str(w.write("p_key.yaml", "pretrainn: {}\n"))],
        "pretrainn: unknown key (allowed here: ",
    ),
    "pipeline/missing parts": (lambda w: ["pipeline", str(w.write("p_empty.yaml", "variants: {}\n"))], "required"),
    # ----------------------------------------------------------------------------------------- time-to-target
    "time-to-target/wrong type": (lambda w: ["time-to-target", str(w.trained), "--target", "low"], "--target"),
    "time-to-target/missing runs": (lambda w: ["time-to-target", str(w.files / "none"), "--target", "100"], "none"),
    "time-to-target/truncated metrics.json": (
        lambda w: [
            "time-to-target",
            str(spoiled_run(w, "t_trunc", lambda r: truncate_text(r / "metrics.json"))),
            "--target",
            "100",
        ],
        "metrics.json: not valid JSON",
    ),
    "time-to-target/metrics.json a folder": (
        lambda w: ["time-to-target", str(spoiled_run(w, "t_dir", metrics_folder)), "--target", "100"],
        "metrics.json: not a file",
    ),
    "time-to-target/malformed config.yaml": (
        lambda w: [
            "time-to-target",
            str(spoiled_run(w, "t_cfg", lambda r: spoil_config(r / CHECKPOINT))),
            "--target",
            "100",
        ],
        "config.yaml: malformed YAML",
    ),
    "time-to-target/nan target": (lambda w: ["time-to-target", str(w.trained), "--target", "nan"], "--target"),
    "time-to-target/inf target": (lambda w: ["time-to-target", str(w.trained), "--target", "inf"], "--target"),
    # ----------------------------------------------------------------------------------------- pipeline variants
    "pipeline/override not valid yaml": (
        lambda w: ["pipeline", str(w.write("p_ovr.yaml", PIPELINE_BAD_OVERRIDE))],
        "malformed YAML",
    ),
    # ----------------------------------------------------------------------------------------- the command line
    "cli/unknown command": (lambda w: ["serve"], "invalid choice"),
    "cli/missing argument": (lambda w: ["train"], "required"),
}


# ----------------------------------------------------------------------------------------- data read as written
def raw_source(w, name: str, data: bytes) -> str:
    (w.files / name).write_bytes(data)
    return f"data.source={w.files / name}"


LATIN_1_JSONL = b'{"text": "ok"}\n{"text": "caf\xe9"}\n'  # a string of a .jsonl file in Latin-1, not UTF-8


def classes_in_other_orders(w) -> str:
    """A folder of parquet splits whose validation split names other classes than train's."""
    from datasets import ClassLabel, Dataset, Features, Value

    folder = w.files / "parquet_classes"
    if not folder.exists():
        folder.mkdir()
        for split, names in (("train", ["neg", "pos"]), ("validation", ["neg", "pos", "mid"])):
            features = Features({"text": Value("string"), "label": ClassLabel(names=names)})
            rows = {"text": [f"{split} {i}" for i in range(20)], "label": [i % 2 for i in range(20)]}
            Dataset.from_dict(rows, features=features).to_parquet(str(folder / f"{split}.parquet"))
    return f"data.source={folder}"


def experiment_file(w, name: str, link: bool = False) -> str:
    """``runs/<name>`` a file (or a link to nothing) where the experiment's folder of versions belongs."""
    target = w.root / "runs" / name
    if not os.path.lexists(target):
        target.parent.mkdir(exist_ok=True)
        target.symlink_to(w.root / "runs" / "gone") if link else target.write_text("x\n")
    return f"experiment={name}"


def classify(w, *args: str) -> list[str]:
    return train(w, "task=classify", "data.tokenizer.kind=byte", *args)


PIPELINE_PRETRAIN_CLASSIFY = (
    f"pretrain: {{{{config: {CONFIG.parent}/finetune_imdb.yaml}}}}\nvariants: {{{{a: []}}}}\n"
    f"tasks: {{{{t: {{{{config: {CONFIG.parent}/finetune_imdb.yaml}}}}}}}}\noutput_dir: {{w.root}}/runs\n"
)
LONG_ALIASES = f"experiment: &a {'x' * 400_000}\nnotes: [{', '.join(['*a'] * 99_000)}]\n"  # 40 GB once expanded
ROWS = "".join(f"review {i},{i % 2}\n" for i in range(20))

CASES.update(
    {
        "train/an empty text in a classification file": (
            lambda w: classify(w, source(w, "empty_text.csv", f"text,label\n{ROWS},1\n{ROWS}")),
            "data.text_column: the 'text' text at row 21 of",
        ),
        "train/a missing text in a .jsonl file": (
            lambda w: classify(w, source(w, "null_text.jsonl", '{"text": "a", "label": 1}\n{"label": 0}\n')),
            "null_text.jsonl is missing",
        ),
        "train/invalid UTF-8 inside a .jsonl string": (
            lambda w: train(w, raw_source(w, "latin.jsonl", LATIN_1_JSONL)),
            "latin.jsonl: line 2 is not UTF-8 text (byte 0xe9)",
        ),
        "train/a UTF-16 text file": (
            lambda w: train(w, raw_source(w, "u16.txt", "one line\nanother\n".encode("utf-16"))),
            "u16.txt: line 1 is not UTF-8 text (byte 0xff) (a UTF-16 file?)",
        ),
        "train/a label NA in a csv": (
            lambda w: classify(w, source(w, "na_label.csv", f"text,label\n{ROWS}more,NA\n")),
            "data.label_column: 'label' holds strings ('NA' at row 21 of",
        ),
        "train/parquet splits that name other classes": (
            lambda w: classify(w, classes_in_other_orders(w)),
            "has the classes ['neg', 'pos', 'mid'], train has ['neg', 'pos']: not the same classes",
        ),
        "train/a header-less file with other columns than named": (
            lambda w: classify(
                w, source(w, "cola.tsv", "gj04\t1\t\tA sentence.\n" * 20), "data.column_names=[label,text]"
            ),
            "data.column_names: names 2 columns (label, text), but the first row of",
        ),
        "train/column_names without the text column": (
            lambda w: train(w, "data.column_names=[source,label,original,sentence]"),
            "data.text_column: 'text' is not one of data.column_names",
        ),
        "train/a data file that is a folder": (
            lambda w: train(
                w, f"data.source={(w.files / 'folder.csv').mkdir(exist_ok=True) or w.files / 'folder.csv'}"
            ),
            "folder.csv' is a folder, not a data file",
        ),
        "train/runs/<experiment> a file": (
            lambda w: train(w, experiment_file(w, "afile")),
            "runs/afile is a file, not a folder (the runs of experiment 'afile' go into",
        ),
        "train/runs/<experiment> a link to nothing": (
            lambda w: train(w, experiment_file(w, "alink", link=True)),
            "runs/alink is a symbolic link to",
        ),
        "pipeline/runs/<experiment> a file": (
            lambda w: [
                "pipeline",
                str(w.write("p_file.yaml", PIPELINE_PRETRAIN_CLASSIFY.format(w=w))),
                experiment_file(w, "pfile"),
            ],
            "runs/pfile is a file, not a folder",
        ),
        "pipeline/a classification config as pretraining": (
            lambda w: ["pipeline", str(w.write("p_cls.yaml", PIPELINE_PRETRAIN_CLASSIFY.format(w=w)))],
            "variants.a: the results table reads 'val/ppl' from its pretraining run, which task 'classify' does not",
        ),
        "analyze/index past the singular values": (
            lambda w: ["analyze", str(w.trained), "--index", "9"],
            "--index: 9 is past the singular values of the attention matrices (layer 0: 8, layer 1: 8); allowed: 1 to 8",
        ),
        "analyze/index past n": (
            lambda w: ["analyze", str(w.trained), "--index", "1000"],
            "(at most model.max_len=32 per layer); allowed: 1 to 32",
        ),
        "train/yaml list of 99,000 aliases of a 400 kB string": (
            lambda w: ["train", str(w.write("long_aliases.yaml", LONG_ALIASES))],
            "expands to more than 2,097,152 characters of text",
        ),
    }
)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}  # links too


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gets_one_line_exit_2_and_writes_nothing(world, case, capsys, monkeypatch):
    build, words = CASES[case]
    monkeypatch.chdir(world.root)
    argv = build(world)
    capsys.readouterr()
    before = snapshot(world.root)
    code = cli.main(argv)
    out = capsys.readouterr()
    assert code == 2, out.err[-2000:]
    # (progress bars of data loading may precede it)
    errors = [line for line in out.err.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert len(errors) == 1 and errors[0].startswith("error: ") and out.err.strip().endswith(errors[0]), out.err
    assert words in errors[0], errors[0]
    assert PASSWORD not in out.out + out.err
    assert snapshot(world.root) == before, "files were written, changed or removed"
    assert not (world.root / "code_ran").exists()


@pytest.mark.parametrize("rank, lines", [({}, 1), ({"RANK": "0"}, 1), ({"LOCAL_RANK": "1"}, 0), ({"RANK": "3"}, 0)])
def test_under_ddp_only_rank_0_prints_the_error_line(world, monkeypatch, capsys, rank, lines):
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in rank.items():  # as Lightning sets them in the ranks it launches, which run the command again
        monkeypatch.setenv(name, value)
    assert cli.main(train(world, "model.dropout=1.5")) == 2
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("error: ")]) == lines and "Traceback" not in err


# sysfs takes no new file, whoever asks; its permission bits (os.access) let root through.
UNWRITABLE = "/sys"

needs_sysfs = pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="no sysfs here (Linux only)")


def no_cache_variables(monkeypatch) -> None:
    """Neither HF_HOME nor another variable naming the Hugging Face cache: it lies under HOME."""
    for key in ("HF_HOME", "HF_DATASETS_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)


@needs_sysfs
@pytest.mark.parametrize(
    "env, args, words",
    [
        pytest.param(
            {"HOME": UNWRITABLE},
            [],
            f"HF_HOME: {UNWRITABLE}/.cache/huggingface: cannot write into {UNWRITABLE} (",
            id="HOME unwritable, HF_HOME unset",
        ),
        pytest.param({}, [f"data.cache_dir={UNWRITABLE}/cache"], f"cannot write into {UNWRITABLE} (", id="cache_dir"),
        pytest.param({}, [f"output_dir={UNWRITABLE}/runs"], "output_dir: ", id="output_dir"),
        pytest.param({}, [f"run_dir={UNWRITABLE}/run"], "run_dir: ", id="run_dir"),
    ],
)
def test_a_folder_that_takes_no_file_is_one_line_even_for_root(world, monkeypatch, capsys, env, args, words):
    no_cache_variables(monkeypatch)
    if not env:  # the Hugging Face cache where the tests keep it
        monkeypatch.setenv("HF_HOME", str(world.root / "hf"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    before = snapshot(world.root)
    assert cli.main(train(world, *args)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and words in err and "cannot write into" in err, err
    assert snapshot(world.root) == before


def test_a_writable_home_passes_the_cache_check_and_keeps_nothing(world, tmp_path, monkeypatch, capsys):
    """HF_HOME unset: the cache goes under HOME, which is tried by writing a file there; none is left, and the
    folder's timestamp does not move."""
    no_cache_variables(monkeypatch)
    monkeypatch.setenv("HOME", str(tmp_path))
    stamp = tmp_path.stat().st_mtime_ns
    assert cli.main([*train(world), "--check"]) == 0, capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [] and tmp_path.stat().st_mtime_ns == stamp


@pytest.mark.processes
def test_a_real_process_prints_one_line_and_no_traceback(world):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.cli",
            "train",
            str(CONFIG),
            *world.tiny,
            f"run_dir={resumable(world, 'r_trunc', truncate)}",
            "resume=true",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert len(errors) == 1 and "truncated" in errors[0], done.stderr[-2000:]
