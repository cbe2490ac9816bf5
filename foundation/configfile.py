"""Configuration files and overrides, merged onto a structured (typed) schema.

Order: the schema's defaults < a YAML file (after its ``defaults: [base.yaml, …]`` bases, paths relative to
it) < ``key=value`` overrides. OmegaConf validates keys, types and ``Literal`` choices; every failure becomes
one :class:`~foundation.errors.ConfigError` line naming the full key and what is allowed.

A mapping's ``options`` belong to the ``kind`` beside it: a layer that sets a different ``kind`` starts from
no options (the options it gives itself are kept), so ``model.attention.kind=full`` on a Linformer file does
not carry Linformer's options over. Overrides apply left to right, each one a layer.

Bounds: a YAML file or override is refused in one line, before anything is built from it, when it is larger
than ``MAX_FILE_BYTES`` or would expand to more than ``MAX_VALUES`` values or ``MAX_TEXT`` characters. YAML
aliases share one object, so a few hundred bytes of nested aliases (``a: &a [1, 1]``, ``b: &b [*a, *a]``, …)
describe billions of values that a merge would copy one by one, and a list of 99,000 aliases of one 400 kB string
describes 40 GB of text that OmegaConf would scan character by character; :func:`expanded_size` counts both
without expanding anything, whatever the aliases nest or repeat (an anchor defined twice is malformed YAML). The
file is parsed by libyaml where PyYAML has it (50 times faster than the pure-Python parser). In the same
way, interpolations repeated inside one another (``b: ${a}${a}``, ``c: ${b}${b}``, …) describe strings of billions
of characters that resolving would build: :func:`check_interpolations` measures every interpolated string from
the lengths of what it names, without building it, and refuses one longer than ``MAX_STRING`` characters.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from foundation.errors import ConfigError

Misplaced = Callable[[str], Optional[str]]
MAX_FILE_BYTES = 1 << 20  # a config or study file
MAX_VALUES = 10_000  # values a file or an override may expand to (every config here has at most a few hundred)
MAX_TEXT = 1 << 21  # characters (keys and string values) it may expand to: twice what a file may hold
MAX_STRING = 100_000  # characters an interpolated string may resolve to (a path is at most 4,096 bytes)
_REFERENCE = re.compile(r"\$\{([^${}]*)\}")  # an innermost ${...}


def expanded_size(data: Any, limit: int = MAX_VALUES, text_limit: int = MAX_TEXT) -> tuple[int, int]:
    """(values, characters) that ``data`` (as loaded: an alias is the anchored object itself, shared) holds once every
    alias is expanded: each value counts one, each string (a mapping's keys too) its length. Counting stops early,
    at ``limit`` + 1 values or ``text_limit`` + 1 characters; a container is measured once (memoised by identity),
    so the cost is linear in the number of distinct objects plus the values counted, whatever the nesting."""
    over = (limit + 1, text_limit + 1)
    memo: dict[int, tuple[int, int]] = {}

    def size(node: Any, depth: int) -> tuple[int, int]:
        if isinstance(node, (str, bytes)):
            return 1, len(node)
        if not isinstance(node, (dict, list, set)):
            return 1, 0
        if depth > 100:
            return over  # nesting this deep is no configuration
        if id(node) in memo:
            return memo[id(node)]
        memo[id(node)] = over  # a cycle (a recursive alias) expands forever
        values, chars = 1, 0
        if isinstance(node, dict):
            chars = sum(len(key) for key in node if isinstance(key, str))
        for child in node.values() if isinstance(node, dict) else node:
            v, c = size(child, depth + 1)
            values, chars = values + v, chars + c
            if values > limit or chars > text_limit:
                break
        memo[id(node)] = (min(values, limit + 1), min(chars, text_limit + 1))
        return memo[id(node)]

    return size(data, 0)


def check_interpolations(cfg: Any, limit: int = MAX_STRING) -> None:
    """Refuse, in one ConfigError line naming the key, a string whose interpolations would resolve to more than
    ``limit`` characters; measured from the lengths of the values they name (memoised: linear in the config's
    size), nothing is resolved. A resolver's own output (``${oc.env:…}``) counts as its text."""
    flat = flatten(OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg)
    if not any(isinstance(v, str) and "${" in v for v in flat.values()):
        return
    memo: dict[str, int] = {}

    def target(key: str, name: str) -> str:
        if not name.startswith("."):
            return name.replace("[", ".").replace("]", "")
        dots = len(name) - len(name.lstrip("."))
        parent = key.split(".")[:-dots]
        return ".".join([*parent, name.lstrip(".")])

    def length(key: str) -> int:
        if key in memo:
            return memo[key]
        memo[key] = 0  # a circular interpolation: OmegaConf names it when it resolves
        if key in flat:
            value = flat[key]
            if not isinstance(value, str):
                total = len(str(value))
            else:
                refs = _REFERENCE.findall(value)
                total = len(_REFERENCE.sub("", value))
                for ref in refs:
                    total += len(ref) if ":" in ref else length(target(key, ref))
                    if total > limit:
                        break
        else:  # a mapping, shown whole
            total = sum(length(k) + len(k) for k in flat if k.startswith(f"{key}."))
        memo[key] = min(total, limit + 1)
        return memo[key]

    for key, value in flat.items():
        if isinstance(value, str) and "${" in value and length(key) > limit:
            raise ConfigError(
                f"{key}: its interpolations (${{...}}) would resolve to more than {limit:,} characters; refused"
            )


class _UniqueKeys(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where PyYAML was built with it
    """YAML's safe loader that refuses a mapping holding one key twice (plain YAML keeps the last silently: a
    file with two ``model:`` sections would lose the first)."""


def _unique_mapping(loader: _UniqueKeys, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *alias" merges may repeat
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            twice = key in seen
        except TypeError:  # an unhashable key: the constructor below refuses it
            break
        if twice:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice (only one may stand)", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def safe_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load`` of ``text`` (a key given twice in one mapping refused), refused in one line when
    malformed or when it expands past the bound."""
    try:
        loader = _UniqueKeys(text)  # what yaml.safe_load does, with the loader above
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context:  # "found duplicate anchor; first occurrence at line 1, second occurrence"
            problem = f"{context}{f' at line {start.line + 1}' if start is not None else ''}, {problem}"
        raise ConfigError(f"{where}: malformed YAML{at} ({problem})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None
    except ValueError as err:  # a value its constructor refuses: an int of 5,000 digits, 2001-02-30
        raise ConfigError(f"{where}: a value YAML cannot read ({str(err).splitlines()[0]})") from None
    values, chars = expanded_size(data)
    if values > MAX_VALUES:
        raise ConfigError(f"{where}: expands to more than {MAX_VALUES:,} values (nested YAML aliases?); refused")
    if chars > MAX_TEXT:
        raise ConfigError(
            f"{where}: expands to more than {MAX_TEXT:,} characters of text (YAML aliases repeating a long "
            "value?); refused"
        )
    return data


def one_line(err: OmegaConfBaseException, schema: Any, misplaced: Optional[Misplaced] = None) -> str:
    """An OmegaConf error as ``<full key>: <what is wrong>``; an unknown key says where it belongs
    (``misplaced(key)``) or lists the keys allowed there."""
    key = getattr(err, "full_key", None) or "config"
    msg = str(getattr(err, "msg", err)).splitlines()[0]
    if isinstance(err, ConfigKeyError):
        hint = misplaced(key) if misplaced is not None else None
        if hint:
            return f"{key}: {hint}"
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
    if "\x00" in str(path):
        raise ConfigError(f"config file {str(path)!r}: a path cannot hold a NUL byte")
    if not path.is_file():
        raise ConfigError(f"config file {path}: {'a folder, not a file' if path.is_dir() else 'not found'}")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ConfigError(
            f"config file {path}: {path.stat().st_size} bytes, more than the {MAX_FILE_BYTES} a config file may have"
        )
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ConfigError(f"config file {path}: line {line} is not UTF-8 text (byte 0x{data[err.start]:02x})") from None
    except OSError as err:
        raise ConfigError(f"config file {path}: cannot read ({err.strerror or type(err).__name__})") from None
    data = safe_yaml(text, f"config file {path}")
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
    if not isinstance(bases, list) or not all(isinstance(b, str) and b for b in bases):
        raise ConfigError(f"config file {path}: defaults: must be a file name or a list of file names, got {bases!r}")
    merged: Any = OmegaConf.create()
    try:
        for base in bases:
            base_data = resolve_includes(path.parent / base, seen + (path.resolve(),))
            merged = OmegaConf.merge(without_replaced_options(merged, base_data), base_data)
        return OmegaConf.to_container(OmegaConf.merge(without_replaced_options(merged, data), OmegaConf.create(data)))
    except OmegaConfBaseException as err:
        raise ConfigError(f"config file {path}: {str(err).splitlines()[0]}") from None


def parse_overrides(overrides: list[str]) -> list[DictConfig]:
    """``key=value`` strings as nested configs, one layer per override in their order (values parsed as YAML)."""
    for override in overrides:
        key, eq, value = override.partition("=")
        if not eq:
            raise ConfigError(f"override {override!r}: expected key=value")
        if not key or any(not part.isidentifier() for part in key.split(".")):
            raise ConfigError(f"override {override!r}: the key must be dotted names (like model.attention.kind)")
        safe_yaml(value, f"{key}: value {value!r}")  # malformed, or expanding past the bound
    try:
        return [OmegaConf.from_dotlist([override]) for override in overrides]
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ConfigError(f"overrides: {str(err).splitlines()[0]}") from None


def _plain(layer: Any) -> Any:
    return OmegaConf.to_container(layer) if isinstance(layer, DictConfig) else layer


def without_replaced_options(cfg: Any, layer: Any) -> Any:
    """``cfg`` without the ``options`` of every mapping whose ``kind`` ``layer`` changes (module docstring)."""
    layer = _plain(layer)
    if not isinstance(layer, dict) or not isinstance(cfg, (dict, DictConfig)):
        return cfg
    if "kind" in layer and "options" in cfg and cfg.get("kind") != layer["kind"]:
        cfg["options"] = {}
    for key, value in layer.items():
        if isinstance(value, dict) and key in cfg:
            without_replaced_options(cfg[key], value)
    return cfg


def merge(schema: Any, layers: list[Any], misplaced: Optional[Misplaced] = None) -> DictConfig:
    """Merge plain layers onto a structured schema, turning OmegaConf errors into ConfigError (an unknown key
    named by ``misplaced`` says where it belongs)."""
    cfg = OmegaConf.structured(schema)
    try:
        for i, layer in enumerate(layers):
            try:
                # in place: OmegaConf.merge would copy the whole config once per layer, most of a merge's time
                without_replaced_options(cfg, layer).merge_with(layer)
            except (TypeError, ValueError) as err:  # e.g. a list given where a mapping is: OmegaConf names no key
                before = merge(schema, layers[:i], misplaced)  # the config this layer failed on
                raise ConfigError(f"{_blame(before, layer)}: {str(err).splitlines()[0]}") from None
        check_interpolations(cfg)  # before resolving: nested interpolations can describe gigabytes
        OmegaConf.resolve(cfg)  # interpolations (${...}) now, while an error is still one line
    except OmegaConfBaseException as err:
        raise ConfigError(one_line(err, schema, misplaced)) from None
    return cfg


def _blame(cfg: DictConfig, layer: Any) -> str:
    """The dotted key of ``layer`` whose merge onto ``cfg`` fails (the error path only)."""
    plain = _plain(layer)
    if not isinstance(plain, dict):
        return "config"
    for key, value in flatten(plain).items():
        nested: Any = value
        for part in reversed(key.split(".")):
            nested = {part: nested}
        try:
            OmegaConf.merge(cfg, nested)
        except Exception:  # noqa: BLE001  (any failure names this key)
            return key
    return "config"


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
