"""The efficiency bench measures what it says, and time-to-target reads runs' curves correctly."""

import argparse
import csv
import json
import math

import pytest
import torch

from experiments import bench, cli, time_to_target
from experiments.benchmarks import cases, report, variants
from experiments.benchmarks.measure import peak_memory_bytes
from foundation.errors import ConfigError
from lightning_modules.attention import ATTENTION_KINDS
from lightning_modules.encoder import TransformerEncoder
from lightning_modules.flops import count_flops

CPU = torch.device("cpu")
TINY = [
    "--n",
    "32,64",
    "--k",
    "8",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--layers",
    "2",
    "--d-ff",
    "64",
    "--vocab",
    "50",
    "--repeats",
    "2",
    "--min-time",
    "0.001",
    "--decode-window",
    "4",
    "--loop-batch",
    "2",
    "--loop-steps",
    "3",
    "--loop-rounds",
    "2",
    "--threads",
    "1",
]
SHAPE = cases.Shape(d_model=32, n_heads=4, n_layers=2, d_ff=64, vocab=50, batch=2, dtype=torch.float32, device=CPU)


# ------------------------------------------------------------------------------ the bench end to end
def test_tiny_bench_writes_every_output_with_the_expected_columns(tmp_path):
    assert cli.main(["bench", *TINY, "--variants", "learned,causal", "--out", str(tmp_path)]) == 0
    (out,) = tmp_path.iterdir()
    assert {p.name for p in out.iterdir() if not p.name.startswith("events.out.tfevents")} == {
        "results.csv",
        "table.md",
        "scaling.png",
        "kind_costs.json",  # each kind's layer forward + backward cost, for the study reports
    }
    assert any(p.name.startswith("events.out.tfevents") for p in out.iterdir())
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    with (out / "results.csv").open() as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == report.COLUMNS
        rows = list(reader)
    assert not [r for r in rows if r["note"].startswith("failed")]
    timed = {(r["level"], r["mode"], r["variant"], r["causal"], int(r["n"])): r for r in rows if r["time_ms_median"]}
    for level in ("layer", "model"):
        for mode in ("fwd", "fwdbwd"):
            for n in (32, 64):
                for variant, causal in (
                    ("naive", "False"),
                    ("sdpa", "False"),
                    ("learned", "False"),
                    ("naive", "True"),
                    ("sdpa", "True"),
                    ("causal", "True"),
                ):
                    assert (level, mode, variant, causal, n) in timed
                row = timed[(level, mode, "learned", "False", n)]
                for column in (
                    "speedup_vs_sdpa",
                    "speedup_vs_naive",
                    "memory_saving_vs_sdpa",
                    "memory_saving_vs_naive",
                    "efficiency",
                    "peak_mem_mb",
                    "gflop",
                ):
                    assert float(row[column]) > 0, column
    assert {(r["variant"], int(r["n"])) for r in rows if r["level"] == "decode"} == {
        (v, n) for v in ("causal", "sdpa") for n in (32, 64)
    }
    assert {r["variant"] for r in rows if r["level"] == "loop"} == {"lightning", "pytorch"}

    table = (out / "table.md").read_text()
    for heading in (
        "### layer · forward (inference mode) · learned",
        "### model · forward + backward · causal",
        "Over naive softmax attention (the paper's baseline):",
        "Over scaled_dot_product_attention:",
        "## Streaming decode",
        "## Lightning loop vs bare PyTorch loop",
    ):
        assert heading in table


def test_a_case_that_would_not_fit_is_skipped_with_a_note(monkeypatch):
    holding_nothing(monkeypatch)  # the peaks alone (what the group's cases hold: the next test)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args([*TINY, "--variants", "learned", "--memory-limit-mb", "0.01"])
    run = bench.Bench(
        args, cases.Shape(32, 2, 2, 64, 50, 1, torch.float32, CPU), peak_flops=1e9, peak_shape=(64, 32, 32)
    )
    run.group("layer", "fwd", 64)
    # Naive needs 2·h·n² floats = 64 KiB, over the 10 KiB limit; the others are probed and run.
    (naive,) = [r for r in run.rows if r["variant"] == "naive"]
    assert naive["note"].startswith("would not fit") and naive.get("time_ms_median") is None
    learned = next(r for r in run.rows if r["variant"] == "learned")
    assert learned["time_ms_median"] > 0 and learned.get("speedup_vs_naive") is None
    run.group("layer", "fwd", 128)  # extrapolated from n = 64 as n²: now nothing fits
    assert all(r["note"].startswith("would not fit") for r in run.rows if r["n"] == 128)


