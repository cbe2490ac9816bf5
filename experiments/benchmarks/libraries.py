"""The race against each kind's public implementation (``bench --levels libraries``; optional extra ``refs``).

One layer x (B, n, d) → (B, n, d) per contender, at matched settings, in one process:

* ``local``, window w = 2⌊k/2⌋ + 1, against local-attention's ``LocalAttention(window_size=⌊k/2⌋,
  look_backward=1, look_forward=1, exact_windowsize=True)``: both see |i − j| ≤ ⌊k/2⌋ (away from the edges,
  where the project's window shifts inside the grid and the library's is cut);
* ``nystrom``, k landmarks, against nystrom-attention's ``NystromAttention(num_landmarks=k, pinv_iterations=6,
  residual=False)`` with the same Q/K/V/O weights (the project's Q/K/V biases zeroed: it has none);
* ``lsh``, buckets of k, one round, against reformer-pytorch's ``LSHAttention(bucket_size=k, n_hashes=1,
  attend_across_buckets=False, allow_duplicate_attention=False)`` (the paper's rule; it draws new rotations
  every call, so its outputs are not compared);
* ``performer``, k features, against performer-pytorch's ``FastAttention(nb_features=k)`` with the project's
  features and its ε set to 0 while it runs (its default ε = 1e-4 blends in uniform attention);
* ``headwise`` (Linformer, one E and one F per layer shared by the heads, ``order: project_first``) against
  lucidrains' ``linformer.LinformerSelfAttention(k=k)``, which also projects keys and values before compressing
  them, with the same weights (the project's Q/K/V biases zeroed: it has none).

Each kind's library and how the pair is matched (the project's attention config, the library's layer built to
match it) are the kind's entry of :data:`experiments.benchmarks.variants.REFERENCES`. The library's attention runs
inside the project's Q/K/V/O projections (so both layers pay the same projections), except nystrom-attention and
linformer, whose layers are their own. Per (n, mode) each pair is timed in interleaved rounds
(``measure.interleaved_seconds``); the ratio is library ÷ project per round, its median reported (> 1: the project
is faster), beside each side's peak memory of one call and the largest output difference on the same input.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from experiments.benchmarks import cases
from experiments.benchmarks.measure import (
    calls_for,
    interleaved_seconds,
    median,
    peak_memory_bytes,
    seconds_per_call,
)
from experiments.benchmarks.variants import REFERENCES, Reference
from lightning_modules.attention import build_attention
from lightning_modules.attention.base import SelfAttention

# bench variant → how it races its kind's reference library
RACED: dict[str, Reference] = {reference.variant: reference for reference in REFERENCES.values()}
# bench variant → the library it races (pip name, import name)
LIBRARIES = {variant: (reference.package, reference.module) for variant, reference in RACED.items()}


# A row's measured columns (None in the row of a pair that failed, whose note says why)
MEASURED = (
    "project_ms",
    "library_ms",
    "ratio",
    "ratio_min",
    "ratio_max",
    "project_mb",
    "library_mb",
    "max_difference",
)


@dataclass
class Pair:
    """One race: the project's layer and the library's, both x (B, n, d) → (B, n, d)."""

    variant: str
    library: str
    ours: nn.Module
    theirs: Callable[[Tensor], Tensor]
    compare: bool  # whether the two compute the same function (then their outputs are compared)
    modules: tuple[nn.Module, ...]  # everything holding the pair's parameters


def available(variant: str) -> bool:
    try:
        importlib.import_module(LIBRARIES[variant][1])
    except ImportError:
        return False
    return True


def _layer(attention: dict, n: int, shape: cases.Shape) -> SelfAttention:
    cfg = {"max_len": n, "d_model": shape.d_model, "n_heads": shape.n_heads, "attention": attention}
    return build_attention(cfg)


def build(variant: str, n: int, k: int, shape: cases.Shape) -> Pair:
    """The project's layer of the variant's kind and the library's layer matched to it."""
    reference = RACED[variant]
    ours = _layer(reference.attention(n, k), n, shape)
    theirs, compare, modules = reference.layer(ours, importlib.import_module(reference.module), n, k)
    return Pair(variant, reference.package, ours, theirs, compare, (ours, *modules))


