"""Sliding-window attention (``kind: local``, lightning_modules/attention/local.py): with a window of n it is full
attention; each query sees exactly its window, centred, and shifted inside the grid."""

import pytest
import tiny
import torch
from kinds import D, N, full_and, padding_mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_global", [0, 3])
def test_local_with_a_window_of_n_is_full_attention(causal, n_global):
    full, local = full_and({"kind": "local", "causal": causal, "options": {"window": N, "n_global": n_global}})
    x, mask = torch.randn(3, N, D), padding_mask()
    with torch.no_grad():
        torch.testing.assert_close(local(x), full(x), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(local(x, mask), full(x, mask), atol=1e-6, rtol=1e-5)


def test_local_sees_exactly_window_positions_centred_and_shifted_inside_the_grid():
    local = tiny.layer({"kind": "local", "options": {"window": 4}})
    i = torch.arange(N)
    seen = local.visible(i[:, None], i[None, :])
    assert (seen.sum(1) == 4).all()
    assert seen[0].nonzero().flatten().tolist() == [0, 1, 2, 3]  # shifted right at the start
    assert seen[8].nonzero().flatten().tolist() == [6, 7, 8, 9]  # i − ⌊w/2⌋ … i + ⌈w/2⌉ − 1
    assert seen[N - 1].nonzero().flatten().tolist() == [12, 13, 14, 15]  # shifted left at the end
    causal = tiny.layer({"kind": "local", "causal": True, "options": {"window": 4, "n_global": 2}})
    assert causal.visible(torch.tensor(9), i).nonzero().flatten().tolist() == [0, 1, 6, 7, 8, 9]
