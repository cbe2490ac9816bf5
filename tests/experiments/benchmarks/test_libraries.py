"""The race against each kind's public implementation (experiments/benchmarks/libraries.py; extra refs): both sides
timed, their outputs matched where the functions agree."""

import pytest
import torch

from experiments.benchmarks import cases

CPU = torch.device("cpu")


# ------------------------------------------------------------------------------ the race against the libraries
def test_library_race_times_both_sides_and_matches_outputs_where_the_functions_agree():
    from experiments.benchmarks import libraries

    ready = [v for v in libraries.LIBRARIES if libraries.available(v)]
    if not ready:
        pytest.skip("no reference library installed (extra refs)")
    rows = libraries.race(ready, 64, 8, "fwdbwd", cases.Shape(32, 2, 1, 64, 50, 1, torch.float32, CPU), 2, 0.001)
    assert [r["variant"] for r in rows] == ready
    for row in rows:
        assert row["project_ms"] > 0 and row["library_ms"] > 0 and row["ratio"] > 0
        assert row["project_mb"] > 0 and row["library_mb"] > 0
        if row["variant"] in ("nystrom", "performer", "headwise"):  # same weights, same function
            assert row["max_difference"] < 1e-4
    table = libraries.markdown(rows, ["- header"])
    assert table.count("\n| ") == len(rows) + 1  # the header row and one per race
