"""The bench's outputs (experiments/benchmarks/report.py): the fitted slope recovers the exponent, and each kind's
first variant is costed against full attention."""

import pytest

from experiments.benchmarks import report


# ------------------------------------------------------------------------------ report helpers
def test_fitted_slope_recovers_the_exponent():
    ns = [512, 1024, 2048, 4096]
    assert report.fitted_slope(ns, [3e-9 * n**2 for n in ns]) == pytest.approx(2.0)
    assert report.fitted_slope(ns, [0.5 * n for n in ns]) == pytest.approx(1.0)
    assert report.fitted_slope([512], [1.0]) is None


def bench_row(mode: str, variant: str, k, time_ms: float, mem_mb: float, speedup=None, saving=None) -> dict:
    """A layer row of bench's results at n = 64 (its ratios to SDPA where the bench gives them)."""
    row = {"level": "layer", "mode": mode, "variant": variant, "k": k, "n": 64, "time_ms_median": time_ms}
    row["peak_mem_mb"] = mem_mb
    if speedup is not None:
        row.update(speedup_vs_sdpa=speedup, memory_saving_vs_sdpa=saving)
    return row


def test_kind_costs_give_each_kinds_first_variant_against_full_attention():
    rows = [
        bench_row("fwdbwd", "sdpa", None, 4.0, 2.0),
        bench_row("fwdbwd", "naive", None, 9.0, 9.0),
        bench_row("fwdbwd", "learned", 8, 2.0, 1.0, 2.0, 2.0),
        bench_row("fwdbwd", "kv", 8, 1.0, 1.0, 4.0, 2.0),
        bench_row("fwd", "local", 8, 1.0, 1.0, 3.0, 1.0),
    ]
    costs = report.kind_costs(rows, "linformer-lab bench", "CPU", "2026-12-01")
    by_kind = {c["kind"]: c for c in costs["kinds"]}
    assert set(by_kind) == {"full", "linformer"}  # naive is not a kind; local ran forward only
    assert by_kind["full"]["by_n"]["64"]["time_vs_full"] == 1.0
    assert by_kind["linformer"]["variant"] == "learned"  # the first Linformer variant, not kv
    assert by_kind["linformer"]["by_n"]["64"]["time_vs_full"] == 2.0
