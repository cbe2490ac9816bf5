"""``linformer-lab analyze`` (experiments/analyze.py) and the spectrum callback end to end on tiny trained runs, for
every registered kind."""

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny import run_of

from experiments import cli
from lightning_modules.attention import ATTENTION_KINDS
from lightning_modules.attention.linformer import layer_ks
from training import config as run_config


# ------------------------------------------------------------------------------ end to end
def _events(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    return acc


def _train(t, *overrides):
    assert cli.main(["train", str(t.config), *t.args, *overrides]) == 0


def test_callback_logs_spectrum_heatmaps_and_analyze_writes_figures(tiny_overrides, tmp_path, capsys):
    """Two tiny runs (training is most of this test's time): full attention with the spectrum
    callback on, and a Linformer analysed against it."""
    _train(tiny_overrides, "experiment=full", "model.attention.kind=full", "trainer.spectrum_every_n_val=1")
    _train(tiny_overrides, "experiment=linformer")
    full, linformer = (run_of(tmp_path / "runs" / name) for name in ("full", "linformer"))

    # The callback: a heatmap image and an effective rank per layer at every validation (steps 3, 6).
    acc = _events(full)
    assert [e.step for e in acc.Images("spectrum/heatmap")] == [3, 6]
    assert [e.step for e in acc.Scalars("spectrum/effective_rank/layer_1")] == [3, 6]

    # Full attention: Fig. 1 and a suggested k schedule that loads as a config layer.
    assert cli.main(["analyze", str(full), "--samples", "6"]) == 0
    assert "suggested model.attention.options.k" in capsys.readouterr().out
    summary = json.loads((full / "analysis" / "summary.json").read_text())
    assert summary["samples"] == 6 and summary["global_step"] == 6
    assert summary["suggested_k"] == [max(r) for r in summary["spectrum"]["effective_rank_per_head"]]
    assert all(1 <= k <= 32 for k in summary["suggested_k"])
    experiment = tmp_path / "suggested.yaml"
    # (quoted: the run's folder name, made of its overrides, holds commas)
    experiment.write_text(f"defaults: ['{tiny_overrides.config}', '{full / 'analysis' / 'k_schedule.yaml'}']\n")
    assert layer_ks(run_config.load(experiment).model) == summary["suggested_k"]
    assert {"analysis/spectrum_cumulative", "analysis/spectrum_heatmap"} <= set(_events(full).Tags()["images"])

    # Linformer (given by its checkpoint): spectrum and E/F figures, E/F set against the full run's P.
    ckpt = linformer / "checkpoints" / "last.ckpt"
    assert cli.main(["analyze", str(ckpt), "--samples", "4", "--reference", str(full)]) == 0
    assert "layer1/F/head1" in capsys.readouterr().out
    out = linformer / "analysis"
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["projections"]) == 8  # 2 layers × E, F × 2 heads
    for entry in summary["projections"].values():
        assert entry["shape"] == [1, 8, 32]
        for metrics in (entry["model"], entry["gaussian"]):
            assert 0.0 <= metrics["attention_alignment"] <= 1.0 and 0.0 <= metrics["locality"] <= 1.0
    figures = {
        "spectrum_cumulative",
        "spectrum_heatmap",
        "projections_layer0",
        "projections_layer1",
        "projection_metrics",
    }
    assert {f"{name}.png" for name in figures} == set(summary["figures"])
    assert all((out / f"{name}.png").stat().st_size > 0 for name in figures)
    assert {f"analysis/{name}" for name in figures} <= set(_events(linformer).Tags()["images"])

    # A reference must be a full-attention run; a run directory must hold a checkpoint.
    assert cli.main(["analyze", str(linformer), "--reference", str(linformer)]) == 2
    assert cli.main(["analyze", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("error: ") == 2
    index_is_read_where_asked_or_refused(linformer, capsys)


def index_is_read_where_asked_or_refused(linformer, capsys):
    """--index reads every layer's curve where it is asked, or is refused in one line naming the range, nothing
    written: Linformer's P (k = 8, n = 32) has 8 singular values per layer, no matrix more than n."""
    out = linformer / "analysis"
    assert cli.main(["analyze", str(linformer), "--samples", "2", "--index", "8"]) == 0
    assert json.loads((out / "summary.json").read_text())["spectrum"]["index"] == [8, 8]
    before = (out / "summary.json").read_bytes()
    for index, allowed in (("9", "(layer 0: 8, layer 1: 8); allowed: 1 to 8"), ("33", "allowed: 1 to 32")):
        capsys.readouterr()
        assert cli.main(["analyze", str(linformer), "--samples", "2", "--index", index]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --index: {index} is past") and err.endswith(allowed) and "\n" not in err, err
    assert (out / "summary.json").read_bytes() == before


def test_the_spectrum_callback_follows_a_causal_linformer_during_training(tiny_overrides, tmp_path):
    _train(
        tiny_overrides,
        "experiment=causal",
        "task=clm",
        "model.attention.causal=true",
        "model.attention.kind=linformer",
        "trainer.spectrum_every_n_val=1",
    )
    acc = _events(run_of(tmp_path / "runs" / "causal"))
    ranks = acc.Scalars("spectrum/effective_rank/layer_0")
    assert [e.step for e in ranks] == [3, 6] and all(1 <= e.value <= 32 for e in ranks)


KIND_RUNS = {  # every registered kind, with options that fit the tiny model (n = 32)
    "full": [],
    "linformer": [],
    "local": ["model.attention.options.window=8"],
    "sparse": ["model.attention.options.block=4"],
    "lsh": ["model.attention.options.bucket_size=8"],
    "performer": ["model.attention.options.n_features=8"],
    "nystrom": ["model.attention.options.n_landmarks=8"],
    "no_context": [],
}


@pytest.mark.parametrize("kind", KIND_RUNS)
def test_analyze_shows_every_kind_or_says_in_one_line_what_it_cannot_show(kind, tiny_overrides, tmp_path, capsys):
    _train(tiny_overrides, f"model.attention.kind={kind}", *KIND_RUNS[kind], "trainer.max_steps=3")
    run = run_of(tmp_path / "runs" / "tiny")
    code = cli.main(["analyze", str(run), "--samples", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    if code == 0:
        assert (run / "analysis" / "summary.json").is_file()
    else:
        assert code == 2 and not (run / "analysis").exists()
        assert err[-1].startswith(f"error: analyze {run}: kind {kind!r} forms no softmax matrix")
        assert err[-1].endswith("the attention spectrum cannot be shown")


def test_every_registered_kind_is_covered_by_the_analyze_test():
    assert set(KIND_RUNS) == set(ATTENTION_KINDS)
