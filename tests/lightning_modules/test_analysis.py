"""The analysis maths on matrices of known structure; `linformer-lab analyze` and the spectrum callback
end to end on tiny trained runs."""

import json
import math

import pytest
import tiny
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments import cli
from lightning_modules import analysis
from lightning_modules.attention import ATTENTION_KINDS, build_attention
from lightning_modules.attention.linformer import analysis as ef
from lightning_modules.attention.linformer import layer_ks
from lightning_modules.attention.linformer.projections import ProjectionBank
from lightning_modules.encoder import TransformerEncoder
from training import config as run_config


def rank_r_stochastic(n: int, r: int, seed: int = 0) -> torch.Tensor:
    """A row-stochastic n×n matrix of rank r: rows are mixtures of r probability vectors."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(n, r, generator=g, dtype=torch.float64).softmax(-1)
    bases = torch.randn(r, n, generator=g, dtype=torch.float64).softmax(-1)
    return mix @ bases


def pooling(k: int, n: int) -> torch.Tensor:
    w = n // k
    return torch.kron(torch.eye(k, dtype=torch.float64), torch.full((1, w), 1.0 / w, dtype=torch.float64))


# ------------------------------------------------------------------------------ spectrum
def test_rank_r_context_matrix_has_r_nonzero_singular_values():
    n, r = 32, 5
    p = rank_r_stochastic(n, r)
    assert torch.allclose(p.sum(-1), torch.ones(n, dtype=torch.float64))
    sv = torch.linalg.svdvals(p)
    assert int((sv > 1e-10 * sv[0]).sum()) == r
    curve = analysis.cumulative_share(sv)
    assert curve[r - 1] == pytest.approx(1.0, abs=1e-9)
    assert int(analysis.effective_rank(curve, 1.0)) == r
    assert int(analysis.effective_rank(curve, 0.5)) < r


def test_effective_rank_is_the_smallest_index_reaching_the_energy():
    n = 20
    curve = analysis.cumulative_share(torch.ones(n, dtype=torch.float64))  # identity P: c_i = i / n
    assert torch.allclose(curve, torch.arange(1, n + 1, dtype=torch.float64) / n)
    assert int(analysis.effective_rank(curve, 0.9)) == 18
    assert int(analysis.effective_rank(curve, 0.91)) == 19
    assert int(analysis.effective_rank(curve, 1.0)) == n
    with pytest.raises(ValueError):
        analysis.effective_rank(curve, 0.0)


def test_suggested_k_keeps_the_energy_of_every_head():
    m = 8

    def flat(r):  # rank r, equal σ
        return torch.cat([torch.ones(r), torch.zeros(m - r)]).double()

    sv = torch.stack([torch.stack([flat(2), flat(6)])] * 3)  # (N=3, h=2, m)
    spectrum = analysis.Spectrum([sv, sv[:, :, :4]])
    assert spectrum.head_effective_ranks(1.0) == [[2, 6], [2, 4]]
    assert spectrum.suggested_ks(1.0) == [6, 4]
    # The layer curve averages heads: at index 2 it is (1 + 2/6) / 2.
    assert spectrum.layer_curves[0][1].item() == pytest.approx((1 + 2 / 6) / 2)
    assert torch.allclose(spectrum.at_index([2, 9]), torch.tensor([[1.0, 2 / 6], [1.0, 1.0]], dtype=torch.float64))


def test_heatmap_reads_each_layer_at_its_k_or_half_a_compressed_spectrum():
    cfg = run_config.load(None, ["model.n_layers=2", "model.attention.options.k=[8,4]", "model.max_len=32"]).model
    full = analysis.Spectrum([torch.ones(1, 1, 32).double()] * 2)
    compressed = analysis.Spectrum([torch.ones(1, 1, 8).double(), torch.ones(1, 1, 4).double()])
    assert analysis.heatmap_indices(cfg, full) == [8, 4]
    assert analysis.heatmap_indices(cfg, compressed) == [4, 2]
    full_cfg = run_config.load(None, ["model.n_layers=2", "model.attention.kind=full", "model.max_len=32"]).model
    assert analysis.heatmap_indices(full_cfg, full) == [8, 8]  # no compressed length: n/4


# ------------------------------------------------------------------------------ projections
def test_pooling_projection_is_maximally_local_and_smooth():
    k, n = 8, 128
    e = pooling(k, n)
    w = n // k
    assert torch.allclose(ef.locality(e), torch.ones(k, dtype=torch.float64))
    assert torch.allclose(ef.spread(e), torch.full((k,), math.sqrt((w * w - 1) / 12), dtype=torch.float64))
    assert ef.smoothness(e).min() > 0.95
    for metric in (ef.locality, ef.spread, ef.smoothness):  # leading dims are batch dims
        assert torch.equal(metric(torch.stack([e, -e])), torch.stack([metric(e)] * 2))
    assert ef.subspace_alignment(e, ef.dct_matrix(n)[:k]) > 0.75
    # The bank's parameter-free pool projection is exactly this matrix.
    (entry,) = ef.distinct_projections(ProjectionBank([k], n, 2, projection="pool"))
    assert entry.name == "layer0/E=F" and torch.allclose(entry.matrix[0], e)


def test_random_projection_is_neither_local_nor_smooth():
    k, n = 8, 128
    e = torch.randn(k, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert ef.locality(e).mean() < 0.25  # ≈ 1/k of the mass near μ
    assert ef.smoothness(e).mean() == pytest.approx(0.5, abs=0.1)  # white: half the energy is low
    assert ef.subspace_alignment(e, ef.dct_matrix(n)[:k]) == pytest.approx(k / n, abs=0.06)


def test_smoothness_runs_from_high_frequency_to_constant_rows():
    n = 16
    d = ef.dct_matrix(n)
    rows = torch.stack([torch.ones(n).double(), d[n // 2] + d[n - 1], (-1.0) ** torch.arange(n).double()])
    assert torch.allclose(ef.smoothness(rows)[:2], torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-12)
    assert ef.smoothness(rows)[2] < 0.05  # alternating signs: almost all high


def test_alignment_is_one_within_a_subspace_and_zero_across_orthogonal_ones():
    n, k = 32, 6
    d = ef.dct_matrix(n)
    assert torch.allclose(d @ d.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
    mixed = torch.randn(k, k, generator=torch.Generator().manual_seed(1), dtype=torch.float64) @ d[:k]
    assert ef.subspace_alignment(mixed, d[:k]) == pytest.approx(1.0, abs=1e-9)
    assert ef.subspace_alignment(d[:k], d[k : 2 * k]) == pytest.approx(0.0, abs=1e-9)
    assert torch.allclose(ef.principal_cosines(d[:2], d[1:3]), torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-9)


def test_attention_subspace_is_the_row_space_that_P_reads():
    n, r = 24, 4
    p = rank_r_stochastic(n, r, seed=3)
    basis = ef.attention_subspace(p.T @ p, r)
    assert basis.shape == (r, n)
    assert ef.subspace_alignment(basis, p) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize(
    "share, names",
    [
        ("none", ["layer0/E/head0", "layer0/E/head1", "layer0/F/head0", "layer0/F/head1"]),
        ("headwise", ["layer0/E", "layer0/F"]),
        ("kv", ["layer0/E=F"]),
        ("layerwise", None),
    ],
)
def test_distinct_projections_follow_the_sharing_mode(share, names):
    bank = ProjectionBank([4, 6], 16, 2, share=share)
    entries = ef.distinct_projections(bank)
    if share == "layerwise":
        assert [(p.name, p.layers, tuple(p.matrix.shape)) for p in entries] == [("all/E=F", (0, 1), (1, 6, 16))]
        return
    assert [p.name for p in entries] == names + [n.replace("layer0", "layer1") for n in names]
    for p in entries:
        layer = p.layers[0]
        e, f = bank.matrices(layer, 16)
        side = f if "/F" in p.name else e
        head = int(p.name[-1]) if "head" in p.name else 0
        assert torch.allclose(p.matrix[0], side[head].double())


@pytest.mark.parametrize(
    "projection, causal", [("learned", False), ("conv", False), ("pool", False), ("learned", True), ("conv", True)]
)
def test_dense_form_is_the_operator_the_bank_applies(projection, causal):
    n, heads, d_head = 16, 2, 3
    bank = ProjectionBank([4, 4], n, heads, projection=projection, causal=causal, d_head=d_head)
    length = bank.slots(1) * bank.window(1) if causal else n
    x = torch.randn(2, heads, length, d_head)
    for side in range(bank.sides):
        e = ef.projection_operator(bank, 1, side)  # (G, C, k', n)
        assert e.shape[-1] == n and not e[..., length:].any()
        expected = bank.compress(1, side, x).double()  # (B, h, k', d_h)
        e = e[..., :length].expand(heads, d_head, -1, -1)  # G ∈ {1, h}, C ∈ {1, d_h}
        got = torch.einsum("hcjt,bhtc->bhjc", e, x.double())
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    if causal:  # slot j sees block j only
        w = bank.window(1)
        for j, row in enumerate(ef.projection_operator(bank, 1, 0)[0, 0]):
            assert not row[: j * w].any() and not row[(j + 1) * w :].any()


def test_projection_report_sets_each_matrix_beside_a_gaussian_of_its_shape():
    k, n = 4, 16
    projections = [ef.Projection("pool", (0,), pooling(k, n)[None])]
    grams = [rank_r_stochastic(n, k).T @ rank_r_stochastic(n, k)]  # a full model's Σ PᵀP, one layer
    entry = ef.projection_report(projections, grams)["pool"]
    assert entry["shape"] == [1, k, n] and entry["layers"] == [0]
    assert entry["model"]["locality"] == pytest.approx(1.0) and entry["model"]["smoothness"] > 0.9
    assert (
        set(entry["model"])
        == set(entry["gaussian"])
        == {"locality", "spread", "smoothness", "fourier_alignment", "attention_alignment"}
    )
    assert entry["gaussian"]["locality"] < 0.6


# ------------------------------------------------------------------------------ capture
VARIANTS = {
    "full": {"kind": "full"},
    "full-causal": {"kind": "full", "causal": True},
    "linformer": {"kind": "linformer", "k": 4},
    "linformer-conv": {"kind": "linformer", "k": 4, "projection": "conv"},
    "linformer-key-only": {"kind": "linformer", "k": 4, "compress": "keys"},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_recorded_probabilities_are_the_ones_the_layer_attends_with(variant):
    att = VARIANTS[variant]
    cfg = tiny.model(tiny.attention(**att))
    torch.manual_seed(0)
    encoder = TransformerEncoder(cfg, 40).eval()
    ids = torch.randint(5, 40, (3, 16))
    mask = torch.ones(3, 16, dtype=torch.bool)
    mask[1, 11:] = False
    original = F.scaled_dot_product_attention
    with torch.no_grad():
        expected = encoder(ids, mask)
        with analysis.recorded_attention(encoder) as records:
            got = encoder(ids, mask)
    assert F.scaled_dot_product_attention is original
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    compressed = att["kind"] == "linformer" and att.get("compress", "both") == "both"
    for (p,) in records:
        assert p.shape == (3, 2, 16, 4 if compressed else 16)
        assert torch.allclose(p.sum(-1), torch.ones(3, 2, 16))
        if not compressed:
            assert p[1, :, :, 11:].abs().max() == 0  # padded keys get no weight
        if att.get("causal"):
            assert torch.equal(p, p.tril())


@pytest.mark.parametrize("projection, h", [("learned", 2), ("pool", 4)])  # SDPA rows of 2 blocks; of 1
def test_causal_linformer_context_matrix_is_causal_row_stochastic_and_is_the_layer(projection, h):
    """P̃ over [slots ; positions]: a real query's row sums to 1 and weights only the slots of earlier
    blocks and the positions of its own block up to itself (never padding or an empty slot), and
    P̃ [F-slots ; V] is the layer's output."""
    t, w, nb, d = 14, 4, 4, 8  # blocks 4, 4, 4, 2; 3 slots
    torch.manual_seed(0)
    layer = build_attention(
        {
            "max_len": t,
            "d_model": d,
            "n_heads": h,
            "attention": tiny.attention("linformer", causal=True, k=4, projection=projection),
        },
        shared=ProjectionBank([4], t, h, projection=projection, causal=True),
    ).eval()
    x = torch.randn(3, t, d)
    mask = torch.ones(3, t, dtype=torch.bool)
    mask[1, 10:] = False  # right padding
    mask[2, :5] = False  # left: block 0 (slot 0) all padding
    p = analysis.attention_maps(layer, x, mask)[0]
    assert p.shape == (3, h, t, nb - 1 + t)
    torch.testing.assert_close(p.sum(-1), mask[:, None, :].float().expand(3, h, t))  # padded queries: zeroed
    i, block = torch.arange(t)[:, None], torch.arange(t)[:, None] // w
    slots = torch.arange(nb - 1)[None, :] < block  # j < b
    own = (torch.arange(t)[None, :] >= block * w) & (torch.arange(t)[None, :] <= i)
    assert not p[..., ~torch.cat([slots, own], -1)].any()
    assert not p[1, ..., nb - 1 + 10 :].any()  # padded keys
    assert not p[2, ..., 0].any() and not p[2, ..., nb - 1 : nb - 1 + 5].any()  # empty slot, padded keys
    assert (p[0, ..., : nb - 1] > 0).sum() == h * w * (0 + 1 + 2) + h * 2 * 3  # every visible slot is weighted

    with torch.no_grad():
        v = layer.v_proj(x).view(3, t, h, d // h).transpose(1, 2)  # (B, h, T, d_h)
        slot_v = layer.bank.compress(0, 1, v[:, :, : (nb - 1) * w], mask[:, : (nb - 1) * w])
        heads = p @ torch.cat([slot_v, v], 2)  # (B, h, T, d_h)
        got = layer.out_proj(heads.transpose(1, 2).reshape(3, t, d))
        expected = layer(x, mask)
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-5)


