"""Configuration files and overrides, merged onto a structured (typed) schema.

Order: the schema's defaults < a YAML file (after its ``defaults: [base.yaml, …]`` bases, paths relative to
it) < ``key=value`` overrides. OmegaConf validates keys, types and ``Literal`` choices; every failure becomes
one :class:`~foundation.errors.ConfigError` line naming the full key and what is allowed.

Renamed keys (``renamed``: old dotted key → (new dotted key, {old value: new value})) keep working for one
release: each layer is rewritten before the merge and one deprecation line per old key goes to stderr.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from foundation.errors import ConfigError

Renamed = Mapping[str, tuple[str, Mapping[Any, Any]]]


def one_line(err: OmegaConfBaseException, schema: Any) -> str:
    """An OmegaConf error as ``<full key>: <what is wrong>``; an unknown key lists the keys allowed there."""
    key = getattr(err, "full_key", None) or "config"
    msg = str(getattr(err, "msg", err)).splitlines()[0]
    if isinstance(err, ConfigKeyError):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        cls: Any = schema
        for part in filter(None, parent.split(".")):
            cls = typing.get_type_hints(cls).get(part, cls) if dataclasses.is_dataclass(cls) else cls
            if typing.get_origin(cls) is typing.Union:
                cls = next(a for a in typing.get_args(cls) if a is not type(None))
        allowed = ", ".join(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ""
        return f"{key}: unknown key" + (f" (allowed here: {allowed})" if allowed else "")
    return f"{key}: {msg}"


def read_yaml(path: Path) -> dict:
    """A YAML file's top-level mapping ({} for an empty file); one ConfigError line for anything else."""
    if not path.is_file():
        raise ConfigError(f"config file {path}: not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None)
        raise ConfigError(f"config file {path}: malformed YAML{where}" + (f" ({problem})" if problem else "")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping of keys, got {type(data).__name__}")
    return data


def resolve_includes(path: Path, seen: tuple = ()) -> dict:
    """The file's mapping merged over its ``defaults`` bases (a name or a list of names, relative to it)."""
    if path.resolve() in seen:
        raise ConfigError(f"config file {path}: circular 'defaults'")
    data = read_yaml(path)
    bases = data.pop("defaults", []) or []
    if isinstance(bases, str):
        bases = [bases]
    merged: Any = OmegaConf.create()
    for base in bases:
        merged = OmegaConf.merge(merged, resolve_includes(path.parent / str(base), seen + (path.resolve(),)))
    return OmegaConf.to_container(OmegaConf.merge(merged, OmegaConf.create(data)))


def parse_overrides(overrides: list[str]) -> DictConfig:
    """``key=value`` strings as one nested config (values parsed as YAML)."""
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"override {bad[0]!r}: expected key=value")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise ConfigError(f"overrides: {str(err).splitlines()[0]}") from None


def _plain(layer: Any) -> Any:
    return OmegaConf.to_container(layer) if isinstance(layer, DictConfig) else layer


def rename_keys(layer: Any, renamed: Renamed, warn: bool = True) -> Any:
    """``layer`` (nested or with dotted keys) with every old key of ``renamed`` moved to its new key."""
    layer = _plain(layer)
    if not isinstance(layer, dict) or not renamed:
        return layer
    layer = dict(layer)
    for old, (new, values) in renamed.items():
        for flat in (True, False):
            found, value = _pop(layer, old, flat)
            if not found:
                continue
            value = values.get(value, value) if isinstance(value, (str, int, bool)) else value
            if flat:
                layer[new] = value
            else:
                _put(layer, new, value)
            if warn:
                print(f"warning: {old} is deprecated, use {new}"
                      + (f" ({', '.join(f'{a} → {b}' for a, b in values.items())})" if values else ""), file=sys.stderr)
    return layer


def _pop(layer: dict, dotted: str, flat: bool) -> tuple[bool, Any]:
    if flat:
        return (True, layer.pop(dotted)) if dotted in layer else (False, None)
    *parents, last = dotted.split(".")
    node = layer
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return False, None
    return (True, node.pop(last)) if last in node else (False, None)


def _put(layer: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = layer
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def merge(schema: Any, layers: list[Any], renamed: Optional[Renamed] = None) -> DictConfig:
    """Merge plain layers onto a structured schema, turning OmegaConf errors into ConfigError."""
    cfg = OmegaConf.structured(schema)
    try:
        for layer in layers:
            cfg = OmegaConf.merge(cfg, rename_keys(layer, renamed or {}))
    except OmegaConfBaseException as err:
        raise ConfigError(one_line(err, schema)) from None
    return cfg


def to_container(cfg: DictConfig) -> dict:
    """Plain dict for checkpoints and hparams (a DictConfig breaks weights-only loading)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def flatten(d: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``."""
    out: dict = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out
