"""A study's identity: the search space and the objective it was started with.

Both are stored on the study when it is created (user attr ``identity``). A study file whose space or objective
changed since is refused in one line listing what changed: its old trials answer another question, and a grid
with a param added would count them toward points they never ran. The ``seed`` param's values are not part of the
identity (``--add-seeds`` grows them; a grid's budget counts its points, so new seeds' points run). ``sweep
--new-study`` starts the study afresh, the earlier one kept aside.
"""

from __future__ import annotations

import json
from typing import Any

from omegaconf import OmegaConf

from foundation.configfile import flatten
from sweeps.schema import SEED_PARAM
from sweeps.study import Study

IDENTITY = "identity"  # user attr of a stored study


def identity_of(study: Study) -> dict[str, Any]:
    """What a stored study must keep: its space (the seed param's values aside) and its objective, as JSON."""
    space = OmegaConf.to_container(study.spec.space, resolve=True)
    if SEED_PARAM in space:
        space[SEED_PARAM] = {"type": space[SEED_PARAM].get("type")}
    objective = [{"metric": m, "direction": d} for m, d in zip(study.metrics, study.directions)]
    return json.loads(json.dumps({"space": space, "objective": objective}))


def changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between two identities, one phrase per param or setting, e.g. ``space.k.choices: [8, 16]
    there, [8] here`` or ``space.lr: added here``."""
    out = []
    there_space, here_space = stored.get("space", {}), current.get("space", {})
    for name in [*there_space, *(n for n in here_space if n not in there_space)]:
        if name not in here_space:
            out.append(f"space.{name}: removed here")
        elif name not in there_space:
            out.append(f"space.{name}: added here")
        else:
            there, here = flatten(there_space[name] or {}), flatten(here_space[name] or {})
            out += [
                f"space.{name}.{key}: {there.get(key)!r} there, {here.get(key)!r} here"
                for key in sorted(set(there) | set(here))
                if there.get(key) != here.get(key)
            ]
    if stored.get("objective") != current.get("objective"):
        out.append(f"objective: {stored.get('objective')!r} there, {current.get('objective')!r} here")
    return out


def changed(stored: dict[str, Any], study: Study) -> list[str]:
    """The changes of ``study``'s file against the identity its storage recorded."""
    return changes(stored, identity_of(study))
