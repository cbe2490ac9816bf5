"""Floating-point operation counts (lightning_modules/flops.py): an attention layer's count against its formula,
counting that changes no output and no gradient, and every kind at a budget of k against full attention."""

import pytest
import tiny
import torch
from kinds import D, N, attention

from lightning_modules.flops import count_flops


# ----------------------------------------------------------------------------- FLOP counts
def _layer_flops(attention_cfg, n, mode, d=32, h=4, batch=2):
    torch.manual_seed(0)
    attn = tiny.layer(attention_cfg, n=n, d=d, h=h).train(mode == "fwdbwd")
    x = torch.randn(batch, n, d, requires_grad=mode == "fwdbwd")

    def run():
        if mode == "fwd":
            with torch.inference_mode():
                return attn(x)
        attn(x).sum().backward()

    return count_flops(run)[0]


@pytest.mark.parametrize("mode,per_pair", [("fwd", 4), ("fwdbwd", 14)])
def test_local_flop_count_is_4_b_h_n_w_dh_and_full_attentions_at_w_ge_n(mode, per_pair):
    n, w, d, h, b = 64, 8, 32, 4, 2
    projections = 8 * b * n * d * d * (1 if mode == "fwd" else 3)  # Q, K, V, O: forward, then 2× backward
    local = _layer_flops({"kind": "local", "options": {"window": w}}, n, mode)
    assert local - projections == per_pair * b * h * n * w * (d // h)  # 4·B·h·n·w·d_h forward (+10 backward)
    assert _layer_flops({"kind": "local", "options": {"window": n}}, n, mode) == _layer_flops({"kind": "full"}, n, mode)


def test_counting_flops_changes_no_output_and_no_gradient():
    torch.manual_seed(0)
    local = tiny.layer(attention("local"))
    x = torch.randn(2, N, D, requires_grad=True)
    plain = local(x)
    (plain * plain).sum().backward()
    expected = [x.grad.clone(), *(p.grad.clone() for p in local.parameters())]
    x.grad = None
    local.zero_grad(set_to_none=True)

    def run():
        out = local(x)
        (out * out).sum().backward()
        return out

    _, counted_out = count_flops(run)
    assert torch.equal(counted_out, plain)
    for got, want in zip([x.grad, *(p.grad for p in local.parameters())], expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_every_kind_counts_less_attention_work_than_full_at_a_budget_of_k():
    n, k = 64, 8
    full = _layer_flops({"kind": "full"}, n, "fwd")
    for kind, options in (
        ("local", {"window": k}),
        ("sparse", {"block": k}),
        ("lsh", {"bucket_size": k}),
        ("performer", {"n_features": k}),
        ("nystrom", {"n_landmarks": k}),
    ):
        assert 0 < _layer_flops({"kind": kind, "options": options}, n, "fwd") < full, kind
