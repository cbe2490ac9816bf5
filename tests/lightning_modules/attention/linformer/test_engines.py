"""Linformer's two engines compute the same function: ``fused`` (one input product and one batched product for E K
and F V; the causal form as one FlexAttention call over [keys ; slots]) equals ``reference`` (every earlier run's
path) in float64, forward and gradients, with padding, for every sharing mode, projection kind, order and form; and
``auto`` runs the fused engine, except the causal form on a CPU (the reference's, bit for bit)."""

import random
import types

import pytest
import tiny
import torch
from torch.nn.attention.flex_attention import create_block_mask

from lightning_modules.attention.linformer import causal
from lightning_modules.flops import count_flops

N, D, H, V = 16, 16, 2, 30

BIDIRECTIONAL = {
    "learned": {"k": 4},  # one E per head: compress_first at this size
    "learned_project_first": {"k": 4, "order": "project_first"},  # one batched product over (side, head)
    "random": {"k": 4, "projection": "random"},
    "random_project_first": {"k": 4, "projection": "random", "order": "project_first"},
    "theorem2": {"k": 4, "init": "theorem2"},
    "conv": {"k": 5, "projection": "conv"},  # windows of both sides in one weighted sum
    "pool": {"k": 6, "projection": "pool"},  # w = 3: the last window partly padding
    "pool_project_first": {"k": 6, "projection": "pool", "order": "project_first"},
    "headwise": {"k": 4, "share": "headwise"},
    "headwise_project_first": {"k": 4, "share": "headwise", "order": "project_first"},
    "kv": {"k": 4, "share": "kv"},  # W_v and W_k in one product
    "kv_project_first": {"k": 4, "share": "kv", "order": "project_first"},
    "layerwise": {"k": 4, "share": "layerwise"},
    "nonuniform_k": {"k": [6, 3]},
    "nonuniform_k_layerwise": {"k": [6, 3], "share": "layerwise", "order": "project_first"},
    "key_only": {"k": 4, "compress": "keys"},  # the one-sided forms have one path: both engines run it
    "value_only_conv": {"k": 4, "compress": "values", "projection": "conv"},
}
CAUSAL = {
    "causal": {"k": 5},  # w = 4
    "causal_random_kv": {"k": 5, "projection": "random", "share": "kv"},
    "causal_conv": {"k": 5, "projection": "conv"},
    "causal_pool_headwise": {"k": 7, "projection": "pool", "share": "headwise"},  # w = 3
    "causal_nonuniform_k": {"k": [7, 4]},
    "causal_layerwise": {"k": 3, "share": "layerwise"},  # w = 6
    "causal_k_equal_n": {"k": N},  # w = 1: every earlier token its own slot
}


def pair(options: dict, causal_form: bool = False, n: int = N):
    """Two 2-layer encoders with the same float64 weights (non-zero biases), engines reference and fused."""
    encoders = [
        tiny.encoder(
            tiny.attention(causal=causal_form, engine=engine, **options), vocab=V, random_biases=True, n=n, d=D, h=H
        ).double()
        for engine in ("reference", "fused")
    ]
    encoders[1].load_state_dict(encoders[0].state_dict())
    return encoders


def padding(batch: int, t: int) -> torch.Tensor:
    """Sequence 1 ends in padding; sequence 2 is three real tokens."""
    mask = torch.ones(batch, t, dtype=torch.bool)
    mask[1, 2 * t // 3 :] = False
    mask[2, 3:] = False
    return mask


def outputs_and_gradients(encoder, ids, mask, readout):
    out = encoder(ids, mask)
    params = [p for p in encoder.parameters() if p.requires_grad]
    return out, torch.autograd.grad((out * readout).sum(), params)


@pytest.mark.parametrize("name", BIDIRECTIONAL)
@pytest.mark.parametrize("padded", [False, True])
def test_fused_engine_equals_the_reference_in_float64_outputs_and_gradients(name, padded):
    reference, fused = pair(BIDIRECTIONAL[name])
    ids = torch.randint(0, V, (3, 13))
    mask = padding(3, 13) if padded else None
    real = torch.ones(3, 13, dtype=torch.bool) if mask is None else mask
    readout = torch.randn(3, 13, D, dtype=torch.float64) * real[..., None]
    expected, expected_grads = outputs_and_gradients(reference, ids, mask, readout)
    got, grads = outputs_and_gradients(fused, ids, mask, readout)
    torch.testing.assert_close(got[real], expected[real], atol=1e-12, rtol=1e-12)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)


