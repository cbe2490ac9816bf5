"""Self-attention kinds, each one module registered by name (``model.attention.kind``).

* ``full`` (:mod:`.full`): softmax(Q Kᵀ/√d_h) V;
* ``linformer`` (the package :mod:`.linformer`: Eq. 7 and its key-/value-only and causal forms):
  softmax(Q (E K)ᵀ/√d_h) (F V);
* ``sparse``, ``local`` (:mod:`.sparse`, :mod:`.local`, on :mod:`.patterned`): softmax over a fixed pattern of pairs;
* ``lsh`` (:mod:`.lsh`): Reformer's shared-QK attention within hash buckets;
* ``performer`` (:mod:`.performer`): FAVOR+, φ(Q) (φ(K)ᵀ V) with positive random features;
* ``nystrom`` (:mod:`.nystrom`): Nyströmformer, softmax(Q K̃ᵀ) Ã⁺ softmax(Q̃ Kᵀ) V with segment-mean landmarks;
* ``no_context`` (:mod:`.no_context`): W_o (W_v x_i + b_v), each position sees only itself (the control).

A new kind is one module: subclass :class:`SelfAttention`, decorate it with :func:`register_attention`, write
its ``attend`` as its equation, and import the module here (``docs/extending.md``).
"""

from typing import Any, Optional

from omegaconf import DictConfig
from torch import nn

from foundation.errors import require

# The built-in kinds register themselves on import.
from lightning_modules.attention import full, linformer, local, lsh, no_context, nystrom, performer, sparse  # noqa: F401
from lightning_modules.attention.base import (
    ATTENTION_KINDS,
    InputProjections,
    SelfAttention,
    kind_options,
    misplaced_option,
    register_attention,
)
from lightning_modules.config import check_sizes, model_config


def check_model(model: DictConfig) -> None:
    """Every rule of a model config: its sizes, its attention kind and the kind's own rules (ConfigError naming the
    key, the value and what is allowed). The encoder calls it before it builds anything, and the run's config
    check calls the same function."""
    check_sizes(model)
    att = model.attention
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


def attention_class(model: Any) -> type[SelfAttention]:
    """The class that implements ``model.attention`` (its kind, in the form its options select)."""
    return ATTENTION_KINDS[model.attention.kind].select(model)


def build_attention(model: Any, layer: int = 0, shared: Optional[nn.Module] = None) -> SelfAttention:
    """One attention layer of a model config (dict, DictConfig or ModelConfig; checked first), using ``shared``
    as the model-wide module of its kind. When ``shared`` is None the layer builds its own from the config and
    owns it as a child, so ``.to(device)`` and ``.double()`` move E/F with the layer."""
    cfg = model_config(model, misplaced_option)
    check_model(cfg)
    cls = attention_class(cfg)
    if shared is not None:
        return cls(cfg, layer, shared)
    own = cls.build_shared(cfg)
    out = cls(cfg, layer, own)
    if own is not None:  # built here for this layer alone: it is the layer's to move and save
        out.own(own)
    return out


__all__ = [
    "ATTENTION_KINDS",
    "InputProjections",
    "SelfAttention",
    "attention_class",
    "build_attention",
    "check_model",
    "kind_options",
    "misplaced_option",
    "register_attention",
]