def _bench(*extra: str) -> bench.Bench:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return bench.Bench(
        parser.parse_args([*TINY, "--variants", "learned", *extra]),
        cases.Shape(32, 2, 2, 64, 50, 1, torch.float32, CPU),
        peak_flops=1e9,
        peak_shape=(64, 32, 32),
    )


def holding_nothing(monkeypatch, held: int = 0) -> None:
    """Cases built from now on report ``held`` bytes kept between calls, and carry their variant on ``run``."""
    build = cases.build

    def built(level, mode, variant, *args, **kwargs):
        case = build(level, mode, variant, *args, **kwargs)
        case.held, case.run.variant = (lambda: held), variant
        return case

    monkeypatch.setattr(cases, "build", built)


def test_the_memory_limit_counts_what_the_groups_other_cases_hold(monkeypatch):
    """While a group is timed all its cases are alive: each case's peak must fit beside what every case holds
    between calls (weights, inputs, gradients), not beside nothing."""
    mib = 2**20
    holding_nothing(monkeypatch, held=3 * mib)
    monkeypatch.setattr(bench, "peak_memory_bytes", lambda fn, device: 4 * mib)
    run = _bench("--memory-limit-mb", "10")  # each case alone: 3 + 4 MiB; three together: 9 + 4 MiB
    run.group("layer", "fwd", 64)
    skipped = [r for r in run.rows if r.get("note")]
    timed = [r for r in run.rows if r.get("time_ms_median")]
    assert len(skipped) == 1 and "would not fit beside the group's other cases" in skipped[0]["note"]
    assert len(timed) == 2