def test_auto_runs_the_fused_engine_except_the_causal_form_on_a_cpu_which_runs_the_reference_bit_for_bit():
    for options, causal_form, on_cpu in (
        (BIDIRECTIONAL["learned_project_first"], False, "fused"),
        (BIDIRECTIONAL["learned"], False, "fused"),
        (CAUSAL["causal"], True, "reference"),
    ):
        auto = tiny.encoder(tiny.attention(causal=causal_form, **options), vocab=V, n=N, d=D, h=H)
        same = tiny.encoder(tiny.attention(causal=causal_form, engine=on_cpu, **options), vocab=V, n=N, d=D, h=H)
        same.load_state_dict(auto.state_dict())
        ids, mask = torch.randint(0, V, (3, 13)), padding(3, 13)
        assert torch.equal(auto(ids, mask), same(ids, mask))
        with torch.no_grad():
            assert torch.equal(auto(ids), same(ids))
        layer = auto.blocks[0].attn
        assert layer.fused(torch.zeros(1)) == (on_cpu == "fused")
        assert layer.fused(types.SimpleNamespace(device=torch.device("cuda")))


# ----------------------------------------------------------------------------- the causal form on FlexAttention
def dense_flex_attention(q, k, v, block_mask):
    """FlexAttention written out: softmax over the pairs its BlockMask admits (listed tiles and mask_mod), zeros for a
    query that sees none; differentiable on a CPU, where torch has no FlexAttention backward."""
    b, _, t, _ = q.shape
    s = k.shape[2]
    tile = block_mask.BLOCK_SIZE[0]
    tiles = block_mask.to_dense()[:, :, :, :].repeat_interleave(tile, 2).repeat_interleave(tile, 3)[..., :t, :s]
    i, j = torch.arange(t)[:, None], torch.arange(s)[None, :]
    pairs = block_mask.mask_mod(torch.arange(b)[:, None, None, None], 0, i, j) & tiles.bool()  # (B, 1, T, S)
    scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~pairs, torch.finfo(q.dtype).min)
    return (scores.softmax(-1) * pairs.any(-1, keepdim=True)) @ v