@contextlib.contextmanager
def performer_without_eps() -> Iterator[None]:
    """performer-pytorch's kernel with ε = 0 (its default 1e-4 changes outputs by ~0.2 relative)."""
    try:
        module = importlib.import_module("performer_pytorch.performer_pytorch")
    except ImportError:
        yield
        return
    kernel = module.softmax_kernel
    module.softmax_kernel = functools.partial(kernel, eps=0.0)
    try:
        yield
    finally:
        module.softmax_kernel = kernel


def _runner(fn: Callable[[Tensor], Tensor], x: Tensor, params: list[Tensor], train: bool) -> Callable[[], Any]:
    def run() -> Any:
        if not train:
            with torch.inference_mode():
                return fn(x)
        for p in (*params, x):
            p.grad = None
        fn(x).sum().backward()

    return run


def race(
    variants: list[str], n: int, k: int, mode: str, shape: cases.Shape, repeats: int, min_time: float
) -> list[dict]:
    """One row per variant at (n, mode): each side's median time and peak memory, and the paired ratio; a pair that
    fails (a library that cannot run at the bench's dtype, such as nystrom-attention's pseudo-inverse in bfloat16,
    or out of memory) is a row with the failure as its ``note``, and the race goes on."""
    rows = []
    with performer_without_eps():
        for variant in variants:
            row = {"variant": variant, "library": RACED[variant].package, "n": n, "k": k, "mode": mode}
            try:
                rows.append({**row, **_race_pair(variant, n, k, mode == "fwdbwd", shape, repeats, min_time)})
            except Exception as err:  # noqa: BLE001  (whatever a library raises: noted, as the bench notes its cases)
                message = str(err).splitlines()[0] if str(err) else ""
                rows.append({**row, **dict.fromkeys(MEASURED), "note": f"failed: {type(err).__name__}: {message}"})
                if shape.device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def _race_pair(
    variant: str, n: int, k: int, train: bool, shape: cases.Shape, repeats: int, min_time: float
) -> dict[str, Any]:
    """The timings, memory and output difference of one pair (:func:`race`'s row without its identity)."""
    torch.manual_seed(0)
    pair = build(variant, n, k, shape)
    for module in pair.modules:
        module.to(device=shape.device, dtype=shape.dtype).train(False)
    x = torch.randn(shape.batch, n, shape.d_model, device=shape.device, dtype=shape.dtype)
    difference = float("nan")
    if pair.compare:
        with torch.inference_mode():
            difference = float((pair.ours(x) - pair.theirs(x)).abs().max())
    x.requires_grad_(train)
    params = [p for module in pair.modules for p in module.parameters()]
    fns = {side: _runner(fn, x, params, train) for side, fn in (("project", pair.ours), ("library", pair.theirs))}
    calls = {side: calls_for(seconds_per_call(fn, shape.device), min_time) for side, fn in fns.items()}
    memory = {side: peak_memory_bytes(fn, shape.device) for side, fn in fns.items()}
    seconds = interleaved_seconds(fns, calls, repeats, shape.device)
    ratios = [lib / mine for lib, mine in zip(seconds["library"], seconds["project"])]
    return {
        "project_ms": 1e3 * median(seconds["project"]),
        "library_ms": 1e3 * median(seconds["library"]),
        "ratio": median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "project_mb": memory["project"] / 2**20,
        "library_mb": memory["library"] / 2**20,
        "max_difference": difference,
        "note": None,
    }


def markdown(rows: list[dict], header: list[str]) -> str:
    lines = [
        "# The project against the reference libraries",
        "",
        *header,
        "",
        "Ratio: library time ÷ project time, median of paired rounds (> 1: the project is faster), min–max in "
        "brackets; memory: peak MB of one call; difference: largest |project − library| output on the same input "
        "(– where the library draws its own randomness or its window differs at the edges).",
        "",
        "| kind | library | n | mode | project ms | library ms | ratio | project MB | library MB | difference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("note"):
            lines.append(
                f"| {r['variant']} | {r['library']} | {r['n']:,} | {r['mode']} | – | – | {r['note']} | – | – | – |"
            )
            continue
        diff = "–" if r["max_difference"] != r["max_difference"] else f"{r['max_difference']:.1e}"
        lines.append(
            f"| {r['variant']} | {r['library']} | {r['n']:,} | {r['mode']} | {r['project_ms']:.1f} | "
            f"{r['library_ms']:.1f} | {r['ratio']:.2f}× ({r['ratio_min']:.2f}–{r['ratio_max']:.2f}) | "
            f"{r['project_mb']:.0f} | {r['library_mb']:.0f} | {diff} |"
        )
    return "\n".join(lines) + "\n"
