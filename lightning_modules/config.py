"""The model's configuration and its rules, stated once.

:class:`ModelConfig` (with :class:`AttentionConfig`) is the ``model`` node of a run's config. :func:`check_model`
states every rule a model must satisfy; the encoder calls it before it builds anything, and the run's config
check calls the same function, so a wrong value is one line, exit 2, before anything is written.

Attention kinds and projection kinds are plug-ins (``lightning_modules/attention/``,
``lightning_modules/projections.py``): ``kind`` and ``projection`` are checked against their registries, and a
kind's own options (``attention.options``) against the kind's ``Options`` dataclass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Literal, Optional

from omegaconf import DictConfig, OmegaConf

from foundation.configfile import merge
from foundation.errors import ConfigError, check_number, require

# Upper bounds of the model's sizes: far above any model this suite trains, low enough that a typo (an extra
# zero or three) is one config line instead of a failed allocation after the run directory exists.
MAX_SIZE = {"max_len": 1 << 20, "d_model": 1 << 16, "n_heads": 1024, "n_layers": 1024, "d_ff": 1 << 18}


@dataclass
class AttentionConfig:
    # A registered attention kind (lightning_modules/attention/): full, linformer, ...
    kind: str = "linformer"
    # No output depends on a later position (every kind that has a causal form).
    causal: bool = False
    dropout: float = 0.0
    # The kind's own options, checked against its Options dataclass (e.g. kind: local, options: {window: 64}).
    options: Dict[str, Any] = field(default_factory=dict)


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
    # Positions added to the token embeddings, before any attention kind sees the input (so every kind, those
    # that compress the sequence axis included, gets the same position signal): learned (a trained table drawn
    # from N(0, position_scale²)) or sinusoidal (Vaswani et al.'s fixed table, scaled to rms position_scale).
    position: Literal["learned", "sinusoidal"] = "learned"
    position_scale: float = 0.02
    # Standard deviation of the initial linear and embedding weights (BERT's 0.02; narrow models learn to use
    # attention sooner from about 1/sqrt(d_model)). Linformer's E/F keep their own initialisation (attention.init).
    init_std: float = 0.02
    attention: AttentionConfig = field(default_factory=AttentionConfig)


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


def model_config(cfg: Any) -> DictConfig:
    """A validated, attribute-accessible ModelConfig from a dict, DictConfig or dataclass."""
    return merge(ModelConfig, [cfg], misplaced=misplaced_option)


def misplaced_option(key: str) -> Optional[str]:
    """What to write instead of ``key`` when it is a kind's option given beside ``attention.kind`` (None: not one)."""
    from lightning_modules.attention import ATTENTION_KINDS

    parent, _, name = key.rpartition(".")
    if parent.rpartition(".")[2] != "attention" or name in {f.name for f in fields(AttentionConfig)}:
        return None
    owners = [
        kind for kind, cls in ATTENTION_KINDS.items() if cls.Options and name in {f.name for f in fields(cls.Options)}
    ]
    if not owners:
        return None
    return f"an option of kind {' and '.join(map(repr, owners))}: write {parent}.options.{name}"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_model(model: DictConfig) -> None:
    """Every rule of a model config (ConfigError naming the key, the value and what is allowed)."""
    from lightning_modules.attention import ATTENTION_KINDS  # the kinds register themselves on import

    for key in ("max_len", "d_model", "n_heads", "n_layers", "d_ff"):
        check_number(f"model.{key}", model[key], 1, MAX_SIZE[key], integer=True)
    require(
        model.d_model % model.n_heads == 0,
        f"model.d_model: {model.d_model} is not divisible by model.n_heads={model.n_heads}",
    )
    require(
        _finite(model.dropout) and 0.0 <= model.dropout < 1.0, f"model.dropout: must be in [0, 1), got {model.dropout}"
    )
    require(
        _finite(model.init_std) and 0.0 < model.init_std <= 10.0,
        f"model.init_std: must be in (0, 10], got {model.init_std}",
    )
    require(
        _finite(model.position_scale) and 0.0 < model.position_scale <= 100.0,
        f"model.position_scale: must be in (0, 100], got {model.position_scale}",
    )
    att = model.attention
    require(
        _finite(att.dropout) and 0.0 <= att.dropout < 1.0,
        f"model.attention.dropout: must be in [0, 1), got {att.dropout}",
    )
    kind = ATTENTION_KINDS.get(att.kind)
    require(
        kind is not None, f"model.attention.kind: unknown kind {att.kind!r} (allowed: {', '.join(ATTENTION_KINDS)})"
    )
    require(
        not att.causal or kind.has_causal_form,
        f"model.attention.causal: kind {att.kind!r} has no causal form (set causal=false or choose another kind)",
    )
    kind_options(att)
    kind.check(model)


def kind_options(att: DictConfig) -> DictConfig:
    """``attention.options`` checked against the kind's ``Options`` dataclass, with its defaults filled in."""
    from lightning_modules.attention import ATTENTION_KINDS

    kind = ATTENTION_KINDS[att.kind]
    given = OmegaConf.to_container(att.options) if isinstance(att.options, DictConfig) else dict(att.options or {})
    if kind.Options is None:
        require(not given, f"model.attention.options: kind {att.kind!r} takes no options, got {given}")
        return OmegaConf.create({})
    try:
        return merge(kind.Options, [given])
    except ConfigError as err:
        key, _, what = str(err).partition(": ")
        if what.startswith("unknown key"):
            what = f"not an option of kind {att.kind!r}" + what.removeprefix("unknown key").replace(
                "allowed here", "its options"
            )
        raise ConfigError(f"model.attention.options.{key}: {what}") from None
