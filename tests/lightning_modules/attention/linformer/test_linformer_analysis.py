"""What Linformer's E/F learned (lightning_modules/attention/linformer/analysis.py), on matrices of known structure:
locality, smoothness, alignment with the attention subspace, the distinct projections of each sharing mode, the
operator the bank applies, and the projection report."""

import math

import pytest
import torch
from tiny import rank_r_stochastic

from lightning_modules.attention.linformer import analysis as ef
from lightning_modules.attention.linformer.projections import ProjectionBank


def pooling(k: int, n: int) -> torch.Tensor:
    w = n // k
    return torch.kron(torch.eye(k, dtype=torch.float64), torch.full((1, w), 1.0 / w, dtype=torch.float64))


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