def test_the_block_mask_lists_exactly_the_tiles_create_block_mask_finds():
    """Partial and full tiles of [keys ; slots] computed from the block structure equal those torch finds by
    evaluating the mask at every pair, at lengths, windows and tiles that cut blocks and tiles anywhere."""
    rng = random.Random(0)

    def rows(counts, indices):
        return [set(indices[0, 0, r, : counts[0, 0, r]].tolist()) for r in range(counts.shape[-1])]

    for _ in range(120):
        t, w, tile = rng.randint(1, 70), rng.randint(1, 12), rng.choice([4, 8, 16])
        slots = -(-t // w) - 1
        ours = causal.block_mask(t, w, slots, torch.device("cpu"), None, tile)
        dense = create_block_mask(ours.mask_mod, None, None, t, t + slots, device="cpu", BLOCK_SIZE=tile)
        assert rows(ours.kv_num_blocks, ours.kv_indices) == rows(dense.kv_num_blocks, dense.kv_indices), (t, w, tile)
        full = rows(ours.full_kv_num_blocks, ours.full_kv_indices)
        assert full == rows(dense.full_kv_num_blocks, dense.full_kv_indices), (t, w, tile)


@pytest.mark.parametrize("name", CAUSAL)
def test_fused_causal_engine_equals_the_reference_on_eager_flex_attention(name):
    """Forward (Flex has no CPU backward) in float64, tiles of 8 so that T = 45 spans several of them."""
    reference, fused = pair(CAUSAL[name], causal_form=True, n=48)
    for block in fused.blocks:
        block.attn.FLEX_TILE = 8
    ids, mask = torch.randint(0, V, (3, 45)), padding(3, 45)
    with torch.no_grad():
        assert fused.blocks[0].attn.runs_flex(torch.zeros(1, H, 45, D // H), 0.0)
        for m in (None, mask):
            real = torch.ones(3, 45, dtype=torch.bool) if m is None else m
            got = fused(ids, m)
            torch.testing.assert_close(got[real], reference(ids, m)[real], atol=1e-12, rtol=1e-12)
            assert torch.isfinite(got).all()


@pytest.mark.parametrize("name", ["causal", "causal_conv", "causal_pool_headwise", "causal_k_equal_n"])
def test_fused_causal_gradients_equal_the_reference_around_flex_attention(name):
    """Everything around the FlexAttention call (slots, concatenation, block mask, padding) differentiated in float64
    with Flex written out (:func:`dense_flex_attention`); Flex's own backward is torch's."""
    reference, fused = pair(CAUSAL[name], causal_form=True, n=48)
    layer, expected_layer = fused.blocks[0].attn, reference.blocks[0].attn
    layer.FLEX_TILE = 8
    x, mask = torch.randn(3, 45, D, dtype=torch.float64, requires_grad=True), padding(3, 45)
    readout = torch.randn(3, 45, D, dtype=torch.float64) * mask[..., None]
    q, k, v = layer.queries_keys_values(x)
    out = layer.flex_blockwise(q, k, v, mask, attention=dense_flex_attention)
    got = layer.out_proj(out.transpose(1, 2).reshape(x.shape))
    expected = expected_layer(x, mask)
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-12, rtol=1e-12)
    params = [x, *layer.parameters()]
    grads = torch.autograd.grad((got * readout).sum(), params)
    expected_grads = torch.autograd.grad((expected * readout).sum(), [x, *expected_layer.parameters()])
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)


def test_the_causal_fused_engine_runs_the_reference_where_flex_attention_cannot():
    from lightning_modules.analysis import recorded_attention

    layer = tiny.layer(tiny.attention(causal=True, engine="fused", k=4), N, D, H)
    q = torch.randn(1, H, N, D // H)
    assert layer.runs_flex(q, 0.0)
    assert not layer.runs_flex(q, 0.1)  # Flex applies no attention dropout
    assert not layer.runs_flex(q.requires_grad_(), 0.0)  # torch has no CPU FlexAttention backward
    assert not count_flops(lambda: layer.runs_flex(q.detach(), 0.0))[1]  # the count is the reference's
    with recorded_attention(layer) as records:  # analysis reads the probabilities of the reference's SDPA calls
        assert not layer.runs_flex(q.detach(), 0.0)
        with torch.no_grad():
            layer(torch.randn(1, N, D))
    assert records[0]


# ----------------------------------------------------------------------------- compiled: the kernels a GPU runs
@pytest.mark.slow  # compiles FlexAttention for the CPU: ~1 min on 2 cores
def test_compiled_flex_attention_equals_the_reference_causal_rows():
    """The mask_mod (captured position tensors) and the block mask compile, alone and inside a compiled model."""
    from lightning_modules.attention.flex import compiled_flex_attention

    for k in (16, 32):
        torch.manual_seed(0)
        reference, fused = (
            tiny.layer(tiny.attention(causal=True, engine=e, k=k), 256, 32, 2) for e in ("reference", "fused")
        )
        fused.load_state_dict(reference.state_dict())
        x, mask = torch.randn(3, 200, 32), padding(3, 200)
        with torch.no_grad():
            for m in (None, mask):
                real = torch.ones(3, 200, dtype=torch.bool) if m is None else m
                q, key, v = fused.queries_keys_values(x)
                got = fused.flex_blockwise(q, key, v, m, attention=compiled_flex_attention())
                expected = reference.blockwise(*reference.queries_keys_values(x), m, 0.0)
                torch.testing.assert_close(got.transpose(1, 2)[real], expected.transpose(1, 2)[real])
                # the whole layer compiled, for static shapes (torch 2.13's CPU flex template fails to compile a
                # second, dynamic-shape version)
                torch.testing.assert_close(torch.compile(fused, dynamic=False)(x, m)[real], reference(x, m)[real])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: compiled FlexAttention and cuBLAS products")
@pytest.mark.parametrize("options", [{"k": 32}, {"k": 32, "share": "kv"}, {"k": 32, "causal": True}])
def test_on_cuda_the_fused_engine_equals_the_reference_forward_and_backward(options, monkeypatch):
    """float32 (TF32 off), n = 300, 2 layers, padding: the compiled FlexAttention's backward included."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    options = dict(options)
    causal_form = options.pop("causal", False)
    encoders = [
        tiny.encoder(
            tiny.attention(causal=causal_form, engine=e, **options), vocab=V, random_biases=True, n=320, d=64, h=4
        ).cuda()
        for e in ("reference", "fused")
    ]
    encoders[1].load_state_dict(encoders[0].state_dict())
    ids = torch.randint(0, V, (3, 300), device="cuda")
    mask = padding(3, 300).cuda()
    readout = torch.randn(3, 300, 64, device="cuda") * mask[..., None]
    (expected, expected_grads), (got, grads) = (outputs_and_gradients(e, ids, mask, readout) for e in encoders)
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-4, rtol=1e-4)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
