"""Training-level parity with the reference libraries (``bench --levels parity``; optional extra ``refs``).

The layer-level race (:mod:`experiments.benchmarks.libraries`) checks that a kind computes its library's function
with the same weights; it cannot see a default that decides what a model *learns* (an initial scale, a second
context path, how many keys a query reaches). This level trains both through the project's own loop
(:func:`training.train.train`, the byte-MLM CPU base ``experiments/configs/bytes_mlm.yaml`` by default) and
compares the objective ``val/masked_loss``:

* ``project``: the kind's layer that races its library (``variants.REFERENCES[kind].attention(n, k)``);
* ``library``: the attention kind ``library`` (registered only while the bench trains, :func:`library_kind`),
  options ``{of: <kind>, k: <budget>}``: the library's own self-attention layer with its own defaults for
  everything kind-specific, given only the shape (d, heads, n) and the kind's matched budget k, as in the race:

  ==========  ====================================================================================================
  linformer   ``linformer.LinformerSelfAttention(dim, seq_len=n, k=k, heads)``: its E/F (``proj_k``, ``proj_v``,
              (n, k), U(±1/√k)), one per layer shared by the heads, no Q/K/V bias
  performer   ``performer_pytorch.SelfAttention(dim, heads, dim_head, nb_features=k)``: its features, its ε = 1e-4
              in φ, no Q/K/V bias, redrawn every ``feature_redraw_interval`` (1,000) training calls as its
              ``Performer`` model does (``ProjectionUpdater``)
  nystrom     ``nystrom_attention.NystromAttention(dim, dim_head, heads, num_landmarks=k)``: its 6-step
              pseudo-inverse and its residual depthwise convolution on V (kernel 33)
  lsh         ``reformer_pytorch.LSHSelfAttention(dim, heads, bucket_size=k)``: its 8 hash rounds, rotations
              drawn at every call, attention across buckets and duplicates allowed
  local       ``local_attention.LocalMHA(dim, window_size=⌊k/2⌋, dim_head, heads)``: |i − j| ≤ ⌊k/2⌋ (its exact
              window, look-backward and look-forward 1) and rotary positions on Q and K
  ==========  ====================================================================================================

  ``settings`` overrides any constructor keyword (an ablation: ``{residual: false}``, ``{n_hashes: 1}``).

The library layer owns its Q/K/V/O. Inside the encoder, ``init_weights`` re-draws every ``nn.Linear`` from
N(0, ``model.init_std``²) with zero biases, the library's Q/K/V/O included: both sides start their dense
weights the same way, as they train in the same loop. What is not an ``nn.Linear`` keeps the library's draw:
linformer's ``proj_k``/``proj_v``, performer's feature matrix, nystrom's ``res_conv``, local's rotary table.
The layer takes no padding mask (the byte base has none): a batch with padding is refused in one line.

Per kind and seed both sides train with the same config and seed; the report gives each side's mean ± sd over
seeds, the paired difference library − project with its 95 % CI (:func:`sweeps.spec.stats.compare`), and each side's
gain over the no-context level (``baselines/unigram/masked_loss`` of ``metrics.json``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from experiments.benchmarks.variants import REFERENCES
from foundation.errors import require
from foundation.rundir import CHECKPOINT
from lightning_modules.attention import ATTENTION_KINDS
from lightning_modules.attention.base import SelfAttention, kind_options, register_attention
from sweeps.spec.stats import compare, summarize

METRIC = "val/masked_loss"
BASELINE = "unigram/masked_loss"
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "bytes_mlm.yaml"


# ------------------------------------------------------------------------------ the library layers
def _linformer(lib: Any, m: DictConfig, k: int, settings: dict) -> nn.Module:
    return lib.LinformerSelfAttention(
        **{"dim": m.d_model, "seq_len": m.max_len, "k": k, "heads": m.n_heads, **settings}
    )


class _RedrawnPerformer(nn.Module):
    """performer-pytorch's ``SelfAttention`` with the feature redraw its ``Performer`` model gives every layer:
    a new feature matrix after each ``interval`` training calls (the library's ``ProjectionUpdater``)."""

    def __init__(self, lib: Any, interval: Optional[int], **kwargs: Any) -> None:
        super().__init__()
        self.updater = lib.ProjectionUpdater(lib.SelfAttention(**kwargs), interval)  # holds the layer

    def forward(self, x: Tensor) -> Tensor:
        self.updater.redraw_projections()  # counts training calls only
        return self.updater.instance(x)


def _performer(lib: Any, m: DictConfig, k: int, settings: dict) -> nn.Module:
    settings = dict(settings)
    # The library's own default interval (its SelfAttention takes the keyword; its Performer model applies it).
    interval = settings.pop(
        "feature_redraw_interval", inspect.signature(lib.SelfAttention).parameters["feature_redraw_interval"].default
    )
    shape = {"dim": m.d_model, "heads": m.n_heads, "dim_head": m.d_model // m.n_heads, "nb_features": k}
    return _RedrawnPerformer(lib, interval, **{**shape, **settings})


def _nystrom(lib: Any, m: DictConfig, k: int, settings: dict) -> nn.Module:
    shape = {"dim": m.d_model, "dim_head": m.d_model // m.n_heads, "heads": m.n_heads, "num_landmarks": k}
    return lib.NystromAttention(**{**shape, **settings})


def _lsh(lib: Any, m: DictConfig, k: int, settings: dict) -> nn.Module:
    return lib.LSHSelfAttention(**{"dim": m.d_model, "heads": m.n_heads, "bucket_size": k, **settings})


def _local(lib: Any, m: DictConfig, k: int, settings: dict) -> nn.Module:
    shape = {"dim": m.d_model, "window_size": max(1, k // 2), "dim_head": m.d_model // m.n_heads, "heads": m.n_heads}
    return lib.LocalMHA(**{**shape, **settings})


# kind → how its library layer is built from (imported library, model config, budget k, constructor overrides)
WRAPPERS: dict[str, Callable[[Any, DictConfig, int, dict], nn.Module]] = {
    "linformer": _linformer,
    "performer": _performer,
    "nystrom": _nystrom,
    "lsh": _lsh,
    "local": _local,
}


def library_of(kind: str) -> tuple[str, str]:
    """(pip name, import name) of the kind's reference library (``variants.REFERENCES``)."""
    return REFERENCES[kind].package, REFERENCES[kind].module


def available(kind: str) -> bool:
    try:
        importlib.import_module(library_of(kind)[1])
    except ImportError:
        return False
    return True


@dataclass
class LibraryOptions:
    # The kind whose reference library builds the layer: linformer, performer, nystrom, lsh or local.
    of: str = "linformer"
    # The matched budget, as in the race: k slots (linformer), features (performer), landmarks (nystrom), the
    # bucket size (lsh), ⌊k/2⌋ positions on each side (local).
    k: int = 8
    # Constructor keywords overriding the library's defaults (an ablation); {}: the library's defaults.
    settings: Dict[str, Any] = field(default_factory=dict)


class LibraryAttention(SelfAttention):
    """A reference library's self-attention layer (:data:`WRAPPERS`) as an attention kind: x (B, T, d) → (B, T, d),
    its own Q/K/V/O, no padding mask. For the parity bench and its tests; not a kind for studies."""

    Options = LibraryOptions
    has_causal_form = False

    def __init__(self, model: DictConfig, layer: int = 0, shared: Any = None) -> None:
        nn.Module.__init__(self)  # no project Q/K/V/O: the library layer has its own
        opts = kind_options(model.attention)
        self.d_model, self.n_heads, self.d_head = model.d_model, model.n_heads, model.d_model // model.n_heads
        self.causal, self.layer, self.dropout, self.of = False, layer, 0.0, str(opts.of)
        library = importlib.import_module(library_of(self.of)[1])
        settings = OmegaConf.to_container(opts.settings, resolve=True)
        here = torch.empty(()).device  # the meta device when the run's preflight counts parameters
        with torch.device("cpu" if here.type == "meta" else here):  # performer-pytorch's QR copies to the CPU
            self.inner = WRAPPERS[self.of](library, model, int(opts.k), settings).to(here)

    @classmethod
    def check(cls, model: DictConfig) -> None:
        opts, n = kind_options(model.attention), model.max_len
        require(
            opts.of in WRAPPERS,
            f"model.attention.options.of: {opts.of!r} has no library wrapper (allowed: {', '.join(WRAPPERS)})",
        )
        pip, name = library_of(opts.of)
        require(
            importlib.util.find_spec(name) is not None,
            f"model.attention.options.of: {opts.of!r} needs the library {pip}, which is not installed "
            "(pip install -e '.[refs]')",
        )
        require(1 <= opts.k <= n, f"model.attention.options.k: {opts.k} must be in [1, model.max_len={n}]")
        require(
            model.attention.dropout == 0,
            f"model.attention.dropout: {model.attention.dropout} not allowed for kind 'library' (the library "
            "layer keeps its own default); set 0",
        )

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        if mask is not None and not bool(mask.all()):
            raise ValueError(
                f"attention kind 'library' ({library_of(self.of)[0]}): a padding mask is not supported (the "
                "parity bench trains on unpadded blocks); use a task without padding"
            )
        return self.inner(x)


LIBRARY = "library"  # the kind's name while the parity bench trains with it


@contextlib.contextmanager
def library_kind() -> Iterator[None]:
    """The kind ``library`` (:class:`LibraryAttention`) registered while the parity bench trains, and only then: it
    is no kind of the suite's studies, its listings or its analysis."""
    outer = LIBRARY in ATTENTION_KINDS  # entered again inside a block that registered it: leave it registered
    register_attention(LIBRARY)(LibraryAttention)
    try:
        yield
    finally:
        if not outer:
            ATTENTION_KINDS.pop(LIBRARY, None)


# ------------------------------------------------------------------------------ the parity runs
def project_attention(kind: str, n: int, k: int) -> dict:
    """The project's side: the kind's layer that races its library."""
    return REFERENCES[kind].attention(n, k)


def library_attention(kind: str, k: int, settings: Optional[dict] = None) -> dict:
    return {"kind": LIBRARY, "options": {"of": kind, "k": k, "settings": dict(settings or {})}}


def overrides(attention: dict, seed: int, steps: Optional[int], threads: int, run_dir: Path) -> list[str]:
    """key=value overrides of one run: its attention (replacing the base's, options included), seed, steps,
    threads and run directory; ``resume=true`` where the run directory holds a checkpoint (a finished run is
    read back, an interrupted one continues)."""
    out = [f"seed={seed}", f"run_dir={run_dir}", f"model.attention={_flow(attention)}"]
    if (run_dir / CHECKPOINT).is_file():
        out.append("resume=true")
    if steps is not None:
        out.append(f"trainer.max_steps={steps}")
    if threads > 0:
        out.append(f"trainer.cpu_threads={threads}")
    return out


def _flow(value: Any) -> str:
    """A value in the flow syntax of a key=value override (YAML)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def run_one(config: Path, attention: dict, seed: int, steps: Optional[int], threads: int, run_dir: Path) -> dict:
    """Train one side at one seed in this process; its objective, no-context level and wall time."""
    from training import config as run_config
    from training.train import train

    with library_kind():
        metrics = train(run_config.load(config, overrides(attention, seed, steps, threads, run_dir)))
    return {
        "loss": float(metrics[METRIC]),
        "baseline": float(metrics["baselines"][BASELINE]),
        "steps": int(metrics["global_step"]),
        "seconds": float(metrics["wall_time_s"]),
        "run_dir": str(run_dir),
    }


def run(
    kinds: list[str],
    seeds: list[int],
    out: Path,
    config: Path = DEFAULT_CONFIG,
    steps: Optional[int] = None,
    threads: int = 1,
    settings: Optional[dict[str, dict]] = None,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Every (kind, seed, side), sequentially, seed by seed (so a stopped run still has pairs); one row each.
    ``settings``: per kind, constructor keywords overriding its library's defaults (an ablation). Runs found
    finished under ``out`` are read back, not trained again."""
    from training import config as run_config

    base = run_config.load(config)
    n = int(base.model.max_len)
    # The base's own budget where its kind compresses to a fixed length (Linformer's k), else n/4.
    lengths = ATTENTION_KINDS[base.model.attention.kind].compressed_lengths(base.model)
    k = lengths[0] if lengths else n // 4
    rows = []
    for seed in seeds:
        for kind in kinds:
            for side, attention in (
                ("project", project_attention(kind, n, k)),
                ("library", library_attention(kind, k, (settings or {}).get(kind))),
            ):
                result = run_one(config, attention, seed, steps, threads, out / kind / side / f"seed_{seed}")
                rows.append({"kind": kind, "side": side, "seed": seed, "k": k, **result})
                log(
                    f"  parity {kind} {side} seed {seed}: {METRIC} {result['loss']:.4f} (no context "
                    f"{result['baseline']:.4f}) in {result['seconds']:.0f} s"
                )
    return rows


# ------------------------------------------------------------------------------ the comparison
def summary(rows: list[dict]) -> list[dict]:
    """Per kind: each side's mean ± sd and gain over the no-context level, and the paired difference
    library − project with its 95 % CI."""
    out = []
    for kind in dict.fromkeys(r["kind"] for r in rows):
        side = {s: {r["seed"]: r["loss"] for r in rows if r["kind"] == kind and r["side"] == s} for s in SIDES}
        baseline = next(r["baseline"] for r in rows if r["kind"] == kind)
        c = compare(side["library"], side["project"])
        lo, hi = c.ci()
        entry = {"kind": kind, "package": library_of(kind)[0], "k": rows[0]["k"], "baseline": baseline}
        for s in SIDES:
            values = summarize(list(side[s].values()))
            entry[s] = {"n": values.n, "mean": values.mean, "sd": values.std, "gain": baseline - values.mean}
            entry[s]["gain_by_seed"] = {str(seed): baseline - v for seed, v in side[s].items()}
        entry["difference"] = {"mean": c.diff, "lo": lo, "hi": hi, "test": c.test, "beyond_noise": c.distinguishable}
        out.append(entry)
    return out


SIDES = ("project", "library")


def _pm(mean: float, sd: float) -> str:
    return f"{mean:.3f} ± {sd:.3f}" if math.isfinite(sd) else f"{mean:.3f}"


def markdown(entries: list[dict], header: list[str]) -> str:
    lines = [
        "# Training-level parity with the reference libraries",
        "",
        *header,
        "",
        f"`{METRIC}` (lower is better), mean ± sd over seeds; gain: the no-context level minus the loss; "
        "difference: library − project, paired by seed, with its 95 % CI (t with n − 1 degrees of freedom).",
        "",
        "| kind | library | seeds | no context | project | library | project gain | library gain | "
        "library − project [95 % CI] | beyond noise |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        p, q, d = e["project"], e["library"], e["difference"]
        ci = f"[{d['lo']:+.3f}, {d['hi']:+.3f}]" if math.isfinite(d["lo"]) else "(one seed)"
        lines.append(
            f"| {e['kind']} | {e['package']} | {p['n']} | {e['baseline']:.3f} | {_pm(p['mean'], p['sd'])} | "
            f"{_pm(q['mean'], q['sd'])} | {p['gain']:.3f} | {q['gain']:.3f} | {d['mean']:+.3f} {ci} | "
            f"{'yes' if d['beyond_noise'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"
