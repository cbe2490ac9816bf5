"""Key-only / value-only Linformer (``compress: keys | values``, lightning_modules/attention/linformer/one_sided.py):
with k = n it is full attention, and its lift is the projector onto the row space of E on the real positions."""

import math

import pytest
import tiny
import torch

from lightning_modules.attention.linformer.projections import ProjectionBank

N, D, H = 16, 16, 2


# ----------------------------------------------------------------------------- key-only / value-only
def _full_and_one_sided(compress, k, projection="learned", share="none"):
    torch.manual_seed(0)
    full = tiny.layer(tiny.attention("full"))
    tiny.randomise_biases(full)
    bank = ProjectionBank([k], N, H, share, projection, compress=compress, d_head=D // H)
    one_sided = tiny.layer(tiny.attention(k=k, share=share, projection=projection, compress=compress), shared=bank)
    one_sided.load_state_dict(full.state_dict())
    return full, one_sided, bank


@pytest.mark.parametrize("compress", ["keys", "values"])
@pytest.mark.parametrize("e", ["identity", "random"])
def test_one_sided_projection_with_k_equal_n_is_full_attention(compress, e):
    full, one_sided, bank = _full_and_one_sided(compress, N)
    if e == "identity":
        with torch.no_grad():
            bank.weight_0.copy_(torch.eye(N).expand_as(bank.weight_0))
    x, mask = torch.randn(3, N, D), torch.ones(3, N, dtype=torch.bool)
    mask[2, 10:] = False
    torch.testing.assert_close(one_sided(x), full(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(one_sided(x, mask)[2, :10], full(x, mask)[2, :10], atol=1e-5, rtol=1e-5)


def test_one_sided_pool_with_windows_of_one_is_full_attention():
    full, one_sided, _ = _full_and_one_sided("keys", N, "pool")  # w = 1: P = I
    x = torch.randn(2, N, D)
    torch.testing.assert_close(one_sided(x), full(x), atol=1e-5, rtol=1e-5)


def test_lift_is_the_projector_onto_the_row_space_of_e_on_real_positions():
    bank = ProjectionBank([4], N, H, "none", compress="keys")
    t, real = 12, 9
    mask = torch.zeros(1, t, dtype=torch.bool)
    mask[0, :real] = True
    x = torch.randn(1, H, t, 3)
    lifted = bank.lift(0, 0, x, mask)
    e = bank.matrices(0, t)[0][:, :, :real]  # (h, k, real): E_m
    expected = torch.linalg.pinv(e) @ e @ x[0, :, :real]  # E_m⁺ E_m x
    torch.testing.assert_close(lifted[0, :, :real], expected, atol=1e-5, rtol=1e-4)
    assert lifted[0, :, real:].abs().max() == 0  # padding stays empty
    torch.testing.assert_close(bank.lift(0, 0, lifted, mask), lifted, atol=1e-5, rtol=1e-4)  # P² = P


def _lift_reference(bank, x, mask):
    """E_m⁺ E_m x for every sequence alone (P = diag(m) when it has ≤ k real tokens)."""
    out = torch.zeros_like(x)
    for b in range(len(x)):
        real = int(mask[b].sum())
        e = bank.matrices(0, x.shape[-2])[0][:, :, :real]  # (h, k, real)
        out[b, :, :real] = torch.linalg.pinv(e) @ e @ x[b, :, :real] if real > e.shape[-2] else x[b, :, :real]
    return out


def test_lift_equals_the_projector_per_sequence_with_one_qr_per_group_without_padding(monkeypatch):
    bank = ProjectionBank([4], N, H, "none", compress="keys")
    x = torch.randn(3, H, 12, 3)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, 9:], mask[2, 3:] = False, False  # 12, 9 and 3 (≤ k) real tokens
    torch.testing.assert_close(bank.lift(0, 0, x, mask), _lift_reference(bank, x, mask), atol=1e-5, rtol=1e-4)
    shapes, qr = [], torch.linalg.qr
    monkeypatch.setattr(torch.linalg, "qr", lambda a, *args, **kw: shapes.append(a.shape) or qr(a, *args, **kw))
    everything = torch.ones(3, 12, dtype=torch.bool)
    torch.testing.assert_close(bank.lift(0, 0, x), _lift_reference(bank, x, everything), atol=1e-5, rtol=1e-4)
    assert len(shapes) == 1 and math.prod(shapes[0][:-2]) == H  # E is the same for every sequence


def test_lift_keeps_e_in_the_graph_when_every_sequence_is_short_and_never_syncs_the_host(monkeypatch):
    """Under DDP a rank whose sequences all have ≤ k real tokens must still give E a (zero) gradient, or DDP
    (find_unused_parameters=False) fails or hangs; and whether P is needed is decided on the device."""
    for t, real in ((12, 3), (4, 4)):  # padded to T > k; T ≤ k without padding
        bank = ProjectionBank([4], N, H, "none", compress="keys")
        x = torch.randn(2, H, t, 3, requires_grad=True)
        mask = None if real == t else torch.arange(t).expand(2, t) < real
        for name in ("__bool__", "item", "tolist"):
            monkeypatch.setattr(torch.Tensor, name, lambda *a, name=name: pytest.fail(f"lift called Tensor.{name}"))
        lifted = bank.lift(0, 0, x, mask)
        monkeypatch.undo()
        lifted.sum().backward()
        assert bank.weight_0.grad is not None and bank.weight_0.grad.abs().max() == 0
        torch.testing.assert_close(lifted, x * (1 if mask is None else mask[:, None, :, None]))


def test_windowed_lift_of_pool_is_the_window_mean_of_real_rows():
    bank = ProjectionBank([4], 8, 1, "none", "pool", compress="values")  # w = 2
    x = torch.arange(7.0).view(1, 1, 7, 1)
    mask = torch.tensor([[True] * 5 + [False] * 2])
    assert bank.lift(0, 0, x, mask).flatten().tolist() == [0.5, 0.5, 2.5, 2.5, 4.0, 0.0, 0.0]
