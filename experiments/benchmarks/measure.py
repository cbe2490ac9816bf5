"""How the bench measures: paired interleaved timing, peak memory of one call, the GEMM peak.

Timing. Every case of a group (same level, mode and n) is warmed up, then the group is timed in
``repeats`` rounds; in each round every case runs once, in an order rotated by one per round, so a
burst of load from other processes hits all cases of that round alike. A sample is the mean over
``calls`` back-to-back calls, ``calls`` chosen so that a sample lasts at least ``min_time`` seconds.
Ratios between cases are taken per round (paired) and their median is reported.

Peak memory of one call: the most bytes held at any moment during the call beyond what was held
when it started (activations, temporaries, gradients; not the weights and inputs that exist already).

* CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats``, minus ``memory_allocated`` before.
* CPU: the profiler (``profile_memory=True``) records every allocation (+bytes) and free (-bytes) that
  torch's allocator makes; summed in time order they give the bytes held at each instant, whose
  maximum is the peak. ``ru_maxrss`` cannot be reset between cases and also counts the Python heap,
  freed-but-cached pages and every earlier case, so it cannot attribute a peak to one call.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Sequence

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """Peak bytes allocated during ``fn()`` above those allocated when it started."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    # Kineto logs two "USDT" lines per profiler start/stop at level 5; 6 keeps a bench run readable.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [
        e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    ]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def seconds_per_call(fn: Callable[[], Any], device: torch.device, calls: int = 1) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / calls


def calls_for(seconds_one_call: float, min_time: float) -> int:
    """Back-to-back calls per sample so that a sample lasts at least ``min_time`` seconds."""
    return max(1, math.ceil(min_time / max(seconds_one_call, 1e-9)))


def interleaved_seconds(
    fns: dict[str, Callable[[], Any]], calls: dict[str, int], repeats: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds per call of every case in each of ``repeats`` rounds (round r starts at case r)."""
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(seconds_per_call(fns[name], device, calls[name]))
    return samples


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def gemm_peak(
    shapes: Sequence[tuple[int, int, int]], dtype: torch.dtype, device: torch.device, min_time: float, repeats: int = 3
) -> tuple[float, dict[tuple[int, int, int], float]]:
    """Best FLOP/s of ``(m×k) @ (k×n)`` products over ``shapes`` (each its best of ``repeats``).

    Returns (peak FLOP/s, FLOP/s per shape); a product costs 2·m·k·n flops.
    """
    per_shape: dict[tuple[int, int, int], float] = {}
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        fn = lambda a=a, b=b: torch.mm(a, b)  # noqa: E731
        calls = calls_for(seconds_per_call(fn, device), min_time)
        best = min(seconds_per_call(fn, device, calls) for _ in range(repeats))
        per_shape[(m, k, n)] = 2 * m * k * n / best
    return max(per_shape.values()), per_shape
