"""``linformer-lab bench``: speed and memory of every attention variant against two baselines.

Writes ``<out>/<timestamp>/``: ``results.csv`` (one row per case), ``table.md`` (multipliers laid out
like the paper's Table 3), ``scaling.png`` (Figure 2 with fitted slopes) and TensorBoard events.

Per level (``layer``: one self-attention; ``model``: the whole encoder), mode (``fwd`` in inference
mode, ``fwdbwd``) and n, all cases (the baselines ``naive`` and ``sdpa``, then every variant × k ×
evaluation order) are built, run once under a FLOP counter (warm-up), once under the memory probe, once more to
size a sample, then timed in interleaved rounds (``experiments.benchmarks.measure``). All cases of a group
are alive together while it is timed, so a case fits when its peak, beside the bytes every case of the group
keeps between calls (weights, inputs, gradients), stays within the limit. A case whose memory, extrapolated
from the same case at the previous n as if it grew like n² (or computed for the naive baseline), would not fit
beside the cases probed before it is skipped with a note, as is any case that fails; after probing, the
largest peaks are dropped (with a note) until the group fits together; out of memory while timing drops the
largest peak and times the rest again.
``decode`` steps causal Linformer and causal full attention token by token; ``loop`` compares
Lightning's loop with a bare PyTorch loop.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import yaml

from experiments.benchmarks import cases, report
from experiments.benchmarks.measure import (
    calls_for,
    gemm_peak,
    interleaved_seconds,
    median,
    peak_memory_bytes,
    seconds_per_call,
)
from foundation.atomic import atomic_write_text, write_figure
from foundation.errors import ConfigError, check_number
from foundation.paths import check_folder, check_path
from lightning_modules.flops import count_flops

LEVELS = ("layer", "model", "decode", "loop", "libraries", "parity")
DEFAULT_LEVELS = ("layer", "model", "decode", "loop")
MODES = ("fwd", "fwdbwd")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return sorted(set(values))


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _settings(text: str) -> dict:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise argparse.ArgumentTypeError(f"expected a YAML mapping of kind to keywords, got {text!r}")
    return value


def _seeds(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return list(dict.fromkeys(values))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_case_arguments(parser)
    _add_shape_arguments(parser)
    _add_timing_arguments(parser)
    _add_parity_arguments(parser)
    parser.add_argument("--out", default="bench", help="parent folder of the timestamped result folder")


def _add_case_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cases")
    group.add_argument(
        "--n", type=_ints, default=[512, 1024, 2048, 4096, 8192, 16384], help="sequence lengths (default 512,...,16384)"
    )
    group.add_argument("--k", type=_ints, default=[128, 256], help="projected lengths (default 128,256)")
    group.add_argument(
        "--variants",
        type=_names,
        default=list(cases.VARIANTS),
        help=f"attention variants, from {','.join(cases.VARIANTS)} (default all); "
        "the baselines naive and sdpa always run",
    )
    group.add_argument(
        "--orders",
        type=_names,
        default=["auto"],
        help="exact evaluation orders of E K: auto,compress_first,project_first (default auto = the cheaper)",
    )
    group.add_argument(
        "--engines",
        type=_names,
        default=["auto"],
        help="options.engine of the variants whose kind has one, e.g. auto,reference for Linformer's fused engine "
        "(auto on CUDA) beside the reference in the same rounds (default auto)",
    )
    group.add_argument("--mode", type=_names, default=list(MODES), help="fwd,fwdbwd (default both)")
    group.add_argument(
        "--levels",
        type=_names,
        default=list(DEFAULT_LEVELS),
        help="layer,model,decode,loop,libraries,parity (default all but libraries, the race against each kind's "
        "library, and parity, training beside it; both need the extra refs)",
    )


def _add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("shape and device")

    def sizes(key: str) -> str:
        return f"default {SHAPE_DEFAULTS['cpu'][key]} on a CPU, {SHAPE_DEFAULTS['cuda'][key]} on a GPU"

    group.add_argument("--device", default="auto", help="cpu|cuda|auto")
    group.add_argument("--batch", type=int, default=None, help=sizes("batch"))
    group.add_argument(
        "--dtype",
        default="auto",
        help="float32|bfloat16|float16 (auto: float32 on CPU; bfloat16 on a GPU of compute "
        "capability >= 8.0, float16 on older ones)",
    )
    group.add_argument("--d-model", type=int, default=None, help=sizes("d_model"))
    group.add_argument("--heads", type=int, default=None, help=sizes("heads"))
    group.add_argument("--d-ff", type=int, default=None, help=sizes("d_ff"))
    group.add_argument("--layers", type=int, default=2, help="encoder layers of model, decode and loop cases")
    group.add_argument("--vocab", type=int, default=1000)


def _add_timing_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("timing")
    group.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds")
    group.add_argument("--min-time", type=float, default=0.05, help="seconds per timing sample (more calls if faster)")
    group.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    group.add_argument(
        "--profile",
        action="store_true",
        help="after timing each group, profile each of its cases (torch.profiler, one sample's calls) and write its "
        "operators by self time to profiles/<level>_<mode>_n<n>_<case>.txt",
    )
    group.add_argument(
        "--memory-limit-mb",
        type=float,
        default=0.0,
        help="skip cases expected to need more (0: half the available RAM, 90%% of free GPU memory)",
    )
    group = parser.add_argument_group("decode and loop levels")
    group.add_argument("--decode-positions", type=_ints, default=None, help="default: the --n values")
    group.add_argument("--decode-window", type=int, default=128, help="steps per decode timing")
    group.add_argument("--loop-batch", type=int, default=8)
    group.add_argument("--loop-steps", type=int, default=12)
    group.add_argument("--loop-rounds", type=int, default=3)


def _add_parity_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("parity level")
    group.add_argument(
        "--kinds",
        type=_names,
        default=None,
        help="parity: the kinds trained beside their reference library (default every kind that has one)",
    )
    group.add_argument("--seeds", type=_seeds, default=[0, 1, 2], help="parity: seeds per side (default 0,1,2)")
    group.add_argument("--steps", type=int, default=None, help="parity: training steps (default the config's)")
    group.add_argument(
        "--settings",
        type=_settings,
        default={},
        help="parity: per kind, library constructor keywords overriding its defaults (an ablation), as YAML, "
        "e.g. '{nystrom: {residual: false}}'",
    )
    group.add_argument(
        "--parity-runs",
        default=None,
        help="parity: the folder of its runs (default <out>/<timestamp>/parity_runs); finished runs found there are "
        "read back, interrupted ones continued",
    )
    group.add_argument(
        "--parity-config",
        default=None,
        help="parity: the run config both sides train with (default experiments/configs/bytes_mlm.yaml)",
    )


# The sizes a run takes unless given: on a CPU what its cores time in minutes; on a GPU the paper's batch and width
# (on an H200 a batch of 1 at d = 256 times kernel launches, not attention, below n = 8,192: ../docs/gpu.md).
SHAPE_DEFAULTS = {
    "cpu": {"batch": 1, "d_model": 256, "heads": 4, "d_ff": 1024},
    "cuda": {"batch": 16, "d_model": 512, "heads": 8, "d_ff": 2048},
}


def _fill_shape(args: argparse.Namespace) -> None:
    """The sizes not given take their device's defaults (:data:`SHAPE_DEFAULTS`); ``args.shape_note`` says which
    when a GPU's were taken (None otherwise)."""
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    filled = [key for key, value in SHAPE_DEFAULTS[device].items() if getattr(args, key) is None]
    for key in filled:
        setattr(args, key, SHAPE_DEFAULTS[device][key])
    args.shape_note = None
    if device == "cuda" and filled:
        taken = ", ".join(f"{key.replace('_', ' ')} {SHAPE_DEFAULTS[device][key]}" for key in filled)
        args.shape_note = (
            f"GPU defaults, the paper's batch and width: {taken} (--batch, --d-model, --heads, --d-ff to change)"
        )


