"""How the bench measures (experiments/benchmarks/measure.py): the memory probe measures a known allocation and resets
between calls."""

import pytest
import torch

from experiments.benchmarks.measure import peak_memory_bytes

CPU = torch.device("cpu")


# ------------------------------------------------------------------------------ memory probe
def test_memory_probe_measures_a_known_allocation_within_5_percent():
    mib = 2**20

    def fn():
        a = torch.ones(4 * mib // 4)  # 4 MiB
        b = torch.ones(8 * mib // 4)  # +8 MiB: 12 MiB held, the peak
        del b
        c = a * 2  # +4 MiB: 8 MiB held
        return c.sum()

    assert peak_memory_bytes(fn, CPU) == pytest.approx(12 * mib, rel=0.05)
    x = torch.randn(1024, 256)
    w = torch.randn(256, 512)
    assert peak_memory_bytes(lambda: x @ w, CPU) == pytest.approx(1024 * 512 * 4, rel=0.05)


def test_memory_probe_resets_between_calls():
    """Unlike ru_maxrss, a small call measured after a big one reports its own peak."""
    peak_memory_bytes(lambda: torch.ones(64 * 2**20 // 4), CPU)
    assert peak_memory_bytes(lambda: torch.ones(2**20 // 4), CPU) == pytest.approx(2**20, rel=0.05)