def test_out_of_memory_while_timing_drops_a_case_and_times_the_others(monkeypatch):
    timed_together = bench.interleaved_seconds

    def out_of_memory_with_naive(fns, calls, repeats, device):
        if any(key[2] == "naive" for key in fns if key != "gemm"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return timed_together(fns, calls, repeats, device)

    monkeypatch.setattr(bench, "interleaved_seconds", out_of_memory_with_naive)
    holding_nothing(monkeypatch)
    monkeypatch.setattr(bench, "peak_memory_bytes", lambda fn, device: 2**20 * (8 if fn.variant == "naive" else 1))
    run = _bench()
    run.group("layer", "fwd", 64)
    rows = {r["variant"]: r for r in run.rows}
    assert rows["naive"]["note"].startswith("failed: out of memory while timing")
    assert rows["sdpa"]["time_ms_median"] > 0 and rows["learned"]["time_ms_median"] > 0


@pytest.mark.parametrize("capability, dtype", [((7, 0), torch.float16), ((8, 0), torch.bfloat16)])
def test_the_bench_times_bf16_only_where_the_gpu_computes_it(monkeypatch, capability, dtype):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert bench._auto_dtype(torch.device("cuda", 0)) == dtype and bench._auto_dtype(CPU) == torch.float32


@pytest.mark.slow  # ~25 s on 2 shared cores: every kind probed and timed at 2 levels × 2 modes
def test_every_attention_kind_runs_in_the_bench_with_ratios_against_sdpa():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    kinds = ["sparse", "local", "lsh", "performer", "nystrom"]
    args = parser.parse_args([*TINY, "--variants", ",".join(kinds)])
    run = bench.Bench(
        args, cases.Shape(32, 2, 2, 64, 50, 1, torch.float32, CPU), peak_flops=1e9, peak_shape=(64, 32, 32)
    )
    for level in ("layer", "model"):
        for mode in ("fwd", "fwdbwd"):
            run.group(level, mode, 32)
    rows = {(r["level"], r["mode"], r["variant"]): r for r in run.rows}
    for level in ("layer", "model"):
        for mode in ("fwd", "fwdbwd"):
            for kind in kinds:
                row = rows[(level, mode, kind)]
                assert row.get("note") is None, row["note"]
                assert row["speedup_vs_sdpa"] > 0 and row["gflop"] > 0 and row["efficiency"] > 0


def test_unknown_variant_is_a_one_line_error(capsys):
    assert cli.main(["bench", "--variants", "learned,bigbird"]) == 2
    assert "--variants: bigbird not allowed" in capsys.readouterr().err


# ------------------------------------------------------------------------------ what is compared
def _with_random_biases(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()  # a non-zero bias exercises the (E m) bᵀ term of compress_first
    return model.eval()


def test_the_benchs_tables_of_kinds_name_registered_kinds_and_their_own_variants():
    """``variants.py`` keys its tables by kind: each key is a registered kind, each variant a config of that kind,
    and each library race one of its kind's variants."""
    for kind, offered in variants.BENCH_VARIANTS.items():
        assert kind in ATTENTION_KINDS
        assert {att["kind"] for att in offered(8, 64).values()} == {kind}
    for kind, reference in variants.REFERENCES.items():
        assert reference.variant in variants.BENCH_VARIANTS[kind](8, 64)
        assert reference.attention(64, 8)["kind"] == kind


@pytest.mark.parametrize("variant", list(cases.VARIANTS))
def test_every_variant_fast_order_equals_its_reference_order(variant):
    """The default order (auto: the fastest exact one) and, where it applies, ``compress_first`` give the same
    outputs as Eq. 7 evaluated as written (``project_first``), with and without padding."""
    models = {}
    for order in ("project_first", "auto", "compress_first"):
        torch.manual_seed(0)
        try:
            models[order] = _with_random_biases(
                TransformerEncoder(cases.model_config("model", variant, 4, order, 16, SHAPE), SHAPE.vocab)
            )
        except ConfigError as err:
            assert order == "compress_first" and "order: 'compress_first'" in str(err)  # does not apply here
    ids = torch.randint(5, SHAPE.vocab, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[1, 11:] = False
    reference = models.pop("project_first")
    for model in models.values():
        torch.testing.assert_close(model(ids, mask), reference(ids, mask), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(ids), reference(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_naive_baseline_computes_the_same_attention_as_sdpa(causal):
    torch.manual_seed(0)
    sdpa = (
        TransformerEncoder(cases.model_config("layer", "sdpa", None, "-", 16, SHAPE, causal), SHAPE.vocab)
        .blocks[0]
        .attn
    )
    naive = cases.NaiveAttention(sdpa)
    x = torch.randn(2, 16, SHAPE.d_model)
    torch.testing.assert_close(naive(x), sdpa(x), atol=1e-5, rtol=1e-5)
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[0, 9:] = False
    torch.testing.assert_close(naive(x, mask), sdpa(x, mask), atol=1e-5, rtol=1e-5)


def test_flop_counts_follow_the_attention_formulas():
    """Layer forward, B·(8nd² + 4n²d) for full attention and B·(8nd² + 8nkd) for Eq. 7 as written:
    their ratio is (2d + n)/(2d + 2k), the speed-up a FLOP-bound Linformer can reach."""
    n, k, d, b = 64, 8, SHAPE.d_model, SHAPE.batch
    for variant, expected in (
        ("sdpa", 8 * n * d * d + 4 * n * n * d),
        ("naive", 8 * n * d * d + 4 * n * n * d),
        ("learned", 8 * n * d * d + 8 * n * k * d),
    ):
        case = cases.build("layer", "fwd", variant, k, "project_first", n, SHAPE)
        assert count_flops(case.run)[0] == b * expected, variant
    causal = cases.build("layer", "fwd", "sdpa", None, "-", n, SHAPE, causal=True)
    assert count_flops(causal.run)[0] == b * (8 * n * d * d + 2 * n * n * d)  # the kernel skips the upper half


def _cuda_attention_calls(causal: bool) -> dict:
    """Each CUDA attention kernel's aten op with positional arguments as its schema orders them (meta tensors:
    only shapes matter): q, k, v (B=2, h=4, T=64, d_h=16) and, for a backward, grad_out and out alike."""
    aten = torch.ops.aten
    t = torch.empty(2, 4, 64, 16, device="meta")
    lse, none = torch.empty(2, 4, 64, device="meta"), torch.empty(0, device="meta")
    return {
        aten._scaled_dot_product_flash_attention: (t, t, t, 0.0, causal),
        aten._scaled_dot_product_efficient_attention: (t, t, t, None, False, 0.0, causal),
        aten._scaled_dot_product_cudnn_attention: (t, t, t, None, False, 0.0, causal),
        aten._scaled_dot_product_flash_attention_backward: (
            t,
            t,
            t,
            t,
            t,
            lse,
            none,
            none,
            64,
            64,
            0.0,
            causal,
            none,
            none,
        ),
        aten._scaled_dot_product_efficient_attention_backward: (
            t,
            t,
            t,
            t,
            none,
            t,
            lse,
            none,
            none,
            0.0,
            [True] * 4,
            causal,
        ),
        aten._scaled_dot_product_cudnn_attention_backward: (
            t,
            t,
            t,
            t,
            t,
            lse,
            none,
            none,
            none,
            none,
            none,
            64,
            64,
            0.0,
            causal,
        ),
    }


def test_causal_flops_of_the_cuda_attention_kernels_are_halved_like_the_cpu_one():
    """Flash, memory-efficient and cuDNN attention skip the blocks above the diagonal under is_causal, as the
    CPU flash kernel does: their counts halve too (torch's own formulas ignore is_causal)."""
    from torch.utils.flop_counter import flop_registry

    forward = 4 * 2 * 4 * 64 * 64 * 16  # Q Kᵀ and P V
    for (op, causal_args), full_args in zip(_cuda_attention_calls(True).items(), _cuda_attention_calls(False).values()):
        full = flop_registry[op](*full_args)
        assert full == (forward if "backward" not in str(op) else forward * 5 // 2), op
        assert flop_registry[op](*causal_args) == full // 2, op
        assert flop_registry[op](*full_args[:-1], is_causal=True) == full // 2, op  # passed by keyword


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


# ------------------------------------------------------------------------------ report helpers
def test_fitted_slope_recovers_the_exponent():
    ns = [512, 1024, 2048, 4096]
    assert report.fitted_slope(ns, [3e-9 * n**2 for n in ns]) == pytest.approx(2.0)
    assert report.fitted_slope(ns, [0.5 * n for n in ns]) == pytest.approx(1.0)
    assert report.fitted_slope([512], [1.0]) is None


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


def test_library_race_is_its_own_level_written_beside_the_bench_tables(tmp_path):
    pytest.importorskip("local_attention")
    pytest.importorskip("nystrom_attention")
    assert (
        cli.main(["bench", *TINY, "--levels", "libraries", "--variants", "local,nystrom", "--out", str(tmp_path)]) == 0
    )
    (out,) = tmp_path.iterdir()
    table = (out / "libraries.md").read_text()
    assert "library time ÷ project time" in table
    assert list(csv.DictReader((out / "libraries.csv").open()))[0]["variant"] in ("local", "nystrom")


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


def test_sparse_block_keeps_its_block_as_n_grows_while_sparse_grows_it_as_root_n():
    """``sparse_block`` measures the fixed pattern at one block (its pairs then grow as n·(k + n/k)); ``sparse``
    follows Child et al.'s l = √n."""
    blocks = {n: cases.VARIANTS["sparse_block"](128, n)["options"]["block"] for n in (4096, 16384)}
    assert blocks == {4096: 128, 16384: 128}
    assert [cases.VARIANTS["sparse"](128, n)["options"]["block"] for n in (4096, 16384)] == [64, 128]
