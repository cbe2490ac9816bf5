"""``linformer-lab time-to-target`` (experiments/time_to_target.py): the reach between the bracketing validations, one
row per variant, one-line errors, and a target that a model without context reaches refused."""

import json
import math

import pytest

from experiments import cli, time_to_target


# ------------------------------------------------------------------------------ time to target
def test_reach_interpolates_between_the_bracketing_validations():
    curve = [(10.0, 1000, 100.0), (20.0, 2000, 60.0), (30.0, 3000, 40.0)]
    assert time_to_target.reach(curve, 50.0) == pytest.approx((25.0, 2500.0))  # halfway from 60 to 40
    assert time_to_target.reach(curve, 100.0) == (10.0, 1000.0)  # the first validation already
    assert time_to_target.reach(curve, 39.0) is None


def _fake_run(path, k, seed, curve, tokens_per_sec=1000.0):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        f"experiment: e{seed}\nseed: {seed}\nmodel:\n  attention:\n    options:\n      k: {k}\n"
    )
    (path / "metrics.json").write_text(json.dumps({"ppl_vs_wallclock": curve, "tokens_per_sec": tokens_per_sec}))


def test_time_to_target_table_has_one_row_per_variant(tmp_path, capsys):
    _fake_run(tmp_path / "a" / "version_0", 32, 0, [[10, 100, 80], [20, 200, 40]])
    _fake_run(tmp_path / "a" / "version_1", 32, 1, [[10, 100, 80], [30, 300, 40]])
    _fake_run(tmp_path / "b" / "version_0", 64, 0, [[10, 100, 90], [20, 200, 70]])
    table_rows, keys = time_to_target.rows([tmp_path], target=60.0)
    assert keys == ["model.attention.options.k"]  # seeds and experiment names do not split variants
    by_variant = {r["variant"]: r for r in table_rows}
    k32, k64 = by_variant["attention.options.k=32"], by_variant["attention.options.k=64"]
    assert (k32["runs"], k32["reached"]) == (2, 2)
    assert k32["seconds"] == pytest.approx((15 + 20) / 2) and k32["tokens"] == pytest.approx((150 + 200) / 2)
    assert (k64["runs"], k64["reached"], k64["seconds"]) == (1, 0, None)

    out = tmp_path / "ttt.md"
    assert cli.main(["time-to-target", str(tmp_path), "--target", "60", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == out.read_text()
    assert "| attention.options.k=64 | 1 | 0 | – |" in printed and "Time to validation perplexity ≤ 60" in printed
    assert not math.isnan(k32["final_ppl"])


def test_time_to_target_errors_are_one_line(tmp_path, capsys):
    assert cli.main(["time-to-target", str(tmp_path), "--target", "60"]) == 2
    assert "no run directory" in capsys.readouterr().err
    assert cli.main(["time-to-target", str(tmp_path), "--target", "abc"]) == 2
    assert "--target: expected numbers" in capsys.readouterr().err


def test_time_to_target_refuses_a_target_a_model_without_context_reaches(tmp_path, capsys):
    _fake_run(tmp_path / "a" / "version_0", 32, 0, [[10, 100, 80], [20, 200, 40]])
    metrics = json.loads((tmp_path / "a" / "version_0" / "metrics.json").read_text())
    metrics["baselines"] = {"unigram/loss": math.log(50.0)}  # a model without context reaches val ppl 50
    (tmp_path / "a" / "version_0" / "metrics.json").write_text(json.dumps(metrics))
    assert cli.main(["time-to-target", str(tmp_path), "--target", "45,60"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--target: 60 is reached by a model without context (val ppl 50, the unigram baseline of these runs)" in err
    assert cli.main(["time-to-target", str(tmp_path), "--target", "45"]) == 0
