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

Attention restricted to a pattern (``local``, ``sparse``) runs FlexAttention, whose eager form cannot run under
``FlopCounterMode`` at all, or a dense masked SDPA that computes every pair: either way the counter would see
the dense T² work (or nothing). Such a kind wraps its core in :func:`counted` with the work its pattern
needs: then, under :func:`count_flops` only, what the counter sees inside the core (forward and backward) is
replaced by the declared counts. Outside :func:`count_flops` :func:`counted` just calls the core.

:func:`training_step_flops` counts one training step of a module: the forward pass of its training loss and
the backward pass to every trainable parameter. For a Transformer of N non-embedding parameters on B·T
tokens this is ≈ 6·N·B·T (2 per weight and token forward, 4 backward) plus the attention products.

:func:`device_peak` names the peak a run's model FLOP/s are divided by (its MFU, model FLOPs utilisation): the dense
16-bit tensor-core peak of a known GPU at a 16-bit precision, from the vendor's datasheet. Nothing else gets a peak:
an unknown device, a CPU or a 32-bit run gets the reason instead, never a guessed number.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Callable, ContextManager, Optional, Union

import torch
from torch import Tensor, nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

_aten = torch.ops.aten


def _cpu_flash_forward(
    query_shape, key_shape, value_shape, dropout_p=0.0, is_causal=False, *args: Any, out_shape=None, **kwargs: Any
) -> int:
    flops = sdpa_flop_count(query_shape, key_shape, value_shape)
    return flops // 2 if is_causal else flops


def _cpu_flash_backward(
    grad_out_shape,
    query_shape,
    key_shape,
    value_shape,
    out_shape_=None,
    lse_shape=None,
    dropout_p=0.0,
    is_causal=False,
    *args: Any,
    out_shape=None,
    **kwargs: Any,
) -> int:
    flops = sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)
    return flops // 2 if is_causal else flops


for _op, _formula in (
    (_aten._scaled_dot_product_flash_attention_for_cpu, _cpu_flash_forward),
    (_aten._scaled_dot_product_flash_attention_for_cpu_backward, _cpu_flash_backward),
):
    if _op not in flop_counter.flop_registry:  # a later torch may ship its own: keep that one
        flop_counter.register_flop_formula(_op)(_formula)


def _halved_when_causal(op: Any, registered: Callable[..., int]) -> Callable[..., int]:
    """``registered`` (a formula: tensors in, flops out), halved when the call's ``is_causal`` is true."""
    where = [a.name for a in op.default._schema.arguments].index("is_causal")

    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        flops = registered(*args, out_val=out_val, **kwargs)
        causal = kwargs["is_causal"] if "is_causal" in kwargs else len(args) > where and args[where]
        return flops // 2 if causal else flops

    formula.halves_causal = True
    return formula


def _ignores_causal(registered: Callable[..., int], tensors: int) -> bool:
    """Whether a formula gives the same count with and without ``is_causal`` (probed on meta tensors)."""
    t = torch.empty(1, 1, 8, 8, device="meta")
    try:
        return registered(*[t] * tensors, is_causal=True) == registered(*[t] * tensors, is_causal=False)
    except Exception:  # noqa: BLE001  (a formula with another signature: leave it alone)
        return False


# op → tensors its formula reads first (the query/key/value shapes, after grad_out for a backward)
for _op, _tensors in (
    (_aten._scaled_dot_product_flash_attention, 3),
    (_aten._scaled_dot_product_efficient_attention, 3),
    (_aten._scaled_dot_product_cudnn_attention, 3),
    (_aten._scaled_dot_product_flash_attention_backward, 4),
    (_aten._scaled_dot_product_efficient_attention_backward, 4),
    (_aten._scaled_dot_product_cudnn_attention_backward, 4),
):
    _registered = flop_counter.flop_registry.get(_op)
    if (
        _registered is not None
        and not getattr(_registered, "halves_causal", False)
        and _ignores_causal(_registered, _tensors)
    ):
        flop_counter.flop_registry[_op] = _halved_when_causal(_op, _registered)


# The counters of the active count_flops calls, each with its correction (declared − seen) in a one-item list.
_ACTIVE: list[tuple[FlopCounterMode, list[int]]] = []


