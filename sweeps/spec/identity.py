"""A study's identity: everything that decides its trials' results.

Stored on the study when it is created (user attr ``identity``): the search space (the ``seed`` param's values
aside), the objective, the preset, the config every trial starts from (the base experiment resolved with the
study's ``overrides``, flattened, each ``auto`` option of its attention kind written as what it resolves to
(:func:`training.resume.settled`); only the keys of :data:`NOT_IDENTITY` aside, which never change a trial's numbers)
and the data's identity (a fingerprint of the corpus files, :func:`training.resume.data_identity`). Together with a
trial's params they decide its config, so two trials of one study always answer one question. A resumed *run* may
train for more steps (``training.resume.MAY_CHANGE_ON_RESUME``); a *study* may not: trials of 8 and 16 steps would
be pooled in one arm.

A study file whose identity changed since is refused in one line listing what changed: its old trials answer
another question, and a grid with a param added would count them toward points they never ran. The ``seed``
param's values are not part of the identity (``--add-seeds`` grows them; a grid's budget counts its points, so
new seeds' points run). ``sweep --new-study`` starts the study afresh, the earlier one kept aside. A study of
the same name that carries no identity was not created by this suite (another program's, in a shared storage):
it is refused, never adopted.
"""

from __future__ import annotations

import json
from typing import Any

from omegaconf import OmegaConf

from foundation.configfile import flatten, to_container
from sweeps.spec.schema import SEED_PARAM
from sweeps.spec.study import Study
from training.resume import data_identity, settled

IDENTITY = "identity"  # user attr of a stored study
# The config keys a study's identity leaves out: those that never change a trial's numbers (its scores, its curve,
# its pruning), so that a study run again with them changed is the same study. Tested: a trial trained with every one
# of them changed scores the same to the last bit (tests/sweeps/spec/test_identity.py).
NOT_IDENTITY = (
    # where files go
    "experiment",
    "resume",
    "run_dir",
    "output_dir",
    "data.cache_dir",
    # how fast: loader processes (batches and MLM masks are drawn per batch from the seed, the epoch, the rank and the
    # batch index, whichever process draws them) and threads (which the sweep sets to cores/W per worker anyway)
    "data.num_workers",
    "trainer.cpu_threads",
    # what is logged, and when: no draw and no step depends on it (the spectrum is measured in eval mode, no grad)
    "trainer.log_every_n_steps",
    "trainer.spectrum_every_n_val",
)
# Keys the identity holds since a later version: a study stored before it held them is not compared on them (its
# stored identity lacks them), rather than refused as a study that changed. (trainer.compile: a key since 2026-12-04;
# its default, auto, is off on the CPU, where every study stored before it ran.)
HELD_SINCE_LATER = ("trainer.max_steps", "trainer.compile")
# Keys added later whose value then reproduces what every study stored before them ran: a stored identity without one
# reads as holding that value, so an unchanged study resumes and a study that sets another value is refused.
# (optim.projection_lr_scale: a key since 2026-12-06; before it E/F trained at the model's learning rate.)
NEUTRAL_SINCE_LATER = {"optim.projection_lr_scale": 1.0}


def identity_of(study: Study) -> dict[str, Any]:
    """What a stored study must keep, as JSON: its space (the seed param's values aside), its objective, its
    preset, its trials' shared config and its data's fingerprint."""
    space = OmegaConf.to_container(study.spec.space, resolve=True)
    if SEED_PARAM in space:
        space[SEED_PARAM] = {"type": space[SEED_PARAM].get("type")}
    objective = [{"metric": m, "direction": d} for m, d in zip(study.metrics, study.directions)]
    shared = flatten(to_container(study.shared))
    config = {k: v for k, v in settled(shared).items() if k not in NOT_IDENTITY}
    return json.loads(
        json.dumps(
            {
                "space": space,
                "objective": objective,
                "preset": study.preset,
                "config": config,
                "data": data_identity(study.shared),
                # a replication's fresh seeds are fixed before it runs: changing them starts another replication
                **({"replicate": study.replicate} if study.replicate is not None else {}),
                # a study at F times the budget (its config holds the scaled steps too)
                **({"budget": study.factor} if study.factor is not None else {}),
            },
            default=str,
        )
    )


def changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between two identities, one phrase per param or setting, e.g. ``space.k.choices: [8, 16]
    there, [8] here``, ``space.lr: added here`` or ``config.optim.lr: 0.001 there, 0.002 here``."""
    out = []
    there_space, here_space = stored.get("space", {}), current.get("space", {})
    for name in [*there_space, *(n for n in here_space if n not in there_space)]:
        if name not in here_space:
            out.append(f"space.{name}: removed here")
        elif name not in there_space:
            out.append(f"space.{name}: added here")
        else:
            out += _differ(f"space.{name}.", flatten(there_space[name] or {}), flatten(here_space[name] or {}))
    if stored.get("objective") != current.get("objective"):
        out.append(f"objective: {stored.get('objective')!r} there, {current.get('objective')!r} here")
    if "config" not in stored:
        out.append("config: not recorded there (a study started without its config in its identity)")
    else:
        there = {**NEUTRAL_SINCE_LATER, **settled(stored["config"])}
        here = {k: v for k, v in current.get("config", {}).items() if k in there or k not in HELD_SINCE_LATER}
        out += _differ("config.", there, here)
    for key in ("preset", "data", "replicate", "budget"):
        if stored.get(key) != current.get(key):
            out.append(f"{key}: {stored.get(key)!r} there, {current.get(key)!r} here")
    return out


def _differ(prefix: str, there: dict, here: dict) -> list[str]:
    return [
        f"{prefix}{key}: {there.get(key)!r} there, {here.get(key)!r} here"
        for key in sorted(set(there) | set(here))
        if there.get(key) != here.get(key)
    ]


def changed(stored: dict[str, Any], study: Study) -> list[str]:
    """The changes of ``study``'s file against the identity its storage recorded."""
    return changes(stored, identity_of(study))