MAX_LENGTH = 1 << 20  # sequence lengths and k the bench accepts


def _check(args: argparse.Namespace) -> None:
    for key, values, allowed in (
        ("--variants", args.variants, cases.VARIANTS),
        ("--orders", args.orders, cases.ORDERS),
        ("--mode", args.mode, MODES),
        ("--levels", args.levels, LEVELS),
    ):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ConfigError(f"{key}: {','.join(bad) or 'empty'} not allowed (choose from {','.join(allowed)})")
    if args.dtype != "auto" and args.dtype not in DTYPES:
        raise ConfigError(f"--dtype: {args.dtype!r} not allowed (choose from auto,{','.join(DTYPES)})")
    if args.device not in ("auto", "cpu", "cuda") or (args.device == "cuda" and not torch.cuda.is_available()):
        raise ConfigError(
            f"--device: {args.device!r} not available (choose from auto,cpu"
            f"{',cuda' if torch.cuda.is_available() else ''})"
        )
    _check_engines(args)
    _fill_shape(args)
    for key in (
        "batch",
        "d_model",
        "heads",
        "layers",
        "d_ff",
        "vocab",
        "repeats",
        "decode_window",
        "loop_batch",
        "loop_steps",
        "loop_rounds",
    ):
        if getattr(args, key) < 1:
            raise ConfigError(f"--{key.replace('_', '-')}: must be >= 1, got {getattr(args, key)}")
    if args.d_model % args.heads:
        raise ConfigError(f"--d-model: {args.d_model} is not divisible by --heads={args.heads}")
    if args.loop_steps < 2:
        raise ConfigError(f"--loop-steps: must be >= 2, got {args.loop_steps}")
    for n in [*args.n, *(args.decode_positions or [])]:
        check_number("--n" if n in args.n else "--decode-positions", n, 1, MAX_LENGTH, integer=True)
    for k in args.k:
        check_number("--k", k, 1, MAX_LENGTH, integer=True)
    check_number("--threads", args.threads, 0, 4 * (os.cpu_count() or 1), integer=True)
    check_number("--min-time", args.min_time, 0, 60, low_open=True)
    check_number("--memory-limit-mb", args.memory_limit_mb, 0, 2**40)
    _check_fits(args)
    if "parity" in args.levels:
        _check_parity(args)
    check_folder("--out", args.out)


