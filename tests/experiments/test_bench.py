"""``linformer-lab bench`` (experiments/bench.py) end to end: every output with its columns, cases that would not
fit or that run out of memory, bf16 only where the GPU computes it, every attention kind against SDPA, and the race
against the libraries as a level of its own."""

import argparse
import csv
import re

import pytest
import torch

from experiments import bench, cli
from experiments.benchmarks import cases, report

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


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def fake_cuda(monkeypatch) -> None:
    """torch sees one GPU with 80 GiB free (nothing is allocated on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * 2**30, 80 * 2**30))


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_on_a_gpu_the_bench_defaults_to_the_papers_batch_and_width_and_says_so(monkeypatch, tmp_path, device):
    fake_cuda(monkeypatch)
    args = parsed("--device", device, "--out", str(tmp_path))
    bench._check(args)
    assert (args.batch, args.d_model, args.heads, args.d_ff) == (16, 512, 8, 2048)
    assert args.shape_note.startswith("GPU defaults, the paper's batch and width: batch 16, d model 512, heads 8")
    given = parsed("--device", device, "--batch", "4", "--d-model", "256", "--heads", "4", "--out", str(tmp_path))
    bench._check(given)
    assert (given.batch, given.d_model, given.heads, given.d_ff) == (4, 256, 4, 2048)
    assert "d ff 2048" in given.shape_note and "batch" not in given.shape_note.split(":")[1].split("(")[0]


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_on_a_cpu_the_bench_defaults_are_unchanged_and_unannounced(tmp_path, device):
    if device == "auto" and torch.cuda.is_available():
        pytest.skip("auto is the GPU here")
    args = parsed("--device", device, "--out", str(tmp_path))
    bench._check(args)
    assert (args.batch, args.d_model, args.heads, args.d_ff, args.shape_note) == (1, 256, 4, 1024, None)


def test_a_gpu_run_names_its_default_shape_in_its_table_and_console(monkeypatch, tmp_path, capsys):
    """CUDA faked for the checks, the cases run on the CPU: the batch not given is the GPU's, and the run says so."""
    fake_cuda(monkeypatch)
    monkeypatch.setattr(bench, "_device", lambda name: CPU)
    monkeypatch.setattr(bench, "_auto_dtype", lambda device: torch.float32)
    argv = ["bench", *TINY, "--device", "cuda", "--n", "32", "--variants", "kv", "--levels", "layer", "--mode", "fwd"]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 0
    note = "GPU defaults, the paper's batch and width: batch 16 (--batch, --d-model, --heads, --d-ff to change)"
    assert f"shape: {note}" in capsys.readouterr().out
    (out,) = tmp_path.iterdir()
    assert note in (out / "table.md").read_text()
    assert {r["batch"] for r in csv.DictReader((out / "results.csv").open())} == {"16"}


def test_engines_are_timed_beside_each_other_in_the_same_rounds(tmp_path):
    """Linformer's fused engine (what auto runs, but for the causal form on a CPU) and its reference in one run: rows, table sections and curves of
    their own; the kind costs the study reports read keep the default engine's."""
    argv = [*TINY, "--variants", "learned,causal", "--engines", "reference,fused", "--levels", "layer", "--mode", "fwd"]
    assert cli.main(["bench", *argv, "--out", str(tmp_path)]) == 0
    (out,) = tmp_path.iterdir()
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert not [r for r in rows if r["note"]]
    timed = {(r["variant"], r["engine"], int(r["n"])) for r in rows}
    for variant in ("learned", "causal"):
        assert {(variant, e, n) for e in ("reference", "fused") for n in (32, 64)} <= timed
    assert {r["engine"] for r in rows if r["variant"] in cases.BASELINES} == {"auto"}
    table = (out / "table.md").read_text()
    assert "### layer · forward (inference mode) · causal engine=fused" in table
    assert "### layer · forward (inference mode) · learned engine=reference" in table


def test_profile_writes_each_cases_operators_where_the_two_engines_differ(tmp_path):
    """``--profile``: one operator table per timed case and n, named by the case; Linformer's reference engine
    multiplies a copy of E per sequence (batched products) where the fused engine makes one product per side."""
    argv = [*TINY, "--n", "32", "--variants", "learned", "--orders", "project_first", "--engines", "reference,fused"]
    assert cli.main(["bench", *argv, "--levels", "layer", "--mode", "fwdbwd", "--profile", "--out", str(tmp_path)]) == 0
    (out,) = tmp_path.iterdir()
    profiles = {p.name: p.read_text() for p in (out / "profiles").iterdir()}
    assert set(profiles) == {
        "layer_fwdbwd_n32_sdpa_kNone_-_auto.txt",
        "layer_fwdbwd_n32_naive_kNone_-_auto.txt",
        "layer_fwdbwd_n32_learned_k8_project_first_reference.txt",
        "layer_fwdbwd_n32_learned_k8_project_first_fused.txt",
    }
    for text in profiles.values():
        assert "operators by self cpu time" in text and "Self CPU" in text and "aten::" in text

    def per_call(text: str, op: str) -> float:
        """The operator's calls per timed call of the case (the header says how many were profiled)."""
        row = next(line for line in text.splitlines() if line.strip().startswith(op + " "))
        timed = int(re.search(r": (\d+) call\(s\)", text.splitlines()[0]).group(1))
        return int(row.split()[-1]) / timed

    reference, fused = (profiles[f"layer_fwdbwd_n32_learned_k8_project_first_{e}.txt"] for e in ("reference", "fused"))
    assert per_call(reference, "aten::bmm") > per_call(fused, "aten::bmm")


def test_an_engine_no_chosen_variant_offers_is_a_one_line_error(capsys):
    assert cli.main(["bench", "--variants", "learned,local", "--engines", "auto,compiled,turbo"]) == 2
    err = capsys.readouterr().err
    assert "--engines: turbo not allowed for --variants learned,local (choose from auto," in err
    assert err.count("\n") == 1


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


def test_a_library_that_fails_is_a_noted_row_and_the_race_goes_on(tmp_path, monkeypatch):
    """On a GPU the race runs in bfloat16, where nystrom-attention's pseudo-inverse mixes in a float32 identity and
    raises: that pair's row says so (the bench's own cases are noted the same way) and the other pairs are raced."""
    pytest.importorskip("local_attention")
    pytest.importorskip("nystrom_attention")
    from experiments.benchmarks import libraries

    build = libraries.build

    def failing(variant, *args):
        if variant == "nystrom":
            raise RuntimeError("expected scalar type Float but found BFloat16\nsecond line")
        return build(variant, *args)

    monkeypatch.setattr(libraries, "build", failing)
    shape = cases.Shape(32, 2, 2, 64, 50, 1, torch.float32, CPU)
    rows = libraries.race(["nystrom", "local"], 32, 8, "fwd", shape, repeats=2, min_time=0.001)
    assert [r["variant"] for r in rows] == ["nystrom", "local"]
    assert rows[0]["note"] == "failed: RuntimeError: expected scalar type Float but found BFloat16"
    assert rows[0]["ratio"] is None and list(rows[0]) == list(rows[1])  # the CSV's columns whichever row is first
    assert rows[1]["note"] is None and rows[1]["ratio"] > 0
    table = libraries.markdown(rows, [])
    assert "| nystrom | nystrom-attention | 32 | fwd | – | – | failed: RuntimeError: expected scalar type" in table
