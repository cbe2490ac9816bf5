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


def test_kind_costs_give_each_kinds_first_variant_against_full_attention():
    rows = [
        {
            "level": "layer",
            "mode": "fwdbwd",
            "variant": "sdpa",
            "k": None,
            "n": 64,
            "time_ms_median": 4.0,
            "peak_mem_mb": 2.0,
        },
        {
            "level": "layer",
            "mode": "fwdbwd",
            "variant": "naive",
            "k": None,
            "n": 64,
            "time_ms_median": 9.0,
            "peak_mem_mb": 9.0,
        },
        {
            "level": "layer",
            "mode": "fwdbwd",
            "variant": "learned",
            "k": 8,
            "n": 64,
            "time_ms_median": 2.0,
            "peak_mem_mb": 1.0,
            "speedup_vs_sdpa": 2.0,
            "memory_saving_vs_sdpa": 2.0,
        },
        {
            "level": "layer",
            "mode": "fwdbwd",
            "variant": "kv",
            "k": 8,
            "n": 64,
            "time_ms_median": 1.0,
            "peak_mem_mb": 1.0,
            "speedup_vs_sdpa": 4.0,
            "memory_saving_vs_sdpa": 2.0,
        },
        {
            "level": "layer",
            "mode": "fwd",
            "variant": "local",
            "k": 8,
            "n": 64,
            "time_ms_median": 1.0,
            "peak_mem_mb": 1.0,
            "speedup_vs_sdpa": 3.0,
            "memory_saving_vs_sdpa": 1.0,
        },
    ]
    costs = report.kind_costs(rows, "linformer-lab bench", "CPU", "2026-12-01")
    by_kind = {c["kind"]: c for c in costs["kinds"]}
    assert set(by_kind) == {"full", "linformer"}  # naive is not a kind; local ran forward only
    assert by_kind["full"]["by_n"]["64"]["time_vs_full"] == 1.0
    assert by_kind["linformer"]["variant"] == "learned"  # the first Linformer variant, not kv
    assert by_kind["linformer"]["by_n"]["64"]["time_vs_full"] == 2.0
