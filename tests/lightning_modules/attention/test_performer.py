"""Performer's FAVOR+ (``kind: performer``, lightning_modules/attention/performer.py): its error against full attention
shrinks as features grow, the causal form equals the quadratic one, the features are orthogonal in blocks, kept as a
buffer and redrawn by their policy, and it matches performer-pytorch (skipped when ``.[refs]`` is not installed)."""

import functools

import pytest
import tiny
import torch
from kinds import D, H, N, V, attention, same_weights

from lightning_modules.attention.performer import orthogonal_features


@pytest.mark.parametrize("causal", [False, True])
def test_performer_error_against_full_attention_shrinks_as_features_grow(causal):
    torch.manual_seed(0)
    full = tiny.layer({"kind": "full", "causal": causal})
    x = torch.randn(2, N, D)
    with torch.no_grad():
        reference = full(x)
        errors = []
        for m in (4, 32, 256):
            per_seed = []
            for seed in range(4):
                torch.manual_seed(seed)
                performer = tiny.layer({"kind": "performer", "causal": causal, "options": {"n_features": m}})
                same_weights(full, performer)
                per_seed.append((performer(x) - reference).abs().mean() / reference.abs().mean())
            errors.append(float(torch.stack(per_seed).mean()))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.35 * errors[0], errors


@pytest.mark.parametrize("t", [5, 24, 64, 65, 150])  # shorter than a chunk, one chunk, chunks with a ragged tail
def test_causal_favor_equals_the_quadratic_form_at_every_length(t):
    """Σ_{j ≤ i} φ(q_i)·φ(k_j) v_j / Σ_{j ≤ i} φ(q_i)·φ(k_j), written out as a masked T × T product."""
    torch.manual_seed(0)
    performer = tiny.layer({"kind": "performer", "causal": True, "options": {"n_features": 8}}, n=160)
    q, k, v = (torch.randn(2, H, t, D // H) for _ in range(3))
    qf, kf = performer.feature_map(q, True), performer.feature_map(k, False)  # (B, h, T, m), float32
    scores = (qf.double() @ kf.double().transpose(-1, -2)).tril()  # (B, h, T, T)
    expected = (scores @ v.double()) / scores.sum(-1, keepdim=True)
    torch.testing.assert_close(performer.causal_favor(qf, kf, v).double(), expected, atol=1e-5, rtol=1e-5)


def test_orthogonal_features_are_orthogonal_in_blocks_with_gaussian_norms():
    torch.manual_seed(0)
    w = orthogonal_features(20, 8)  # blocks of 8, 8, 4 rows
    for block in (w[:8], w[8:16], w[16:]):
        gram = block @ block.T
        torch.testing.assert_close(gram - torch.diag(gram.diagonal()), torch.zeros_like(gram), atol=1e-4, rtol=0)
    big = orthogonal_features(4000, 8)
    assert abs(big.norm(dim=1).pow(2).mean().item() - 8) < 0.3  # E‖w‖² = d for w ~ N(0, I_d)


# ----------------------------------------------------------------------------- performer's random features
def test_performer_features_are_a_buffer_restored_not_redrawn(tmp_path):
    saved, fresh = (tiny.encoder(attention("performer"), seed, V, random_biases=True).eval() for seed in (0, 7))
    names = {n for n, _ in saved.named_buffers()}
    assert {"blocks.0.attn.features", "blocks.0.attn.seed", "blocks.0.attn.steps"} <= names
    assert not torch.equal(fresh.blocks[0].attn.features, saved.blocks[0].attn.features)
    torch.save(saved.state_dict(), tmp_path / "ckpt.pt")
    fresh.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    assert torch.equal(fresh.blocks[0].attn.features, saved.blocks[0].attn.features)


@pytest.mark.parametrize(
    "policy,every,redrawn_after", [("never", None, []), ("every_step", None, [1, 2, 3]), ("every_n_steps", 2, [2])]
)
def test_performer_redraws_by_its_policy_in_training_only(policy, every, redrawn_after):
    extra = {"redraw": policy} if every is None else {"redraw": policy, "redraw_every": every}
    enc = tiny.encoder(attention("performer", **extra), vocab=V, random_biases=True).eval()
    attn = enc.blocks[0].attn
    ids = torch.randint(0, V, (1, N))
    with torch.no_grad():
        for _ in range(3):
            before = attn.features.clone()
            enc.eval()(ids)
            assert torch.equal(attn.features, before)  # evaluation never redraws
        changed = []
        for step in range(4):
            before = attn.features.clone()
            enc.train()(ids)
            if not torch.equal(attn.features, before):
                changed.append(step)
    assert changed == redrawn_after


def test_performer_redraws_the_same_features_on_every_process():
    """Redraws are seeded by the saved seed and the draw count: two ranks holding the same buffers agree."""
    a, b = (
        tiny.encoder(attention("performer", redraw="every_step"), seed, V, random_biases=True).eval() for seed in (0, 1)
    )
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, V, (1, N))
    with torch.no_grad():
        for _ in range(3):
            a.train()(ids), b.train()(ids)
    assert torch.equal(a.blocks[1].attn.features, b.blocks[1].attn.features)


performer_lib = functools.partial(pytest.importorskip, "performer_pytorch")


@pytest.mark.parametrize("causal", [False, True])
def test_performer_matches_performer_pytorch_with_the_same_features(causal, monkeypatch):
    """Same W copied into its ``projection_matrix``. Its kernel adds ε = 1e-4 to every feature (a blend of uniform
    attention) and its causal form ε = 1e-6 to the denominator only (which shrinks early outputs when its globally
    stabilised key features are small); both are set to 0 here, after which the two differ only in their
    stabilisers, which cancel."""
    library = performer_lib()
    module = __import__("performer_pytorch.performer_pytorch", fromlist=["softmax_kernel"])
    monkeypatch.setattr(module, "softmax_kernel", functools.partial(module.softmax_kernel, eps=0.0))
    torch.manual_seed(0)
    ours = tiny.layer({"kind": "performer", "causal": causal, "options": {"n_features": 16}})
    theirs = library.FastAttention(dim_heads=D // H, nb_features=16, causal=causal)
    theirs.projection_matrix.copy_(ours.features)
    if causal:
        theirs.causal_linear_fn = functools.partial(module.causal_linear_attention_noncuda, eps=0.0)
    q, k, v = (torch.randn(2, H, N, D // H) for _ in range(3))
    favor = ours.causal_favor if causal else ours.favor
    with torch.no_grad():
        got = favor(ours.feature_map(q, True), ours.feature_map(k, False), v)
        torch.testing.assert_close(got, theirs(q, k, v), atol=1e-4, rtol=1e-4)
