"""The model's configuration schema and the rules of its sizes.

:class:`ModelConfig` (with :class:`AttentionConfig`) is the ``model`` node of a run's config: the sizes, and the
attention's ``kind``, ``causal``, ``dropout`` and the kind's own ``options``. The schema knows no kind: the
attention kinds (``lightning_modules/attention/``) register themselves and state their rules, and
:func:`lightning_modules.attention.check_model` checks a whole model (the sizes here, then the kind's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

from omegaconf import DictConfig

from foundation.configfile import Misplaced, merge
from foundation.errors import check_number, require

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
    # attention sooner from about 1/sqrt(d_model)). Linformer's E/F keep their own initialisation
    # (attention.options.init).
    init_std: float = 0.02
    attention: AttentionConfig = field(default_factory=AttentionConfig)


@dataclass
class OptimConfig:
    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: List[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    warmup_steps: int = 100
    # Decay after warm-up: linear to 0 at max_steps, cosine to 0, constant, or wsd (warmup–stable–decay: constant,
    # then a cooldown to 0 over the last cooldown_fraction of max_steps, shaped linear, cosine or 1-sqrt).
    schedule: Literal["linear", "cosine", "constant", "wsd"] = "linear"
    cooldown_fraction: float = 0.2
    cooldown_shape: Literal["linear", "cosine", "1-sqrt"] = "linear"
    gradient_clip_val: float = 1.0
    # The learning rate of Linformer's E/F (each attention kind's no_decay_parameters) as a multiple of lr. At n = 512
    # dense E/F started as window means keep and refine them at 0.1 and lose them at 1.0 (docs/results.md).
    projection_lr_scale: float = 1.0
    # A length curriculum, the same for every kind (BERT trained 90 % of its steps at 128 tokens, then 512): the first
    # short_steps training steps are split evenly over short_lengths, in order, and a step at length m cuts each block
    # of model.max_len tokens into max_len / m blocks of m tokens (the same tokens a step, each short block attended on
    # its own); every later step, and every validation, is at model.max_len. short_steps 0: off. Packed-block tasks
    # only (mlm, clm); each length must divide model.max_len.
    short_steps: int = 0
    short_lengths: List[int] = field(default_factory=list)


def model_config(cfg: Any, misplaced: Optional[Misplaced] = None) -> DictConfig:
    """A validated, attribute-accessible ModelConfig from a dict, DictConfig or dataclass (``misplaced``: what an
    unknown key should have been, :func:`lightning_modules.attention.misplaced_option`)."""
    return merge(ModelConfig, [cfg], misplaced)


def finite(value: Any) -> bool:
    """A real number that is neither infinite nor NaN (bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_sizes(model: DictConfig) -> None:
    """The rules of the model's sizes and dropouts (ConfigError naming the key, the value and what is allowed)."""
    for key in ("max_len", "d_model", "n_heads", "n_layers", "d_ff"):
        check_number(f"model.{key}", model[key], 1, MAX_SIZE[key], integer=True)
    require(
        model.d_model % model.n_heads == 0,
        f"model.d_model: {model.d_model} is not divisible by model.n_heads={model.n_heads}",
    )
    require(
        finite(model.dropout) and 0.0 <= model.dropout < 1.0, f"model.dropout: must be in [0, 1), got {model.dropout}"
    )
    require(
        finite(model.init_std) and 0.0 < model.init_std <= 10.0,
        f"model.init_std: must be in (0, 10], got {model.init_std}",
    )
    require(
        finite(model.position_scale) and 0.0 < model.position_scale <= 100.0,
        f"model.position_scale: must be in (0, 100], got {model.position_scale}",
    )
    dropout = model.attention.dropout
    require(finite(dropout) and 0.0 <= dropout < 1.0, f"model.attention.dropout: must be in [0, 1), got {dropout}")