def count_flops(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run ``fn()`` once and return (flops of its matrix products, its result). A ``torch.compile``'d module inside
    ``fn`` runs eagerly here: the count is the model's, whatever kernels a compiler would fuse it into (and nothing
    is compiled under the counter)."""
    correction = [0]
    with torch.compiler.set_stance("force_eager"), FlopCounterMode(display=False) as counter:
        _ACTIVE.append((counter, correction))
        try:
            result = fn()
        finally:
            _ACTIVE.pop()
    return counter.get_total_flops() + correction[0], result


def counting() -> bool:
    """True inside :func:`count_flops` (a kind then runs an engine the counter can observe)."""
    return bool(_ACTIVE)


def counted(core: Callable[..., Tensor], inputs: tuple[Tensor, ...], forward: int, backward: int) -> Tensor:
    """``core(*inputs)``, counted as ``forward`` flops (and ``backward`` once its gradient is taken) under
    :func:`count_flops`, whatever the counter sees inside it."""
    if not _ACTIVE:
        return core(*inputs)
    counter, correction = _ACTIVE[-1]
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in inputs)):
        before = counter.get_total_flops()
        out = core(*inputs)
        correction[0] += forward - (counter.get_total_flops() - before)
        return out
    return _Counted.apply(core, counter, correction, forward, backward, *inputs)


class _Counted(torch.autograd.Function):
    """The core's own autograd graph, built once in forward and differentiated in backward (no recomputation),
    so both passes of the core can be measured and replaced."""

    @staticmethod
    def forward(ctx, core, counter, correction, forward, backward, *inputs):  # type: ignore[override]
        before = counter.get_total_flops()
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
            out = core(*leaves)
        correction[0] += forward - (counter.get_total_flops() - before)
        ctx.graph = (leaves, out, counter, correction, backward)
        return out.detach()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        leaves, out, counter, correction, backward = ctx.graph
        before = counter.get_total_flops()
        wanted = [t for t in leaves if t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
        correction[0] += backward - (counter.get_total_flops() - before)
        del ctx.graph
        return (None, None, None, None, None, *(next(grads) if t.requires_grad else None for t in leaves))


def training_step_flops(
    module: nn.Module, loss_fn: Callable[[], torch.Tensor], context: Optional[Callable[[], ContextManager]] = None
) -> int:
    """Matrix FLOPs of one training step: ``loss_fn()`` (the forward pass of the loss) and its gradients with
    respect to ``module``'s trainable parameters (the backward pass), under ``context()`` when given (e.g. the
    trainer's autocast).

    Leaves no trace: the gradients are returned by ``torch.autograd.grad`` and dropped (no ``.grad`` is
    touched, so no DDP hook fires and no accumulation is disturbed), and the RNG states are restored, so
    dropout and MLM masks draw afterwards exactly what they would have drawn without this count.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    scope = context or contextlib.nullcontext

    def step() -> None:
        with scope():
            loss = loss_fn()
        torch.autograd.grad(loss, params, allow_unused=True)

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        flops, _ = count_flops(step)
    return flops


# Dense bf16/fp16 tensor-core peaks (FP32 accumulate), FLOP/s, by the tokens of torch.cuda.get_device_name (the first
# entry whose tokens the name holds: the more specific first). NVIDIA's datasheets give these figures "with
# sparsity" (2:4 structured sparsity doubles them): the dense peak is half the datasheet's number. A known variant
# whose figure is not written here has None: its name does not fall through to a sibling's peak.
PEAKS: tuple[tuple[tuple[str, ...], Optional[float], str], ...] = (
    (("H200", "NVL"), None, ""),
    (("H200",), 989e12, "NVIDIA H200 datasheet, SXM: 1,979 TFLOPS with sparsity"),
    (("H100", "NVL"), None, ""),
    (("H100", "PCIe"), 756e12, "NVIDIA H100 datasheet, PCIe: 1,513 TFLOPS with sparsity"),
    (("H100",), 989e12, "NVIDIA H100 datasheet, SXM: 1,979 TFLOPS with sparsity"),
    (("A100",), 312e12, "NVIDIA A100 datasheet: 624 TFLOPS with sparsity"),
    (("L40S",), 362e12, "NVIDIA L40S datasheet: 733 TFLOPS with sparsity"),
    (("L4",), 121e12, "NVIDIA L4 datasheet: 242 TFLOPS with sparsity"),
    (("A10",), 125e12, "NVIDIA A10 datasheet: 250 TFLOPS with sparsity"),
)
SIXTEEN_BIT = {"bf16": "bf16", "16": "fp16"}  # a Lightning precision's prefix → the 16-bit format it multiplies in


def device_peak(device_name: str, precision: str) -> Union[tuple[float, str], str]:
    """(peak FLOP/s, its name) of a GPU called ``device_name`` (``torch.cuda.get_device_name``; "cpu" for the CPU)
    training at Lightning's ``precision`` (``bf16-mixed``, ``16-mixed``, ``32-true`` ...), e.g. ``(989e12, "NVIDIA
    H200 dense bf16 989 TFLOP/s (NVIDIA H200 datasheet, SXM: 1,979 TFLOPS with sparsity)")``; or, where there is
    none, the reason, one phrase."""
    if device_name == "cpu":
        return "no peak for a CPU (linformer-lab bench measures its GEMM peak)"
    fmt = next((f for prefix, f in SIXTEEN_BIT.items() if str(precision).split("-")[0] == prefix), None)
    if fmt is None:
        return f"precision {precision}: the peak table holds 16-bit tensor-core peaks only"
    tokens = set(re.split(r"[\s\-]+", device_name))
    for needed, peak, source in PEAKS:
        if set(needed) <= tokens:
            if peak is None:
                break
            return peak, f"{device_name} dense {fmt} {peak / 1e12:.0f} TFLOP/s ({source})"
    return f"{device_name} is not in the peak table (lightning_modules/flops.py PEAKS)"
