"""Floating-point operation counts of any module call, read off the operators it actually runs.

:func:`count_flops` runs a callable under ``torch.utils.flop_counter.FlopCounterMode``, which
counts every matrix product (``mm``, ``bmm``, ``addmm``, ``baddbmm``, fused attention) as
2·m·n·k flops (one multiply and one add), so a variant added later is counted without a formula
written for it. Element-wise work (softmax, GELU, LayerNorm, bias adds) is not counted: achieved
FLOP/s is then "useful matrix FLOP/s", comparable with a GEMM peak.

Torch registers no formula for the CPU flash-attention kernels that ``scaled_dot_product_attention``
picks on CPU, so they are registered here (importing this module is enough):

* forward  4·B·h·T_q·T_k·d_h (Q Kᵀ and P V),
* backward 10·B·h·T_q·T_k·d_h (recomputed Q Kᵀ, dP = dO Vᵀ, dV = Pᵀ dO, dQ = dS K, dK = dSᵀ Q),

each halved under ``is_causal`` because that kernel skips the blocks above the diagonal.

Torch's own formulas for the CUDA kernels (flash, memory-efficient, cuDNN; forward and backward) ignore
``is_causal`` (torch says so in its source); these kernels skip the upper blocks too, so each of them is
wrapped here to halve its count under ``is_causal`` alike (a later torch whose formula already depends on
``is_causal`` is left as it is).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

_aten = torch.ops.aten


def _cpu_flash_forward(query_shape, key_shape, value_shape, dropout_p=0.0, is_causal=False, *args: Any,
                       out_shape=None, **kwargs: Any) -> int:
    flops = sdpa_flop_count(query_shape, key_shape, value_shape)
    return flops // 2 if is_causal else flops


def _cpu_flash_backward(grad_out_shape, query_shape, key_shape, value_shape, out_shape_=None, lse_shape=None,
                        dropout_p=0.0, is_causal=False, *args: Any, out_shape=None, **kwargs: Any) -> int:
    flops = sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)
    return flops // 2 if is_causal else flops


for _op, _formula in ((_aten._scaled_dot_product_flash_attention_for_cpu, _cpu_flash_forward),
                      (_aten._scaled_dot_product_flash_attention_for_cpu_backward, _cpu_flash_backward)):
    if _op not in flop_counter.flop_registry:  # a later torch may ship its own: keep that one
        flop_counter.register_flop_formula(_op)(_formula)


def _halved_when_causal(op: Any, counted: Callable[..., int]) -> Callable[..., int]:
    """``counted`` (a registered formula: tensors in, flops out), halved when the call's ``is_causal`` is true."""
    where = [a.name for a in op.default._schema.arguments].index("is_causal")

    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        flops = counted(*args, out_val=out_val, **kwargs)
        causal = kwargs["is_causal"] if "is_causal" in kwargs else len(args) > where and args[where]
        return flops // 2 if causal else flops

    formula.halves_causal = True
    return formula


def _ignores_causal(counted: Callable[..., int], tensors: int) -> bool:
    """Whether a formula gives the same count with and without ``is_causal`` (probed on meta tensors)."""
    t = torch.empty(1, 1, 8, 8, device="meta")
    try:
        return counted(*[t] * tensors, is_causal=True) == counted(*[t] * tensors, is_causal=False)
    except Exception:  # noqa: BLE001  (a formula with another signature: leave it alone)
        return False


# op → tensors its formula reads first (the query/key/value shapes, after grad_out for a backward)
for _op, _tensors in ((_aten._scaled_dot_product_flash_attention, 3),
                      (_aten._scaled_dot_product_efficient_attention, 3),
                      (_aten._scaled_dot_product_cudnn_attention, 3),
                      (_aten._scaled_dot_product_flash_attention_backward, 4),
                      (_aten._scaled_dot_product_efficient_attention_backward, 4),
                      (_aten._scaled_dot_product_cudnn_attention_backward, 4)):
    _counted = flop_counter.flop_registry.get(_op)
    if _counted is not None and not getattr(_counted, "halves_causal", False) and _ignores_causal(_counted, _tensors):
        flop_counter.flop_registry[_op] = _halved_when_causal(_op, _counted)


def count_flops(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run ``fn()`` once and return (flops of its matrix products, its result)."""
    with FlopCounterMode(display=False) as counter:
        result = fn()
    return counter.get_total_flops(), result
