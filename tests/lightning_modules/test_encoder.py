"""How the encoder starts, as specifications: positions (``model.position``, ``model.position_scale``: what table
each scheme adds to the token embeddings, at what scale, whether it trains, and that the input of every attention
kind carries it) and the initial weights (``model.init_std``)."""

import functools
import math

import pytest
import tiny
import torch
from torch import nn

from foundation.errors import ConfigError
from lightning_modules.attention import build_attention
from lightning_modules.encoder import init_weights, sinusoidal_positions
from training import config as run_config

N, D = 32, 16


def test_sinusoidal_table_is_vaswanis_sines_and_cosines():
    table = sinusoidal_positions(N, D)
    for t in (0, 1, 7, 31):
        for i in range(D // 2):
            angle = t / 10000 ** (2 * i / D)
            assert table[t, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[t, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("scale", [0.02, 0.5])
def test_sinusoidal_positions_are_fixed_at_rms_scale(scale):
    enc = tiny.encoder(
        tiny.attention("full"), vocab=20, n=N, d=D, layers=1, position="sinusoidal", position_scale=scale, init_std=0.02
    )
    assert torch.allclose(enc.pos.weight, sinusoidal_positions(N, D) * scale * math.sqrt(2))
    assert enc.pos.weight.pow(2).mean().sqrt().item() == pytest.approx(scale, rel=0.05)
    assert not enc.pos.weight.requires_grad  # fixed: the optimiser never moves it


@pytest.mark.parametrize("scale", [0.02, 0.5])
def test_learned_positions_train_from_a_normal_of_standard_deviation_scale(scale):
    enc = tiny.encoder(
        tiny.attention("full"), vocab=20, n=N, d=D, layers=1, position="learned", position_scale=scale, init_std=0.02
    )
    assert enc.pos.weight.requires_grad
    assert enc.pos.weight.std().item() == pytest.approx(scale, rel=0.1)


@pytest.mark.parametrize("kind, options", [("full", {}), ("nystrom", {"n_landmarks": 4}), ("no_context", {})])
def test_the_same_token_at_two_positions_reaches_the_first_block_as_two_inputs(kind, options):
    enc = tiny.encoder(
        tiny.attention(kind, **options),
        vocab=20,
        n=N,
        d=D,
        layers=1,
        position="sinusoidal",
        position_scale=1.0,
        init_std=0.02,
    ).eval()
    seen = []
    enc.blocks[0].attn.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        enc(torch.full((1, N), 7))
    assert not torch.allclose(seen[0][0, 0], seen[0][0, 1])


def test_a_position_scale_out_of_range_is_one_line():
    with pytest.raises(ConfigError, match=r"^model.position_scale: must be in \(0, 100\], got 0.0$"):
        run_config.load(None, ["model.position_scale=0"])


@pytest.mark.parametrize("init_std", [0.02, 0.125])
def test_linear_and_token_weights_start_from_a_normal_of_standard_deviation_init_std_and_biases_at_zero(init_std):
    enc = tiny.encoder(
        tiny.attention("full"),
        vocab=20,
        n=N,
        d=D,
        layers=1,
        position="sinusoidal",
        position_scale=0.02,
        init_std=init_std,
    )
    weights = torch.cat(
        [enc.tok.weight.flatten(), *(m.weight.flatten() for m in enc.modules() if isinstance(m, nn.Linear))]
    )
    assert weights.std().item() == pytest.approx(init_std, rel=0.05)
    assert all(not m.bias.any() for m in enc.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("kind, absent", [("full", ""), ("lsh", "k"), ("no_context", "qk")])
def test_fused_q_k_v_rows_hold_what_three_separate_linears_drew_from_the_same_seed(kind, absent):
    """Built, then re-initialised with init_std, W_q, W_k, W_v consume the random stream as three nn.Linear(d, d)
    in the order q, k, v (one the kind lacks still draws when built): a seed gives the same model as before the
    projections were fused, bit for bit."""
    model = {"max_len": N, "d_model": D, "n_heads": 2, "attention": {"kind": kind, "options": {}}}
    if kind == "lsh":
        model["attention"]["options"] = {"bucket_size": N}
    init = functools.partial(init_weights, std=0.02)
    torch.manual_seed(0)
    layer = build_attention(model)
    torch.manual_seed(0)
    separate = {name: nn.Linear(D, D) for name in ("q", "k", "v", "out")}  # drawn in this order when built
    for redraw in (False, True):
        for name, linear in separate.items():
            mine = layer.out_proj if name == "out" else getattr(layer, f"{name}_proj")
            assert (mine is None) == (name in absent)
            if mine is not None:
                assert torch.equal(mine.weight, linear.weight) and torch.equal(mine.bias, linear.bias)
        if not redraw:
            torch.manual_seed(1)
            layer.apply(init)
            torch.manual_seed(1)
            nn.ModuleList(linear for name, linear in separate.items() if name not in absent).apply(init)
