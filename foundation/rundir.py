"""Run directories: where a run writes, and what ``init_from`` names.

A run directory ``<output_dir>/<experiment>/version_<i>/`` (or ``<output_dir>/<experiment>/<folder>/version_<i>/``, the
``train`` command's runs with overrides: ``bytes_mlm/kind=full/version_0``) holds ``config.yaml`` (the resolved
config), TensorBoard event files, ``checkpoints/last.ckpt``, ``tokenizer.json`` (when the data has a
tokenizer) and ``metrics.json``. A new run takes the next free version, so nothing of an earlier
run is overwritten; ``resume=true`` reopens the newest version that has a checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Iterator, Optional

from foundation.errors import ConfigError
from foundation.paths import check_folder, check_name

CHECKPOINT = Path("checkpoints") / "last.ckpt"
# The run's tokenizer (runs whose data has one): fine-tuning from this run encodes text with it.
TOKENIZER = Path("tokenizer.json")


def _versions(root: Path) -> list[Path]:
    found = [p for p in root.glob("version_*") if p.name.removeprefix("version_").isdigit()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("version_")))


def check_experiment_folder(output_dir: str, experiment: str) -> Path:
    """``<output_dir>/<experiment>``, where a new run takes its numbered version: a folder, or a path where one can
    be made (not a file, nothing inside a file, no link to nothing); else one ConfigError line naming it."""
    root = Path(output_dir) / experiment
    try:
        return check_folder("experiment", str(root))
    except ConfigError as err:
        raise ConfigError(
            f"{err} (the runs of experiment {experiment!r} go into {root}/version_<i>/: move it aside or choose "
            "another experiment or output_dir)"
        ) from None


NAME_LIMIT = 80  # characters of one folder name made of values (longer: cut, with a hash of the whole)


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted key's shortest tail that no other key of ``keys`` shares: ``model.attention.kind`` → ``kind``,
    and ``model.attention.options.k`` beside ``data.k`` → ``options.k``."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(other != key and (other == tail or other.endswith("." + tail)) for other in keys):
                break
        out[key] = tail
    return out


def owned_keys(keys: list[str], schema: list[str]) -> dict[str, str]:
    """Each dotted key of ``keys`` by its shortest tail that it is the first key of ``schema`` (a config's keys in
    their order; then ``keys`` not among them) to end with: ``model.dropout`` → ``dropout`` and
    ``model.attention.dropout`` → ``attention.dropout``, whichever of them is given. No two keys of one schema share a
    name, so the name of one key never depends on which others are given."""
    order = list(dict.fromkeys([*schema, *keys]))
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if next(k for k in order if k == tail or k.endswith("." + tail)) == key:
                break
        out[key] = tail
    return out


def key_value(key: str, value: object) -> str:
    """``key=value``, or the value alone where it already says its key (a study's arm labelled ``n=512`` for its
    ``n``: ``n=512``, not ``n=n=512``)."""
    text = str(value)
    return text if text.startswith(f"{key}=") else f"{key}={text}"


def values_name(values: dict[str, object], schema: Optional[list[str]] = None) -> str:
    """A folder name that says ``values``: ``kind=full,k=16`` (short keys), characters outside ``[A-Za-z0-9._=,+-]``
    as ``_``, at most :data:`NAME_LIMIT` characters (a longer one cut and ended by a hash of the whole).

    With the ``schema`` the keys belong to (a ``train`` run's overrides, whose folder a resume finds again), two
    different ``values`` never share a name: each key by the name it owns in the schema (:func:`owned_keys`), and
    where a character was replaced or a value holds the separator ``,`` (what the name said is lost) the name ends in
    a hash of the exact keys and values: ``source=my corpus.txt`` is ``source=my_corpus.txt-<8 hex digits>``, beside
    ``source=my_corpus.txt``. Without a schema (a study's arm, whose trials' folders end in their numbers) a value
    that already says its key is not prefixed again (:func:`key_value`)."""
    keys = short_keys(list(values)) if schema is None else owned_keys(list(values), schema)
    said = ",".join(key_value(keys[k], v) if schema is None else f"{keys[k]}={v}" for k, v in values.items())
    name = re.sub(r"[^A-Za-z0-9._=,+-]", "_", said)
    exact = ",".join(f"{k}={v}" for k, v in values.items())
    lost = schema is not None and (name != said or any("," in str(v) for v in values.values()))
    if lost or len(name) > NAME_LIMIT:
        name = f"{name[: NAME_LIMIT - 9]}-{hashlib.sha1((exact if lost else name).encode()).hexdigest()[:8]}"
    return name


def check_run_folder(output_dir: str, experiment: str, folder: str = "") -> Path:
    """Where a run takes its numbered version: ``<output_dir>/<experiment>``, or its ``folder`` inside it (a name
    that says the run's overrides, :func:`values_name`): one folder name, a folder or a path where one can be made,
    not a link; else one ConfigError line naming it. Nothing is created."""
    root = check_experiment_folder(output_dir, experiment)
    if not folder:
        return root
    check_name("run folder", folder)
    path = root / folder
    if len(path.parts) != len(root.parts) + 1:
        raise ConfigError(f"run folder: {folder!r} must be one folder name inside {root}")
    if path.is_symlink():
        raise ConfigError(f"run folder: {path} is a symbolic link; a folder belongs there (move it aside)")
    return check_folder("run folder", str(path))


RUN_DIR_ENV = "LINFORMER_LAB_RUN_DIR"  # rank 0's run directory, for the DDP ranks it launches


def choose_run_dir(
    output_dir: str, experiment: str, run_dir: Optional[str], resume: bool, rank: int = 0, folder: str = ""
) -> Path:
    """The directory this run writes to (not created here): ``run_dir`` when given, else the next free version (a
    resume: the newest with a checkpoint) in the experiment's folder or in its ``folder`` (:func:`check_run_folder`).

    Under DDP every rank runs the command. Rank 0 chooses; the ranks Lightning starts from it (``strategy=ddp``)
    read its choice from ``$LINFORMER_LAB_RUN_DIR`` (see :func:`shared_with_ranks`). Ranks started beside it
    (torchrun, srun) cannot agree on the next free version and need an explicit ``run_dir``.
    """
    started_beside = int(os.environ.get("WORLD_SIZE", "1")) > 1 and RUN_DIR_ENV not in os.environ  # torchrun
    if rank > 0 or started_beside:
        shared = os.environ.get(RUN_DIR_ENV) or run_dir
        if shared is None:
            raise ConfigError(
                "run_dir: a multi-process launch (torchrun, srun) needs run_dir=<a directory that "
                "every rank sees>: the ranks cannot agree on the next free version otherwise"
            )
        if rank > 0:
            return Path(shared)
    if run_dir is not None:
        path = Path(run_dir)
        if resume or not path.exists() or not any(path.iterdir()):
            return path
        raise ConfigError(f"run_dir: {path} already holds a run (set resume=true to continue it)")
    root = check_run_folder(output_dir, experiment, folder)
    versions = _versions(root)
    if resume:
        with_ckpt = [v for v in versions if (v / CHECKPOINT).is_file()]
        if not with_ckpt:
            raise ConfigError(
                f"resume: no {CHECKPOINT} under {root}/version_* to resume from; {_elsewhere(root, folder)}"
            )
        return with_ckpt[-1]
    nxt = int(versions[-1].name.removeprefix("version_")) + 1 if versions else 0
    return root / f"version_{nxt}"


def _elsewhere(root: Path, folder: str) -> str:
    """Where the run a resume did not find may be: a run of the experiment directly in its folder (the layout before
    runs were named by their overrides, or a run started without them), else how to name any run's folder."""
    earlier = [v for v in _versions(root.parent) if (v / CHECKPOINT).is_file()] if folder else []
    if earlier:
        return (
            f"{earlier[-1]} is a run of this experiment in its folder, not in the folder these overrides name "
            f"({folder}): to resume it, give run_dir={earlier[-1]}"
        )
    return "to resume a run that lies elsewhere, give its folder as run_dir=<folder>"


@contextlib.contextmanager
def shared_with_ranks(path: Path) -> Iterator[None]:
    """While the body runs (``Trainer.fit``, which starts the ranks of ``strategy=ddp``), ``$LINFORMER_LAB_RUN_DIR``
    names ``path``: the ranks inherit it. Restored afterwards, so that no later process inherits a stale one."""
    previous = os.environ.get(RUN_DIR_ENV)
    os.environ[RUN_DIR_ENV] = str(path.resolve())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(RUN_DIR_ENV, None)
        else:
            os.environ[RUN_DIR_ENV] = previous


# --------------------------------------------------------------------------------------- init_from
def init_from_checkpoint(init_from: str) -> Path:
    """The checkpoint ``init_from`` names: ``<run dir>/checkpoints/last.ckpt``, or the ``.ckpt`` file itself."""
    path = Path(init_from)
    ckpt = path / CHECKPOINT if path.is_dir() else path
    if not ckpt.is_file():
        raise ConfigError(
            f"init_from: no checkpoint at {str(ckpt)!r} (give a run directory holding {CHECKPOINT} or a .ckpt file)"
        )
    return ckpt


def init_from_run_dir(init_from: str) -> Path:
    """The run directory ``init_from`` (a run directory, or a checkpoint inside or beside one) belongs to."""
    path = Path(init_from)
    if not path.exists():
        raise ConfigError(f"init_from: {init_from!r} not found")
    if path.is_dir():
        return path
    return path.parents[1] if path.parent.name == CHECKPOINT.parent.name else path.parent


def init_from_tokenizer(init_from: str) -> Path:
    """The ``tokenizer.json`` of the run that ``init_from`` names."""
    run_dir = init_from_run_dir(init_from)
    tokenizer = run_dir / TOKENIZER
    if not tokenizer.is_file():
        raise ConfigError(
            f"init_from: no {TOKENIZER} in {str(run_dir)!r} (set data.tokenizer.path to the "
            f"tokenizer the encoder was pretrained with)"
        )
    return tokenizer
