"""Reformer's LSH attention (``kind: lsh``, lightning_modules/attention/lsh.py): one bucket is full shared-QK
attention, identical rounds count each pair once, and it hashes and attends as reformer-pytorch does
(skipped when ``.[refs]`` is not installed)."""

import functools
import math

import pytest
import tiny
import torch
import torch.nn.functional as F
from kinds import D, H, N

from lightning_modules.attention.lsh import SELF_SCORE


def shared_qk_attention(lsh, x, causal):
    """The dense reference: softmax(Q K̂ᵀ/√d_h) V with K̂ = Q/‖Q‖, a query seeing itself only as a last resort."""
    b, t, _ = x.shape
    q, v = lsh.heads(lsh.q_proj(x)), lsh.heads(lsh.v_proj(x))
    scores = q @ F.normalize(q, dim=-1).transpose(-1, -2) / math.sqrt(lsh.d_head)
    scores = scores.masked_fill(torch.eye(t, dtype=torch.bool), SELF_SCORE)
    if causal:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
    out = scores.softmax(-1) @ v
    return lsh.out_proj(out.transpose(1, 2).reshape(b, t, -1))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_hashes", [1, 3])
def test_lsh_with_one_bucket_is_full_shared_qk_attention(causal, n_hashes):
    torch.manual_seed(0)
    lsh = tiny.layer({"kind": "lsh", "causal": causal, "options": {"bucket_size": N, "n_hashes": n_hashes}})
    assert lsh.n_buckets == 1 and lsh.k_proj is None
    x = torch.randn(3, N, D)
    with torch.no_grad():
        torch.testing.assert_close(lsh(x), shared_qk_attention(lsh, x, causal), atol=1e-5, rtol=1e-5)


def test_lsh_identical_rounds_count_each_pair_once():
    """With every round's rotation the same, the union is one round's set: r rounds equal one."""
    torch.manual_seed(0)
    one = tiny.layer({"kind": "lsh", "options": {"bucket_size": 4, "n_hashes": 1}})
    three = tiny.layer({"kind": "lsh", "options": {"bucket_size": 4, "n_hashes": 3}})
    three.load_state_dict({**one.state_dict(), "rotations": one.rotations.expand(3, -1, -1).clone()})
    x = torch.randn(2, N, D)
    with torch.no_grad():
        torch.testing.assert_close(three(x), one(x), atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- reference libraries
reformer = functools.partial(pytest.importorskip, "reformer_pytorch")


def _lsh_pair(n=32, bucket_size=4, n_hashes=2, causal=False, **library_options):
    """Our lsh layer and reformer-pytorch's LSHAttention drawing the same rotations (its draw is replayed)."""
    LSHAttention = reformer().LSHAttention
    ours = tiny.layer(
        {"kind": "lsh", "causal": causal, "options": {"bucket_size": bucket_size, "n_hashes": n_hashes}}, n=n
    )
    theirs = LSHAttention(bucket_size=bucket_size, n_hashes=n_hashes, causal=causal, **library_options).eval()
    torch.manual_seed(5)  # what its hash_vectors draws: randn(1, d_h, n_hashes, n_buckets / 2)
    drawn = torch.randn(1, D // H, n_hashes, ours.n_buckets // 2)
    if ours.n_buckets > 1:
        ours.rotations.copy_(drawn[0].permute(1, 0, 2))
    return ours, theirs


def test_lsh_hashes_like_reformer_pytorch():
    ours, theirs = _lsh_pair()
    q = torch.randn(2, H, 32, D // H)
    torch.manual_seed(5)
    buckets = theirs.hash_vectors(ours.n_buckets, q.flatten(0, 1)).view(2 * H, 2, 32)
    offsets = torch.arange(2)[None, :, None] * ours.n_buckets
    assert torch.equal(ours.buckets(q, None).flatten(0, 1), buckets - offsets)


def test_lsh_matches_reformer_pytorch_within_buckets_with_the_same_rotations():
    """Non-causal, several buckets, two rounds, pairs counted once: the paper's rule, reformer-pytorch's
    ``attend_across_buckets=False, allow_duplicate_attention=False``."""
    ours, theirs = _lsh_pair(attend_across_buckets=False, allow_duplicate_attention=False, return_attn=True)
    q, v = torch.randn(2, H, 32, D // H), torch.randn(2, H, 32, D // H)
    torch.manual_seed(5)
    expected, weights, _ = theirs(q.flatten(0, 1), v.flatten(0, 1))
    expected = expected.view_as(v)
    # A query alone in its bucket in every round sees only itself: ours returns v_i exactly; the library's
    # float32 exp(l − logsumexp l) at l ≈ −5·10⁴ (the self score) is off by up to 0.2% there.
    alone = (weights.diagonal(dim1=-2, dim2=-1) > 0.99).view(2, H, 32)
    assert 0 < int(alone.sum()) < 16
    with torch.no_grad():
        got = ours.lsh_attention(q, v, None, 0.0)
    torch.testing.assert_close(got[~alone], expected[~alone], atol=1e-5, rtol=1e-5)
    assert torch.equal(got[alone], v[alone])


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_full_coverage_matches_reformer_pytorch(causal):
    """Our one bucket against its two half-length chunks that see each other: both full shared-QK attention."""
    ours, theirs = _lsh_pair(n=32, bucket_size=32, n_hashes=1, causal=causal)
    theirs.bucket_size = 16
    q, v = torch.randn(2, H, 32, D // H), torch.randn(2, H, 32, D // H)
    expected = theirs(q.flatten(0, 1), v.flatten(0, 1))[0].view_as(v)
    with torch.no_grad():
        torch.testing.assert_close(ours.lsh_attention(q, v, None, 0.0), expected, atol=1e-5, rtol=1e-5)