def _check_engines(args: argparse.Namespace) -> None:
    """Every engine asked for is one of a chosen variant's kind (a variant runs those of its own kind)."""
    engines = sorted({e for v in args.variants for e in cases.engines_of(v)})
    bad = [e for e in args.engines if e not in engines]
    if bad or not args.engines:
        raise ConfigError(
            f"--engines: {','.join(bad) or 'empty'} not allowed for --variants {','.join(args.variants)} "
            f"(choose from {','.join(engines)})"
        )


def _check_parity(args: argparse.Namespace) -> None:
    from experiments.benchmarks import parity
    from training import config as run_config

    allowed = ",".join(parity.WRAPPERS)
    bad = [k for k in args.kinds or [] if k not in parity.WRAPPERS]
    if bad or args.kinds == []:
        raise ConfigError(f"--kinds: {','.join(bad) or 'empty'} not allowed (choose from {allowed})")
    stray = [k for k in args.settings if k not in (args.kinds or parity.WRAPPERS)]
    if stray:
        raise ConfigError(f"--settings: {','.join(stray)} is not a kind this run trains (--kinds; from {allowed})")
    if args.steps is not None:
        check_number("--steps", args.steps, 1, 10**7, integer=True)
    if args.parity_config is not None:
        check_path("--parity-config", args.parity_config)
    if args.parity_runs is not None:
        check_folder("--parity-runs", args.parity_runs)
    run_config.load(args.parity_config or parity.DEFAULT_CONFIG)  # a bad config: one line, before anything is written


def _check_fits(args: argparse.Namespace) -> None:
    """The smallest case's input and its Q, K, V (four B × n × d_model tensors, at 4 bytes a value) and the model's
    embedding fit the memory budget: a size past it is one line before anything is allocated or written."""
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    limit = memory_limit_bytes(torch.device("cuda" if cuda else "cpu"), args.memory_limit_mb)
    for key, need in (
        ("--batch", 4 * 4 * args.batch * min(args.n) * args.d_model),
        ("--loop-batch", 4 * 4 * args.loop_batch * min(args.n) * args.d_model),
        ("--vocab", 4 * args.vocab * args.d_model),
    ):
        if need > limit:
            raise ConfigError(
                f"{key}: {getattr(args, key[2:].replace('-', '_'))} needs about {need / 2**30:.3g} GiB even at "
                f"the smallest case, more than the {limit / 2**30:.3g} GiB budget here (--memory-limit-mb)"
            )


def memory_limit_bytes(device: torch.device, limit_mb: float) -> float:
    """The budget a case may use: explicit, else 90% of free GPU memory or half of available RAM."""
    if limit_mb > 0:
        return limit_mb * 2**20
    if device.type == "cuda":
        return 0.9 * torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as fh:
            info = {line.split(":")[0]: line.split()[1] for line in fh}
        return 0.5 * int(info["MemAvailable"]) * 1024
    except (OSError, KeyError):
        return 0.5 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _naive_bytes(level: str, mode: str, n: int, shape: cases.Shape) -> float:
    """The (B, h, n, n) matrices the naive baseline holds at once: scores and probabilities in a
    forward pass; probabilities of every layer plus two gradients in training."""
    layers = 1 if level == "layer" else shape.n_layers
    matrices = 2 if mode == "fwd" else layers + 2
    return matrices * shape.batch * shape.n_heads * n * n * torch.finfo(shape.dtype).bits / 8