def test_causal_linformer_spectrum_has_one_singular_value_per_position():
    cfg = tiny.model(tiny.attention("linformer", causal=True, k=4))
    torch.manual_seed(0)
    mask = torch.ones(3, 16, dtype=torch.bool)
    mask[1, :6] = False  # an all-padding prefix stays finite
    batch = {"input_ids": torch.randint(5, 40, (3, 16)), "attention_mask": mask}
    spectrum = analysis.measure_spectrum(TransformerEncoder(cfg, 40), [batch])
    assert [tuple(s.shape) for s in spectrum.singular_values] == [(3, 2, 16)] * 2
    assert all(torch.isfinite(s).all() for s in spectrum.singular_values)
    assert analysis.heatmap_indices(cfg, spectrum) == [4, 4]


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
    full, linformer = (tmp_path / "runs" / name / "version_0" for name in ("full", "linformer"))

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
    experiment.write_text(f"defaults: [{tiny_overrides.config}, {full / 'analysis' / 'k_schedule.yaml'}]\n")
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


def test_the_spectrum_callback_follows_a_causal_linformer_during_training(tiny_overrides, tmp_path):
    _train(
        tiny_overrides,
        "experiment=causal",
        "task=clm",
        "model.attention.causal=true",
        "model.attention.kind=linformer",
        "trainer.spectrum_every_n_val=1",
    )
    acc = _events(tmp_path / "runs" / "causal" / "version_0")
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
    run = tmp_path / "runs" / "tiny" / "version_0"
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
