"""The attention maths: Linformer's limits, padding, lengths, sharing counts and exact paths."""

import math

import pytest
import tiny
import torch

from lightning_modules.attention.linformer.projections import ProjectionBank
from lightning_modules.encoder import TransformerEncoder, count_parameters

D, H, N = 32, 4, 16


def _pair(k=N, share="none", order="project_first", groups_identity=True):
    """A full-attention layer and a Linformer layer with the same Q/K/V/O weights."""
    torch.manual_seed(0)
    full = tiny.layer(tiny.attention("full"), N, D, H)
    bank = ProjectionBank([k], N, H, share)
    lin = tiny.layer(tiny.attention(k=k, share=share, order=order), N, D, H, shared=bank)
    lin.load_state_dict(full.state_dict())
    return full, lin, bank


@pytest.mark.parametrize("share", ["none", "headwise", "kv", "layerwise"])
@pytest.mark.parametrize("order", ["project_first", "compress_first"])
def test_identity_projection_with_k_equal_n_is_full_attention(share, order):
    full, lin, bank = _pair(share=share, order=order)
    with torch.no_grad():
        bank.weight_0.copy_(torch.eye(N).expand_as(bank.weight_0))
    x = torch.randn(3, N, D)
    torch.testing.assert_close(lin(x), full(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("share", ["none", "headwise", "kv", "layerwise"])
def test_compress_first_equals_project_first(share):
    _, projected, bank = _pair(k=5, share=share, order="project_first")
    first = tiny.layer(tiny.attention(k=5, share=share, order="compress_first"), N, D, H, shared=bank)
    first.load_state_dict(projected.state_dict())
    with torch.no_grad():
        for lin in (projected, first):
            for p in (lin.k_proj.bias, lin.v_proj.bias):
                p.normal_()  # a non-zero bias exercises the (E m) bᵀ term
        first.load_state_dict(projected.state_dict())
    x = torch.randn(2, 11, D)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 7:] = False
    torch.testing.assert_close(first(x, mask), projected(x, mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first(x), projected(x), atol=1e-5, rtol=1e-5)


def test_short_sequence_uses_first_columns_of_e():
    _, lin, bank = _pair(k=4, share="headwise")
    x = torch.randn(1, 6, D)
    e, f = bank.matrices(0, 6)
    assert e.shape == (1, 4, 6)
    torch.testing.assert_close(e, bank.weight_0[0, :, :, :6])
    assert lin(x).shape == (1, 6, D)


def test_longer_than_max_len_is_an_error():
    enc = TransformerEncoder(
        {"max_len": 8, "d_model": D, "n_heads": H, "n_layers": 1, "d_ff": 64, "attention": tiny.attention(k=4)},
        vocab_size=20,
    )
    with pytest.raises(ValueError, match="exceeds model.max_len=8"):
        enc(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    "share,expected",
    [
        ("none", lambda L, h, n, k: 2 * L * h * n * k),
        ("headwise", lambda L, h, n, k: 2 * L * n * k),
        ("kv", lambda L, h, n, k: L * n * k),
        ("layerwise", lambda L, h, n, k: n * k),
    ],
)
def test_projection_parameter_counts_match_the_paper(share, expected):
    L_, n, k = 3, 64, 16
    enc = TransformerEncoder(
        {
            "max_len": n,
            "d_model": D,
            "n_heads": H,
            "n_layers": L_,
            "d_ff": 64,
            "attention": tiny.attention(k=k, share=share),
        },
        vocab_size=20,
    )
    assert count_parameters(enc.shared) == expected(L_, H, n, k)
    full = TransformerEncoder(
        {"max_len": n, "d_model": D, "n_heads": H, "n_layers": L_, "d_ff": 64, "attention": {"kind": "full"}},
        vocab_size=20,
    )
    # The bank is registered once: the model's total is the baseline plus exactly the projections.
    assert count_parameters(enc) == count_parameters(full) + expected(L_, H, n, k)


def test_auto_order_compresses_first_when_heads_share_e():
    bank_shared = ProjectionBank([16], 512, 4, "headwise")
    bank_per_head = ProjectionBank([256], 512, 4, "none")
    assert tiny.layer(tiny.attention(k=16, share="headwise"), 512, 64, 4, bank_shared).order == "compress_first"
    assert tiny.layer(tiny.attention(k=256), 512, 64, 4, bank_per_head).order == "project_first"


def test_a_standalone_layer_moves_its_projections_with_it_and_computes_eq_7_in_float64():
    torch.manual_seed(0)
    t, k = 12, 4
    layer = tiny.layer(tiny.attention(k=k, order="project_first"), N, D, H)
    assert {name for name, _ in layer.named_parameters()} >= {"shared.weight_0", "shared.weight_1"}
    layer = layer.double().eval()
    assert all(p.dtype == torch.float64 for p in [*layer.parameters(), *layer.buffers()])
    x = torch.randn(2, t, D, dtype=torch.float64)

    def heads(y):  # (B, T, d) -> (B, h, T, d_h)
        return y.view(2, t, H, D // H).transpose(1, 2)

    q, key, v = (heads(x @ lin.weight.T + lin.bias) for lin in (layer.q_proj, layer.k_proj, layer.v_proj))
    e, f = layer.bank.matrices(0, t)  # (h, k, T) each: E_i, F_i of every head
    scores = q @ (e @ key).transpose(-1, -2) / math.sqrt(D // H)  # (B, h, T, k)
    out = scores.softmax(-1) @ (f @ v)  # (B, h, T, d_h)
    expected = out.transpose(1, 2).reshape(2, t, D) @ layer.out_proj.weight.T + layer.out_proj.bias
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, atol=1e-12, rtol=1e-12)
