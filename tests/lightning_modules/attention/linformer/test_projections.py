"""Linformer's sequence-axis projections (lightning_modules/attention/linformer/projections.py): random against
learned, conv and pool, their windows and orders, the parameter counts of every sharing mode, and each layer's k.

Linformer's variants are settings of ``model.attention`` on the one parameterised implementation: the one-sided forms
are ``test_one_sided.py``'s, the rules of the settings ``test_options.py``'s, and the causal ones' own guarantees
(no leak, incremental decoding) ``test_causal.py``'s.
"""

import math

import pytest
import tiny
import torch
import torch.nn.functional as F
from torch import nn

from foundation.errors import ConfigError
from lightning_modules.attention.linformer.projections import ProjectionBank
from lightning_modules.encoder import TransformerEncoder, count_parameters

N, D, H, L, V = 16, 16, 2, 2, 40


# ----------------------------------------------------------------------------- random vs learned
def test_random_projection_draws_what_learned_draws_and_is_frozen():
    learned, frozen = (
        tiny.encoder(tiny.attention(**options), vocab=V).shared
        for options in ({"k": 4}, {"k": 4, "projection": "random"})
    )
    assert torch.equal(learned.weight_0, frozen.weight_0)  # same distribution, same draw
    assert count_parameters(frozen) == 0
    assert {n for n, _ in frozen.named_buffers()} == {f"weight_{i}" for i in range(L)}


def test_random_projection_is_restored_from_a_checkpoint_not_redrawn(tmp_path):
    saved = tiny.encoder(tiny.attention(k=4, projection="random"), seed=0, vocab=V)
    torch.save(saved.state_dict(), tmp_path / "ckpt.pt")
    reloaded = tiny.encoder(tiny.attention(k=4, projection="random"), seed=7, vocab=V)
    assert not torch.equal(reloaded.shared.weight_0, saved.shared.weight_0)
    reloaded.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    assert torch.equal(reloaded.shared.weight_0, saved.shared.weight_0)


@pytest.mark.parametrize("projection", ["learned", "random"])
def test_init_sets_the_scale_of_e(projection):
    n, k = 512, 64
    torch.manual_seed(0)
    jl = ProjectionBank([k], n, 4, "headwise", projection, "jl").weight_0
    assert abs(jl.std().item() - 1 / math.sqrt(k)) < 0.01  # N(0, 1/k)
    uniform = ProjectionBank([k], n, 4, "headwise", projection, "uniform").weight_0
    assert uniform.abs().max() <= 1 / math.sqrt(n)  # U(±1/√n)
    delta = 0.5
    th2 = ProjectionBank([k], n, 4, "headwise", projection, "theorem2", delta).weight_0  # E = δR, F = e^{-δ}R
    torch.testing.assert_close(th2[0] / th2[1], torch.full_like(th2[0], delta / math.exp(-delta)))
    normal = ProjectionBank([k], n, 4, "headwise", projection, "normal", std=0.1).weight_0
    assert abs(normal.std().item() - 0.1) < 0.002  # N(0, init_std²), like every other weight


@pytest.mark.parametrize("share", ["headwise", "layerwise"])
def test_xavier_is_fairseqs_draw_of_the_k_by_n_matrix_to_the_bit(share):
    """fairseq's Linformer attention resets E (an nn.Linear(n, k) weight, shape (k, n)) with
    nn.init.xavier_uniform_(gain=1/√2): the same seed gives the same E here."""
    n, k = 48, 12
    torch.manual_seed(3)
    ours = ProjectionBank([k], n, 4, share, "learned", "xavier").weight_0[0, 0]  # E of the first side: (k, n)
    torch.manual_seed(3)
    theirs = nn.init.xavier_uniform_(torch.empty(k, n), gain=1 / math.sqrt(2))
    assert torch.equal(ours, theirs)


