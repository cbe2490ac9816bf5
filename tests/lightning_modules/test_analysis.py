"""What attention learned (lightning_modules/analysis.py), on matrices of known structure: the spectrum of
context-mapping matrices, its effective rank and suggested k, and the probabilities a layer is recorded attending with."""

import pytest
import tiny
import torch
import torch.nn.functional as F
from tiny import rank_r_stochastic

from lightning_modules import analysis
from lightning_modules.attention import build_attention
from lightning_modules.attention.linformer.projections import ProjectionBank
from lightning_modules.encoder import TransformerEncoder
from training import config as run_config


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
