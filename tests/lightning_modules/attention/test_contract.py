"""The contract every registered attention kind keeps, in each of its forms, full attention and every Linformer variant
included: outputs of the right shape at any length, padding that never changes a real token's output, a gradient
for every trainable parameter and none for a buffer, checkpoints that reproduce outputs exactly, and, in a causal
form, no output that sees a later token and incremental decoding equal to the parallel forward (or one line saying
the kind has no streaming form).

A new kind gets its cases by one line in ``tiny.KINDS``: the first test fails until every registered kind has a case,
and a causal case for its causal form.
"""

import pytest
import tiny
import torch

from lightning_modules.attention import ATTENTION_KINDS

N, V = 16, 30

# Linformer's variants at n = 16 (options; "causal" its causal form): projection kinds, sharing modes, orders,
# per-layer k, one-sided compression, and windows that do not divide n.
LINFORMER = {
    "learned": {"k": 4},
    "random": {"k": 4, "projection": "random"},
    "theorem2": {"k": 4, "init": "theorem2"},
    "conv": {"k": 5, "projection": "conv"},  # w = 4: 4 slots
    "pool": {"k": 6, "projection": "pool"},  # w = 3: 6 slots, the last one partly padding
    "headwise": {"k": 4, "share": "headwise"},
    "kv": {"k": 4, "share": "kv"},
    "layerwise": {"k": 4, "share": "layerwise"},
    "project_first": {"k": 4, "share": "headwise", "order": "project_first"},
    "compress_first": {"k": 4, "share": "headwise", "order": "compress_first"},
    "nonuniform_k": {"k": [6, 3]},
    "nonuniform_k_layerwise": {"k": [6, 3], "share": "layerwise"},
    "key_only": {"k": 4, "compress": "keys"},
    "value_only": {"k": 4, "compress": "values"},
    "key_only_pool": {"k": 4, "compress": "keys", "projection": "pool"},
    "value_only_conv": {"k": 4, "compress": "values", "projection": "conv"},
    "causal": {"k": 5, "causal": True},  # w = 4
    "causal_random_kv": {"k": 5, "causal": True, "projection": "random", "share": "kv"},
    "causal_conv": {"k": 5, "causal": True, "projection": "conv"},
    "causal_pool": {"k": 6, "causal": True, "projection": "pool"},  # w = 3: blocks 3, 3, 3, 3, 3, 1
    "causal_pool_headwise": {"k": 7, "causal": True, "projection": "pool", "share": "headwise"},
    "causal_nonuniform_k": {"k": [7, 4], "causal": True},  # w = 3, 4 per layer
    "causal_layerwise": {"k": 3, "causal": True, "share": "layerwise"},  # w = 6: blocks 6, 6, 4
    "causal_k_equal_n": {"k": N, "causal": True},  # w = 1: every earlier token its own slot
}

CASES = {
    **{name: tiny.attention(kind, **options) for name, (kind, options) in tiny.KINDS.items()},
    **{
        f"causal_{name}": tiny.attention(kind, causal=True, **options)
        for name, (kind, options) in tiny.KINDS.items()
        if ATTENTION_KINDS[kind].has_causal_form
    },
    **{f"linformer_{name}": tiny.attention("linformer", **options) for name, options in LINFORMER.items()},
}
CAUSAL = [name for name, attention in CASES.items() if attention["causal"]]
# Causal kinds without a streaming form (incremental decoding is refused in one line).
NOT_STREAMING = {"lsh"}


def model_of(name, seed=0, **sizes):
    """The case's 2-layer encoder at n = 16 in eval mode, its biases non-zero (a padded position then carries a value
    unless the kind keeps it out)."""
    return tiny.encoder(CASES[name], seed=seed, vocab=V, random_biases=True, n=N, **sizes).eval()


def test_every_registered_kind_has_a_case_and_a_causal_one_for_its_causal_form():
    assert {attention["kind"] for attention in CASES.values()} == set(ATTENTION_KINDS)
    causal = {kind for kind, cls in ATTENTION_KINDS.items() if cls.has_causal_form}
    assert {CASES[name]["kind"] for name in CAUSAL} == causal


@pytest.mark.parametrize("name", CASES)
def test_output_shape_at_full_and_short_length(name):
    enc = model_of(name)
    with torch.no_grad():
        for t in (N, 11):
            assert enc(torch.randint(0, V, (3, t))).shape == (3, t, 16)


@pytest.mark.parametrize("name", CASES)
def test_appending_padding_never_changes_real_outputs(name):
    enc = model_of(name)
    ids = torch.randint(5, V, (2, 9))
    padded = torch.cat([ids, torch.randint(5, V, (2, 5))], dim=1)  # arbitrary ids under the padding
    mask = torch.zeros(2, 14, dtype=torch.bool)
    mask[:, :9] = True
    with torch.no_grad():
        torch.testing.assert_close(enc(padded, mask)[:, :9], enc(ids), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(enc(ids, mask[:, :9]), enc(ids), atol=1e-5, rtol=1e-5)  # an all-True mask
        assert torch.isfinite(enc(padded, mask)).all()  # nothing NaN at padded positions either


@pytest.mark.parametrize("name", CASES)
def test_gradients_reach_every_trainable_parameter_and_no_buffer(name):
    enc = model_of(name).train()
    out = enc(torch.randint(0, V, (2, N)))
    (out * torch.randn_like(out)).sum().backward()  # a random readout: a LayerNorm's plain sum has zero gradient
    missing = [n for n, p in enc.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []
    for buffer_name, buffer in enc.named_buffers():
        assert not buffer.requires_grad and buffer.grad is None, buffer_name


@pytest.mark.parametrize("name", CASES)
def test_state_dict_round_trip_reproduces_outputs_exactly(name, tmp_path):
    source, target = model_of(name, seed=0), model_of(name, seed=1)
    torch.save(source.state_dict(), tmp_path / "ckpt.pt")
    target.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    ids = torch.randint(0, V, (2, N))
    with torch.no_grad():
        assert torch.equal(source(ids), target(ids))


@pytest.mark.parametrize("name", CAUSAL)
def test_changing_a_later_token_leaves_every_earlier_output_unchanged(name):
    enc = model_of(name)
    ids = torch.randint(0, V, (2, N))
    with torch.no_grad():
        base = enc(ids)
        for t in range(N):
            changed = ids.clone()
            changed[:, t] = (changed[:, t] + 1) % V
            out = enc(changed)
            if CASES[name]["kind"] == "lsh":
                # The key sets are exactly causal; a later token's hash may still move where earlier keys sit in
                # the sorted layout, which reorders float sums (~1e-7), never which keys or scores enter.
                torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-6, rtol=0)
            else:
                assert torch.equal(out[:, :t], base[:, :t]), f"position < {t} saw token {t}"
            assert not torch.allclose(out[:, t], base[:, t]), f"token {t} did not reach its own output"


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("name", CAUSAL)
def test_incremental_decoding_equals_the_parallel_forward(name, norm):
    enc = model_of(name, norm=norm)
    kind = CASES[name]["kind"]
    if kind in NOT_STREAMING:
        with pytest.raises(ValueError, match=f"^attention kind '{kind}' has no streaming form"):
            enc.init_decode_state(3)
        return
    ids = torch.randint(0, V, (3, N))
    state = enc.init_decode_state(3)
    steps = []
    for t in range(N):
        hidden, state = enc.decode_step(ids[:, t], state)
        steps.append(hidden)
    with torch.no_grad():
        torch.testing.assert_close(torch.stack(steps, 1), enc(ids), atol=1e-5, rtol=1e-5)