def _identity(
    level: str,
    mode: str,
    variant: str,
    k: Optional[int],
    order: str,
    causal: bool,
    n: int,
    shape: cases.Shape,
    threads: int,
    engine: str = "auto",
) -> dict:
    return {
        "level": level,
        "mode": mode,
        "variant": variant,
        "k": k,
        "order": order,
        "order_used": None,
        "engine": engine,
        "causal": causal,
        "n": n,
        "batch": shape.batch,
        "dtype": str(shape.dtype).removeprefix("torch."),
        "device": shape.device.type,
        "threads": threads,
    }


@dataclasses.dataclass
class Probed:
    """A case ready to time, with what its probes measured."""

    ident: dict
    case: cases.Case
    flops: int
    peak_bytes: int
    calls: int
    held_bytes: int  # kept between calls while the group is alive


class Bench:
    """One bench run: its shape, limits, measured GEMM peak, and the rows gathered so far."""

    def __init__(
        self,
        args: argparse.Namespace,
        shape: cases.Shape,
        peak_flops: float,
        peak_shape: tuple[int, int, int],
        profiles: Optional[Path] = None,
    ) -> None:
        self.args, self.shape, self.peak, self.peak_shape = args, shape, peak_flops, peak_shape
        self.threads = torch.get_num_threads()
        self.limit = memory_limit_bytes(shape.device, args.memory_limit_mb)
        self.rows: list[dict] = []
        self.last_peak: dict[tuple, tuple[int, int]] = {}  # case key → (n, peak bytes) at the largest n run
        self.profiles = profiles  # where --profile writes each case's operator table (None: no profiling)

    def _skip(self, ident: dict, note: str) -> None:
        self.rows.append({**ident, "note": note})

    def _expected_bytes(self, key: tuple, variant: str, level: str, mode: str, n: int) -> float:
        if key in self.last_peak:
            n0, b0 = self.last_peak[key]
            return b0 * (n / n0) ** 2
        return _naive_bytes(level, mode, n, self.shape) if variant == "naive" else 0.0

    def _probe(
        self,
        level: str,
        mode: str,
        n: int,
        variant: str,
        k: Optional[int],
        order: str,
        engine: str,
        causal: bool,
        alive: list[Probed],
    ) -> Optional[Probed]:
        """Build one case, count its FLOPs (the first warm-up), measure its memory and size its
        timing samples; None (and a row with a note) if it is skipped or fails. ``alive``: the group's cases
        probed so far, whose memory stays held."""
        shape = self.shape
        ident = _identity(level, mode, variant, k, order, causal, n, shape, self.threads, engine)
        if k is not None and k >= n:
            self._skip(ident, f"k={k} ≥ n: nothing to compress")
            return None
        key = (level, mode, variant, k, order, engine, causal)
        expected = self._expected_bytes(key, variant, level, mode, n)
        others = sum(p.held_bytes for p in alive)
        if expected > self.limit - others:
            held = f", {others / 2**20:.0f} MB of it held by the group's other cases" if others else ""
            self._skip(
                ident,
                f"would not fit: about {expected / 2**20:.0f} MB expected, limit {self.limit / 2**20:.0f} MB{held}",
            )
            return None
        try:
            case = cases.build(level, mode, variant, k, order, n, shape, causal, engine=engine)
            flops, _ = count_flops(case.run)
            case.clear()
            peak_bytes = peak_memory_bytes(case.run, shape.device)
            calls = calls_for(seconds_per_call(case.run, shape.device), self.args.min_time)
        except Exception as err:  # noqa: BLE001  (out of memory, a variant that cannot be built: note it)
            self._skip(ident, f"failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            self._free()
            return None
        self.last_peak[key] = (n, peak_bytes)
        return Probed(ident, case, flops, peak_bytes, calls, case.held())

    def _free(self) -> None:
        gc.collect()
        if self.shape.device.type == "cuda":
            torch.cuda.empty_cache()

    def _fit_together(self, ready: list[Probed]) -> list[Probed]:
        """Drop the largest peaks (with a note) until each case that fits alone (its bytes held and its peak)
        also fits beside what all of the group's cases hold. (A case that ran in its probe although its peak
        exceeds the limit is kept, as before: the limit is an estimate for cases not yet run.)"""
        while ready:
            held = sum(p.held_bytes for p in ready)
            crowded = [p for p in ready if p.held_bytes + p.peak_bytes <= self.limit < held + p.peak_bytes]
            if not crowded:
                break
            largest = max(crowded, key=lambda p: p.peak_bytes)
            self._skip(
                largest.ident,
                f"would not fit beside the group's other cases: {largest.peak_bytes / 2**20:.0f} "
                f"MB peak + {held / 2**20:.0f} MB held by the group, limit "
                f"{self.limit / 2**20:.0f} MB",
            )
            ready.remove(largest)
            self._free()
        return ready

    def group(self, level: str, mode: str, n: int) -> None:
        """Probe every case of one (level, mode, n), then time them all in interleaved rounds."""
        ready = self._fit_together(self._probe_all(level, mode, n))
        if not ready:
            return
        # The start-up peak's GEMM timed again in the same rounds: its FLOP/s per round is the
        # reference of the paired efficiency, which load changing since start-up cannot skew.
        m, inner, cols = self.peak_shape
        lhs = torch.randn(m, inner, device=self.shape.device, dtype=self.shape.dtype)
        rhs = torch.randn(inner, cols, device=self.shape.device, dtype=self.shape.dtype)
        samples = self._time_together(ready, lambda: torch.mm(lhs, rhs))
        if not ready:
            return
        gemm_rate = [2 * m * inner * cols / s for s in samples["gemm"]]
        baselines = {(p.case.variant, p.case.causal): p for p in ready if p.case.variant in cases.BASELINES}
        for p in ready:
            self.rows.append(self._row(p, samples, gemm_rate, baselines))
        if self.profiles is not None:
            for p in ready:
                self._profile(p)
        del ready, samples, baselines
        self._free()

    def _profile(self, p: Probed) -> None:
        """``--profile``: one timing sample's calls of the case under torch.profiler, its operators by self time
        (CPU, and the device's on CUDA) written to ``profiles/``, headed by what the case is."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.shape.device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(p.calls):
                p.case.run()
            if self.shape.device.type == "cuda":
                torch.cuda.synchronize()
        c = p.case
        name = "_".join(str(v) for v in (c.level, c.mode, f"n{c.n}", c.variant, f"k{c.k}", c.order_used, c.engine))
        by = "self_cuda_time_total" if self.shape.device.type == "cuda" else "self_cpu_time_total"
        head = (
            f"{c.level} · {c.mode} · {c.variant} k={c.k} order={c.order_used} engine={c.engine} n={c.n} "
            f"batch={self.shape.batch}: {p.calls} call(s), operators by {by.removesuffix('_total').replace('_', ' ')}"
        )
        table = prof.key_averages().table(sort_by=by, row_limit=15, max_name_column_width=48)
        self.profiles.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.profiles / f"{name.replace('/', '-')}.txt", f"{head}\n\n{table}\n")

    def _probe_all(self, level: str, mode: str, n: int) -> list[Probed]:
        """The baselines (once per causality the variants need) and every variant × k × order × engine (those of its
        kind, else auto) that fits alone."""
        a = self.args
        specs = [
            (b, None, "-", "auto", c) for c in sorted({cases.is_causal(v) for v in a.variants}) for b in cases.BASELINES
        ]
        for v in a.variants:
            engines = [e for e in a.engines if e in cases.engines_of(v)] or ["auto"]
            specs += [(v, k, p, e, cases.is_causal(v)) for k in a.k for p in a.orders for e in engines]
        ready: list[Probed] = []
        for spec in specs:
            probed = self._probe(level, mode, n, *spec, alive=ready)
            if probed is not None:
                ready.append(probed)
        return ready

    def _time_together(self, ready: list[Probed], gemm: Callable[[], Any]) -> dict[Any, list[float]]:
        """Seconds per call of every case and the GEMM, in interleaved rounds. Out of memory drops the case
        holding the most (removed from ``ready``, its skip recorded) and retries; ``{}`` once none is left."""
        a, device = self.args, self.shape.device
        gemm_calls = calls_for(seconds_per_call(gemm, device), a.min_time)
        while ready:
            try:
                return interleaved_seconds(
                    {"gemm": gemm, **{p.case.key: p.case.run for p in ready}},
                    {"gemm": gemm_calls, **{p.case.key: p.calls for p in ready}},
                    a.repeats,
                    device,
                )
            except torch.OutOfMemoryError as err:  # the group together, or the allocator's fragments: drop one
                largest = max(ready, key=lambda p: p.peak_bytes)
                reason = str(err).splitlines()[0] if str(err) else "OutOfMemoryError"
                self._skip(
                    largest.ident, f"failed: out of memory while timing beside the group's other cases ({reason})"
                )
                ready.remove(largest)
                self._free()
        return {}

    def _row(self, p: Probed, samples: dict, gemm_rate: list[float], baselines: dict) -> dict:
        """One case's results row: its times, rates, memory, and its speed-up and saving against each baseline."""
        t = samples[p.case.key]
        row = {
            **p.ident,
            "order_used": p.case.order_used,
            "repeats": self.args.repeats,
            "calls": p.calls,
            "time_ms_median": 1e3 * median(t),
            "time_ms_min": 1e3 * min(t),
            "time_ms_max": 1e3 * max(t),
            "tokens_per_s": p.case.tokens / median(t),
            "peak_mem_mb": p.peak_bytes / 2**20,
            "gflop": p.flops / 1e9,
            "gflops_per_s": p.flops / median(t) / 1e9,
            "gemm_peak_gflops": self.peak / 1e9,
            "efficiency": p.flops / median(t) / self.peak,
            "efficiency_paired": median([p.flops / s / g for s, g in zip(t, gemm_rate)]),
        }
        for name in cases.BASELINES:
            base = baselines.get((name, p.case.causal))
            if base is not None:
                row[f"speedup_vs_{name}"] = median([x / y for x, y in zip(samples[base.case.key], t)])
                row[f"memory_saving_vs_{name}"] = base.peak_bytes / p.peak_bytes if p.peak_bytes > 0 else None
        return row

    def decode(self) -> None:
        from experiments.benchmarks.decode import decode_seconds

        a, shape = self.args, self.shape
        positions = [p for p in (a.decode_positions or a.n) if p >= a.decode_window]
        k = a.k[0]
        idents = {
            v: _identity(
                "decode",
                "fwd",
                v,
                k if v == "causal" else None,
                "auto" if v == "causal" else "-",
                True,
                0,
                shape,
                self.threads,
            )
            for v in ("causal", "sdpa")
        }
        try:
            seconds = decode_seconds(positions, k, shape, a.decode_window)
        except Exception as err:  # noqa: BLE001
            for ident in idents.values():
                self._skip(ident, f"failed: {type(err).__name__}: {err}")
            return
        for variant, per_position in seconds.items():
            for p, s in per_position.items():
                self.rows.append(
                    {
                        **idents[variant],
                        "n": p,
                        "repeats": min(p, a.decode_window),
                        "calls": 1,
                        "time_ms_median": 1e3 * s,
                        "tokens_per_s": shape.batch / s,
                        "speedup_vs_sdpa": seconds["sdpa"][p] / s,
                    }
                )

    def loop(self) -> None:
        from experiments.benchmarks.training_loop import loop_overhead

        a, shape = self.args, self.shape
        n, k = a.n[0], min(a.k[0], a.n[0])
        bf16 = shape.dtype == torch.bfloat16
        loop_shape = dataclasses.replace(shape, batch=a.loop_batch)
        idents = {
            v: _identity("loop", "fwdbwd", v, k, "auto", False, n, loop_shape, self.threads)
            for v in ("lightning", "pytorch")
        }
        try:
            result = loop_overhead(
                n,
                k,
                shape.d_model,
                shape.n_heads,
                shape.n_layers,
                shape.d_ff,
                a.loop_batch,
                a.loop_steps,
                a.loop_rounds,
                shape.device,
                bf16,
                shape.vocab,
            )
        except Exception as err:  # noqa: BLE001
            for ident in idents.values():
                self._skip(ident, f"failed: {type(err).__name__}: {err}")
            return
        for variant, key in (("lightning", "lightning_s"), ("pytorch", "bare_s")):
            t = result[key]
            note = (
                f"Lightning ÷ bare per step: {result['ratio']:.3f} (median of {len(t)} paired rounds)"
                if variant == "lightning"
                else "zero_grad, loss, backward, step, scheduler step"
            )
            self.rows.append(
                {
                    **idents[variant],
                    "repeats": len(t),
                    "calls": a.loop_steps,
                    "time_ms_median": 1e3 * median(t),
                    "time_ms_min": 1e3 * min(t),
                    "time_ms_max": 1e3 * max(t),
                    "tokens_per_s": result["tokens"] / median(t),
                    "note": note,
                }
            )


def _libraries(args: argparse.Namespace, shape: cases.Shape, out: Path) -> None:
    """The race against each kind's library (``experiments.benchmarks.libraries``): libraries.md, libraries.csv."""
    from experiments.benchmarks import libraries

    load_before, started = os.getloadavg(), time.time()
    wanted = [v for v in args.variants if v in libraries.LIBRARIES]
    ready = [v for v in wanted if libraries.available(v)]
    missing = [f"{v} ({libraries.LIBRARIES[v][0]})" for v in wanted if v not in ready]
    rows = []
    for n in args.n:
        for mode in args.mode:
            rows += libraries.race(ready, n, args.k[0], mode, shape, args.repeats, args.min_time)
            print(f"  libraries {mode} n={n} done ({time.time() - started:.0f} s)", flush=True)
    header = [
        f"- machine: {_machine(shape.device)}; torch {torch.__version__}; {torch.get_num_threads()} threads; dtype "
        f"{str(shape.dtype).removeprefix('torch.')}; batch {args.batch}; d_model {args.d_model}, {args.heads} heads; "
        f"k = {args.k[0]}",
        f"- load average (1 min) before / after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}; "
        f"{args.repeats} interleaved rounds, each sample ≥ {args.min_time} s; wall time {time.time() - started:.0f} s",
    ]
    if missing:
        header.append(f"- not installed, skipped: {', '.join(missing)} (`pip install -e '.[refs]'`)")
    atomic_write_text(out / "libraries.md", libraries.markdown(rows, header))
    report.write_csv(out / "libraries.csv", rows, list(rows[0]) if rows else ["variant"])
    print(f"library race: {out}/libraries.md")


def _parity(args: argparse.Namespace, out: Path) -> None:
    """Each kind and its library trained through the project's loop (``experiments.benchmarks.parity``):
    parity.md, parity.json, and the runs under parity_runs/."""
    from experiments.benchmarks import parity

    load_before, started = os.getloadavg(), time.time()
    wanted = args.kinds or list(parity.WRAPPERS)
    ready = [kind for kind in wanted if parity.available(kind)]
    for kind in wanted:
        if kind not in ready:
            print(f"  parity: {kind} skipped, {parity.library_of(kind)[0]} is not installed", flush=True)
    config = Path(args.parity_config) if args.parity_config else parity.DEFAULT_CONFIG
    runs = Path(args.parity_runs) if args.parity_runs else out / "parity_runs"
    rows = parity.run(ready, args.seeds, runs, config, args.steps, args.threads, args.settings)
    entries = parity.summary(rows)
    command = "linformer-lab " + " ".join(sys.argv[1:]) if sys.argv[1:] else "linformer-lab bench --levels parity"
    header = [
        f"- command: `{command}`; config {config.name}"
        + (f", {args.steps} steps" if args.steps else "")
        + f"; seeds {','.join(map(str, args.seeds))}; {args.threads or torch.get_num_threads()} threads"
        + (f"; library settings {args.settings}" if args.settings else ""),
        f"- machine: {_machine(torch.device('cpu'))}; torch {torch.__version__}; load average (1 min) before / "
        f"after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}; wall time {time.time() - started:.0f} s",
    ]
    skipped = [f"{kind} ({parity.library_of(kind)[0]})" for kind in wanted if kind not in ready]
    if skipped:
        header.append(f"- not installed, skipped: {', '.join(skipped)} (`pip install -e '.[refs]'`)")
    atomic_write_text(out / "parity.md", parity.markdown(entries, header))
    payload = {"header": header, "config": str(config), "summary": entries, "runs": rows}
    atomic_write_text(out / "parity.json", json.dumps(payload, indent=1) + "\n")
    print(f"library parity: {out}/parity.md")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _auto_dtype(device: torch.device) -> torch.dtype:
    """float32 on CPU; on a GPU bfloat16 from compute capability 8.0 (Ampere) on, float16 before (older GPUs
    emulate bfloat16, slowly)."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16


def _machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        model = ""
    return f"{model or platform.processor() or 'CPU'} ({os.cpu_count()} logical cores)"


def _gemm_shapes(args: argparse.Namespace, levels: list[str]) -> list[tuple[int, int, int]]:
    """The products the cases run: projections (B·n × d × d), feed-forward (B·n × d × d_ff) and
    E X (k × n × d)."""
    shapes = set()
    for n in args.n:
        shapes.add((args.batch * n, args.d_model, args.d_model))
        if "model" in levels:
            shapes.add((args.batch * n, args.d_model, args.d_ff))
        shapes.update((k, n, args.d_model) for k in args.k if k < n)
    return sorted(shapes)


def _out_dir(root: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, i = Path(root) / stamp, 1
    while path.exists():
        path, i = Path(root) / f"{stamp}-{i}", i + 1
    path.mkdir(parents=True)
    return path


def _noise(rows: list[dict]) -> str:
    spreads = [
        (r["time_ms_max"] - r["time_ms_min"]) / r["time_ms_median"]
        for r in rows
        if r.get("time_ms_min") is not None and r["level"] in ("layer", "model")
    ]
    if not spreads:
        return "no interleaved timings"
    return (
        f"(max − min) / median over rounds: median {median(spreads):.0%}, worst {max(spreads):.0%} "
        f"across {len(spreads)} cases"
    )


def main(args: argparse.Namespace) -> int:
    _check(args)
    threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # the thread count is process-wide: leave it as found


def _run(args: argparse.Namespace) -> int:
    device = _device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else _auto_dtype(device)
    shape = cases.Shape(args.d_model, args.heads, args.layers, args.d_ff, args.vocab, args.batch, dtype, device)
    out = _out_dir(args.out)
    load_before = os.getloadavg()
    peak, per_shape = gemm_peak(_gemm_shapes(args, args.levels), dtype, device, args.min_time)
    peak_shape = max(per_shape, key=per_shape.get)
    if args.shape_note:
        print(f"shape: {args.shape_note}", flush=True)
    print(f"GEMM peak {peak / 1e9:.1f} GFLOP/s at {'×'.join(map(str, peak_shape))}; writing {out}", flush=True)
    bench = Bench(args, shape, peak, peak_shape, profiles=out / "profiles" if args.profile else None)
    started = time.time()
    for level in [lv for lv in ("layer", "model") if lv in args.levels]:
        for mode in args.mode:
            for n in args.n:
                bench.group(level, mode, n)
                print(f"  {level} {mode} n={n} done ({time.time() - started:.0f} s)", flush=True)
    if "decode" in args.levels:
        bench.decode()
    if "loop" in args.levels:
        bench.loop()
    if "libraries" in args.levels:
        _libraries(args, shape, out)
    if "parity" in args.levels:
        _parity(args, out)
    header = [
        f"- machine: {_machine(device)}; torch {torch.__version__}; {bench.threads} threads; dtype "
        f"{str(dtype).removeprefix('torch.')}; batch {args.batch}",
        f"- shape: d_model {args.d_model}, {args.heads} heads, d_ff {args.d_ff}, {args.layers} layers in model cases"
        + (f" ({args.shape_note})" if args.shape_note else ""),
        f"- GEMM peak (best `torch.mm` over the cases' shapes, measured at start-up): {peak / 1e9:.1f} GFLOP/s "
        f"at m×k×n = {'×'.join(map(str, peak_shape))}; timed again in every group's rounds (paired efficiency)",
        f"- load average (1 min) before / after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}; timing noise: "
        f"{_noise(bench.rows)}",
        f"- memory: peak bytes allocated during one call beyond those held before it "
        f"({'CUDA allocator peak' if device.type == 'cuda' else 'profiler memory events summed in time order'})",
        f"- {args.repeats} interleaved rounds per case, each sample ≥ {args.min_time} s; wall time "
        f"{time.time() - started:.0f} s",
    ]
    table = report.markdown(bench.rows, header)
    report.write_csv(out / "results.csv", bench.rows)
    if "layer" in args.levels and "fwdbwd" in args.mode:
        command = "linformer-lab " + " ".join(sys.argv[1:]) if sys.argv[1:] else "linformer-lab bench"
        costs = report.kind_costs(bench.rows, command, header[0].removeprefix("- machine: "), time.strftime("%Y-%m-%d"))
        atomic_write_text(out / "kind_costs.json", json.dumps(costs, indent=1) + "\n")
    atomic_write_text(out / "table.md", table)
    write_figure(out / "scaling.png", report.figure(bench.rows), dpi=130)
    report.tensorboard(out, bench.rows, out / "scaling.png", table)
    print(f"bench results: {out}/table.md")
    return 0