def test_a_window_start_is_the_pool_projection_at_full_length_and_learns_from_there():
    """``init: window``: every slot of a dense E starts as the mean of its w = ⌈n/k⌉ positions, so a learned
    Linformer started there computes what ``pool`` does at n (the same other weights); its E/F are parameters."""
    n, k = 16, 4
    torch.manual_seed(0)
    pool = tiny.encoder(tiny.attention(k=k, projection="pool"), n=n)
    window = tiny.encoder(tiny.attention(k=k, init="window"), n=n)
    e = window.shared.weight_0[0, 0]  # (k, n)
    assert torch.equal(e, torch.kron(torch.eye(k), torch.full((1, n // k), 1 / (n // k))))
    assert window.shared.weight_0.requires_grad
    window.load_state_dict({**pool.state_dict(), **{k_: v for k_, v in window.state_dict().items() if "shared" in k_}})
    pool.eval(), window.eval()
    ids = torch.randint(0, V, (2, n))
    torch.testing.assert_close(window(ids), pool(ids), atol=1e-5, rtol=1e-5)
    # k not dividing n: windows of w = ⌈16/7⌉ = 3, the last one partly past n with pool's fixed divisor, and the row
    # past the last window (pool's ⌈n/w⌉ = 6 slots) left 0
    e = ProjectionBank([7], 16, 2, "none", "learned", "window").weight_0[0, 0]
    assert e.sum(-1).tolist() == pytest.approx([1, 1, 1, 1, 1, 1 / 3, 0])
    # windowed storage (a conv kernel bank): every weight 1/w
    conv = ProjectionBank([4], 16, 2, "none", "conv", "window", d_head=3).weight_0
    assert torch.equal(conv, torch.full_like(conv, 1 / 4))


# ----------------------------------------------------------------------------- conv and pool
def test_conv_is_a_depthwise_conv1d_with_kernel_and_stride_w():
    n, k, d_h = 10, 4, 3  # w = 3; 10 = 3·3 + 1: zero-padded tail
    bank = ProjectionBank([k], n, 2, "none", "conv", d_head=d_h)
    x = torch.randn(5, 2, n, d_h)  # (B, h, T, d_h)
    c = bank.weight_0[0]  # (h, 1, w, d_h)
    channels = x.transpose(-1, -2).reshape(5, 2 * d_h, n)  # (B, h·d_h, T)
    kernel = c[:, 0].transpose(-1, -2).reshape(2 * d_h, 1, 3)  # per-channel weights
    expected = F.conv1d(F.pad(channels, (0, 2)), kernel, stride=3, groups=2 * d_h)  # (B, h·d_h, 4)
    got = bank.compress(0, 0, x)  # (B, h, 4, d_h)
    torch.testing.assert_close(got.transpose(-1, -2).reshape(5, 2 * d_h, 4), expected)


def test_pool_is_a_window_mean_with_a_fixed_divisor():
    n, k = 10, 4  # w = 3, 4 slots
    bank = ProjectionBank([k], n, 2, "none", "pool")
    x = torch.randn(5, 1, n, 7)
    expected = F.avg_pool1d(F.pad(x[:, 0].transpose(1, 2), (0, 2)), 3, 3).transpose(1, 2)
    torch.testing.assert_close(bank.compress(0, 0, x)[:, 0], expected)
    assert count_parameters(bank) == 0 and len(list(bank.buffers())) == 0


def test_windows_and_slots_when_k_does_not_divide_n():
    bank = ProjectionBank([6, 5], 16, 2, "none", "pool")
    assert [bank.window(0), bank.window(1)] == [3, 4]  # w = ⌈n/k⌉
    assert [bank.slots(0), bank.slots(1)] == [6, 4]  # ⌈n/w⌉ ≤ k slots
    assert bank.compress(1, 0, torch.randn(1, 1, 16, 2)).shape == (1, 1, 4, 2)


def test_a_window_of_padding_only_is_masked_out():
    bank = ProjectionBank([4], 16, 2, "none", "pool")  # w = 4
    mask = torch.tensor([[True] * 5 + [False] * 11, [True] * 16])
    assert bank.nonempty_slots(0, mask).tolist() == [[True, True, False, False], [True] * 4]


def test_auto_order_projects_first_for_conv_and_compress_first_is_refused():
    conv = ProjectionBank([4], 64, 4, "headwise", "conv", d_head=8)
    conv_layer = {"kind": "linformer", "k": 4, "share": "headwise", "projection": "conv"}
    assert tiny.layer(tiny.attention(**conv_layer), n=64, d=32, h=4, shared=conv).order == "project_first"
    with pytest.raises(ConfigError, match="order: 'compress_first'"):
        tiny.layer(tiny.attention(**conv_layer, order="compress_first"), n=64, d=32, h=4, shared=conv)
    pool = ProjectionBank([4], 64, 4, "none", "pool")
    assert tiny.layer(tiny.attention(k=4, projection="pool"), n=64, d=32, h=4, shared=pool).order == "compress_first"


def test_pool_compress_first_equals_project_first():
    bank = ProjectionBank([5], N, H, "none", "pool")
    torch.manual_seed(0)
    projected = tiny.layer(tiny.attention(k=5, projection="pool", order="project_first"), shared=bank)
    first = tiny.layer(tiny.attention(k=5, projection="pool", order="compress_first"), shared=bank)
    tiny.randomise_biases(projected)
    first.load_state_dict(projected.state_dict())
    x, mask = torch.randn(2, 13, D), torch.ones(2, 13, dtype=torch.bool)
    mask[1, 6:] = False
    torch.testing.assert_close(first(x, mask), projected(x, mask), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- parameter counts
n_, k_, h_, d_h, layers = 64, 16, 4, 8, 3  # w = 4; causal: 15 slots of 4

KS = [16, 8, 6]  # windows 4, 8, 11


def _count(attention):
    enc = TransformerEncoder(
        {
            "max_len": n_,
            "d_model": h_ * d_h,
            "n_heads": h_,
            "n_layers": layers,
            "d_ff": 32,
            "attention": tiny.attention(**attention),
        },
        vocab_size=V,
    )
    return count_parameters(enc.shared), sum(b.numel() for b in enc.shared.buffers())


def _windows(ks):
    return [math.ceil(n_ / k) for k in ks]


@pytest.mark.parametrize(
    "attention,expected",
    [
        # dense (Eq. 7), the paper's counts; nonuniform k sums k_l, layerwise keeps one k_max × n matrix
        ({"share": "none"}, 2 * layers * h_ * n_ * k_),
        ({"share": "headwise"}, 2 * layers * n_ * k_),
        ({"share": "kv"}, layers * n_ * k_),
        ({"share": "layerwise"}, n_ * k_),
        ({"share": "none", "k": KS}, 2 * h_ * n_ * sum(KS)),
        ({"share": "headwise", "k": KS}, 2 * n_ * sum(KS)),
        ({"share": "kv", "k": KS}, n_ * sum(KS)),
        ({"share": "layerwise", "k": KS}, n_ * max(KS)),
        ({"share": "none", "k_schedule": {"kind": "linear", "first": 16, "last": 6}}, 2 * h_ * n_ * (16 + 11 + 6)),
        # one-sided: only E is stored
        ({"share": "none", "compress": "keys"}, layers * h_ * n_ * k_),
        ({"share": "headwise", "compress": "values"}, layers * n_ * k_),
        ({"share": "layerwise", "compress": "keys"}, n_ * k_),
        # conv: w per-channel weights (d = h·d_h channels under none, d_h shared by heads otherwise)
        ({"projection": "conv", "share": "none"}, 2 * layers * h_ * d_h * 4),
        ({"projection": "conv", "share": "headwise"}, 2 * layers * d_h * 4),
        ({"projection": "conv", "share": "kv"}, layers * d_h * 4),
        ({"projection": "conv", "share": "layerwise"}, d_h * 4),
        ({"projection": "conv", "share": "headwise", "k": KS}, 2 * d_h * sum(_windows(KS))),
        ({"projection": "conv", "share": "none", "compress": "keys"}, layers * h_ * d_h * 4),
        # pool: nothing to learn, whatever the sharing mode or k
        ({"projection": "pool", "share": "none"}, 0),
        ({"projection": "pool", "share": "layerwise", "k": KS}, 0),
        # causal: block-diagonal E, (⌈n/w⌉ − 1)·w per matrix (the last block is nobody's past)
        ({"causal": True, "share": "none"}, 2 * layers * h_ * 15 * 4),
        ({"causal": True, "share": "headwise"}, 2 * layers * 15 * 4),
        ({"causal": True, "share": "kv"}, layers * 15 * 4),
        ({"causal": True, "share": "layerwise"}, 15 * 4),
        ({"causal": True, "share": "kv", "k": KS}, (15 * 4 + 7 * 8 + 5 * 11)),
        ({"causal": True, "projection": "conv", "share": "kv"}, layers * d_h * 4),
    ],
)
def test_projection_parameter_counts(attention, expected):
    assert _count({"k": k_, **attention}) == (expected, 0)


@pytest.mark.parametrize("share", ["none", "headwise", "kv", "layerwise"])
def test_random_projections_are_buffers_with_the_learned_count(share):
    learned, _ = _count({"k": KS, "share": share})
    assert _count({"k": KS, "share": share, "projection": "random"}) == (0, learned)


@pytest.mark.parametrize("share", ["none", "headwise", "kv", "layerwise"])
def test_nonuniform_k_gives_each_layer_its_k(share):
    enc = tiny.encoder(tiny.attention(k=[6, 3], share=share), vocab=V)
    for layer, k in enumerate([6, 3]):
        e, f = enc.shared.matrices(layer, N)
        assert e.shape[-2:] == f.shape[-2:] == (k, N)
    if share == "layerwise":  # the first k_l rows of one matrix
        torch.testing.assert_close(enc.shared.matrices(1, N)[0], enc.shared.weight_0[0, :, :3])
    assert enc(torch.randint(0, V, (2, N))).shape == (2, N, D)
