"""Nyströmformer (``kind: nystrom``, lightning_modules/attention/nystrom.py): with n landmarks it is full attention and
converges with iterations, in float64 down to its rounding, and it matches nystrom-attention (skipped when ``.[refs]`` is not installed)."""

import functools

import pytest
import tiny
import torch
from kinds import D, N, padding_mask, same_weights


def test_nystrom_with_n_landmarks_is_full_attention_and_converges_with_iterations():
    torch.manual_seed(0)
    full = tiny.layer({"kind": "full"})
    x, mask = torch.randn(3, N, D), padding_mask()
    errors = []
    with torch.no_grad():
        for iterations in (6, 10, 15):
            nystrom = tiny.layer({"kind": "nystrom", "options": {"n_landmarks": N, "pinv_iterations": iterations}})
            same_weights(full, nystrom)
            errors.append((nystrom(x) - full(x)).abs().max().item())
        torch.testing.assert_close(nystrom(x), full(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(nystrom(x, mask)[-1, :10], full(x, mask)[-1, :10], atol=1e-4, rtol=1e-4)
    assert errors[0] > errors[1] > errors[2]


def test_nystrom_iterates_in_float64_for_float64_inputs_down_to_its_rounding():
    torch.manual_seed(0)
    full = tiny.layer({"kind": "full"}).double()
    x = torch.randn(3, N, D, dtype=torch.float64)
    errors = []
    with torch.no_grad():
        for iterations in (6, 10, 20, 40):
            nystrom = tiny.layer(
                {"kind": "nystrom", "options": {"n_landmarks": N, "pinv_iterations": iterations}}
            ).double()
            same_weights(full, nystrom)
            errors.append((nystrom(x) - full(x)).abs().max().item())
    # each step down until float64's rounding of this layer (~1e-13), where the error no longer orders; float32
    # stalls near 1e-4
    assert all(later < earlier or later < 1e-12 for earlier, later in zip(errors, errors[1:]))
    assert errors[0] > 1e-4 and errors[-1] < 1e-10


nystrom_lib = functools.partial(pytest.importorskip, "nystrom_attention")


def test_nystrom_matches_nystrom_attention_with_the_same_weights():
    """Same Q/K/V/O (its projections have no bias), its convolution skip off; one sequence and one head, because
    its pseudo-inverse's starting scale is a maximum over the whole batch and all heads, ours per matrix."""
    library = nystrom_lib()
    torch.manual_seed(0)
    ours = tiny.layer({"kind": "nystrom", "options": {"n_landmarks": 4, "pinv_iterations": 6}}, h=1)
    theirs = library.NystromAttention(dim=D, dim_head=D, heads=1, num_landmarks=4, pinv_iterations=6, residual=False)
    with torch.no_grad():
        for proj in (ours.q_proj, ours.k_proj, ours.v_proj):
            proj.bias.zero_()
        theirs.to_qkv.weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.to_out[0].load_state_dict(ours.out_proj.state_dict())
        x = torch.randn(1, N, D)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-4)
