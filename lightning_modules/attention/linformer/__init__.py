"""Linformer (``kind: linformer``) in its three forms, one module each:

* :mod:`.bidirectional`: Eq. 7, softmax(Q (E K)ᵀ/√d_h) (F V), and what every form shares (rules, bank, hooks);
* :mod:`.one_sided`: ``compress: keys | values``, one side through the bottleneck, lifted back by P = E⁺E;
* :mod:`.causal`: ``causal: true``, causal by construction (blockwise).

Its settings (:mod:`.options`) live in ``model.attention.options``. The registered kind selects the form its
options ask for; the forms never import this package.
"""

from __future__ import annotations

from omegaconf import DictConfig

from lightning_modules.attention.base import SelfAttention, kind_options, register_attention
from lightning_modules.attention.linformer.bidirectional import Linformer, compress_first_is_cheaper
from lightning_modules.attention.linformer.causal import CausalLinformer
from lightning_modules.attention.linformer.one_sided import OneSidedLinformer
from lightning_modules.attention.linformer.options import KScheduleConfig, LinformerOptions, layer_ks


@register_attention(Linformer.kind)
class LinformerKind(Linformer):
    """The kind as registered: its rules and hooks are :class:`Linformer`'s; :meth:`select` names the form."""

    @classmethod
    def select(cls, model: DictConfig) -> type[SelfAttention]:
        causal, compress = model.attention.causal, kind_options(model.attention).compress
        return CausalLinformer if causal else OneSidedLinformer if compress != "both" else Linformer


__all__ = [
    "CausalLinformer",
    "KScheduleConfig",
    "Linformer",
    "LinformerKind",
    "LinformerOptions",
    "OneSidedLinformer",
    "compress_first_is_cheaper",
    "layer_ks",
]
