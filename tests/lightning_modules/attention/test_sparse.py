"""Sparse Transformer attention (``kind: sparse``, lightning_modules/attention/sparse.py): a pattern that covers every
pair is full attention, and the patterns are the paper's sets."""

import pytest
import tiny
import torch
from kinds import D, N, full_and, padding_mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "options",
    [
        {"pattern": "fixed", "block": N},
        {"pattern": "fixed", "block": 4, "summary": 4},
        {"pattern": "strided", "block": 3, "stride": 1},
        {"pattern": "strided", "block": N},
    ],
)
def test_sparse_pattern_covering_every_pair_is_full_attention(options, causal):
    full, sparse = full_and({"kind": "sparse", "causal": causal, "options": options})
    x, mask = torch.randn(3, N, D), padding_mask()
    with torch.no_grad():
        torch.testing.assert_close(sparse(x), full(x), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(sparse(x, mask), full(x, mask), atol=1e-6, rtol=1e-5)


def test_sparse_patterns_are_the_papers_sets():
    i = torch.arange(N)
    fixed = tiny.layer({"kind": "sparse", "causal": True, "options": {"pattern": "fixed", "block": 4, "summary": 1}})
    assert fixed.visible(torch.tensor(10), i).nonzero().flatten().tolist() == [3, 7, 8, 9, 10]  # block 8-11, summaries
    strided = tiny.layer({"kind": "sparse", "causal": True, "options": {"pattern": "strided", "block": 3, "stride": 4}})
    assert strided.visible(torch.tensor(10), i).nonzero().flatten().tolist() == [2, 6, 8, 9, 10]  # last 3, every 4th
    both_ways = tiny.layer({"kind": "sparse", "options": {"pattern": "strided", "block": 2, "stride": 5}})
    assert both_ways.visible(torch.tensor(7), i).nonzero().flatten().tolist() == [2, 6, 7, 8, 12]
