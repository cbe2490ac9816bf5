"""The fused engine checked against the reference engine before it is trusted (``engine: fused``, or ``auto``, which
runs it on every device except the causal form on a CPU).

On its first use per shape in a process (the form, its order and slots, the device, the input's shape without its
batch, padding or none), the fused engine and the reference engine compute the same thing on a small input (the
call's first sequence), without autograd and without autocast (float32 products): when they differ beyond
:data:`RTOL` and :data:`ATOL`, one line says so on stderr and every layer of that shape runs the reference engine
for the rest of the process; when they agree the fused engine runs. Each layer
keeps its answer as an attribute, so a compiled model guards on it instead of calling the check again.
"""

from __future__ import annotations

import sys
from typing import Callable, Hashable, Sequence

import torch
from torch import Tensor

RTOL, ATOL = 1e-3, 1e-4  # float32 products of the same sums in another order agree far closer than this
_CHECKED: dict[Hashable, bool] = {}


@torch.compiler.disable
def agrees(key: Hashable, fused: Callable[[], Sequence[Tensor]], reference: Callable[[], Sequence[Tensor]]) -> bool:
    """Whether the fused engine may run at ``key`` (checked once per key in this process, see the module docstring);
    ``fused`` and ``reference`` compute the same tensors on the small input."""
    if key in _CHECKED:
        return _CHECKED[key]
    device = str(key[1]) if isinstance(key, tuple) and len(key) > 1 else "cpu"
    with torch.no_grad(), torch.autocast(device.split(":")[0], enabled=False):
        got, want = fused(), reference()
    worst = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, want))
    ok = all(torch.allclose(a.float(), b.float(), rtol=RTOL, atol=ATOL) for a, b in zip(got, want))
    if not ok:
        print(
            f"warning: Linformer's fused engine differs from the reference engine at {key[0]} on {device} (largest "
            f"difference {worst:.3g}); this process runs the reference engine for it "
            "(model.attention.options.engine=reference says so in the config)",
            file=sys.stderr,
            flush=True,
        )
    _CHECKED[key] = ok
    return ok
