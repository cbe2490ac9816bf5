"""The blocked engine of the pattern kinds (``local``, ``sparse``) as a specification: it computes exactly what
the dense engine (softmax over a materialised T × T mask, the reference) computes, outputs and gradients, with
padding, causal or not, at every length up to n and for any block size; and it never holds a tensor that grows
like T²."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_modules.attention import build_attention

D, H = 16, 2

CASES = {
    "local": ("local", {"window": 7}),
    "local_globals": ("local", {"window": 6, "n_global": 3}),
    "local_wide_globals": ("local", {"window": 3, "n_global": 9}),
    "local_full": ("local", {"window": 40}),
    "sparse_fixed": ("sparse", {"pattern": "fixed", "block": 4, "summary": 2}),
    "sparse_fixed_long_blocks": ("sparse", {"pattern": "fixed", "block": 11}),
    "sparse_strided": ("sparse", {"pattern": "strided", "block": 3, "stride": 5}),
    "sparse_strided_every_key": ("sparse", {"pattern": "strided", "block": 2, "stride": 1}),
}


def pair(kind, options, causal, n, query_block):
    """The same layer on the blocked and on the dense engine."""

    def build(engine):
        torch.manual_seed(0)
        cfg = {"kind": kind, "causal": causal, "options": {**options, "engine": engine}}
        return build_attention({"max_len": n, "d_model": D, "n_heads": H, "attention": cfg})

    blocked, dense = build("blocked"), build("dense")
    blocked.QUERY_BLOCK = query_block
    return blocked, dense


def assert_same_outputs_and_gradients(blocked, dense, x, mask):
    real = torch.ones(x.shape[:2], dtype=torch.bool) if mask is None else mask
    outputs, grads = [], []
    for layer in (blocked, dense):
        xi = x.clone().requires_grad_()
        y = layer(xi, mask)
        assert torch.isfinite(y).all()  # padded queries included
        (y[real] ** 2).sum().backward()
        outputs.append(y[real])
        grads.append((xi.grad, *(p.grad for p in layer.parameters())))
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    for g_blocked, g_dense in zip(*grads):
        torch.testing.assert_close(g_blocked, g_dense, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_blocked_engine_equals_the_dense_engine_with_padding_and_gradients(name, causal):
    kind, options = CASES[name]
    n = 40
    blocked, dense = pair(kind, options, causal, n, query_block=8)
    torch.manual_seed(1)
    for t in (n, 29):  # the whole grid and a shorter batch (windows stay on the n-grid)
        x = torch.randn(3, t, D)
        mask = torch.ones(3, t, dtype=torch.bool)
        mask[1, t - 12 :] = False
        mask[2, t - 1 :] = False
        assert_same_outputs_and_gradients(blocked, dense, x, None)
        assert_same_outputs_and_gradients(blocked, dense, x, mask)


def test_blocked_engine_applies_attention_dropout_in_training_only():
    blocked, _ = pair("local", {"window": 5}, False, 24, query_block=8)
    blocked.dropout = 0.5
    x = torch.randn(2, 24, D)
    with torch.no_grad():
        assert torch.equal(blocked.eval()(x), blocked(x))
        assert not torch.allclose(blocked.train()(x), blocked.eval()(x))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_blocked_engine_equals_the_dense_engine_on_random_patterns(data):
    n = data.draw(st.integers(1, 48), label="n")
    kind = data.draw(st.sampled_from(["local", "fixed", "strided"]), label="kind")
    if kind == "local":
        options = {"window": data.draw(st.integers(1, n)), "n_global": data.draw(st.integers(0, n))}
    elif kind == "fixed":
        block = data.draw(st.integers(1, n))
        options = {"pattern": "fixed", "block": block, "summary": data.draw(st.integers(1, block))}
    else:
        options = {"pattern": "strided", "block": data.draw(st.integers(1, n)), "stride": data.draw(st.integers(1, n))}
    causal = data.draw(st.booleans(), label="causal")
    blocked, dense = pair(kind if kind == "local" else "sparse", options, causal, n, data.draw(st.integers(1, 20)))
    t = data.draw(st.integers(1, n), label="T")
    real = data.draw(st.integers(1, t), label="real tokens of the second sequence")
    torch.manual_seed(0)
    x, mask = torch.randn(2, t, D), torch.ones(2, t, dtype=torch.bool)
    mask[1, real:] = False
    assert_same_outputs_and_gradients(blocked, dense, x, mask)


class LargestTensor(torch.overrides.TorchFunctionMode):
    """The most elements of any tensor a torch function returns or autograd saves for the backward."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def note(self, value):
        if isinstance(value, torch.Tensor):
            self.largest = max(self.largest, value.numel())
        elif isinstance(value, (tuple, list)):
            for item in value:
                self.note(item)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.note(out)
        return out


def largest_tensor_per_head(kind, options, t, causal=False):
    torch.manual_seed(0)
    cfg = {"kind": kind, "causal": causal, "options": {**options, "engine": "blocked"}}
    layer = build_attention({"max_len": t, "d_model": D, "n_heads": H, "attention": cfg})
    x = torch.randn(1, t, D, requires_grad=True)
    mask = torch.ones(1, t, dtype=torch.bool)
    counter = LargestTensor()

    def pack(saved):
        counter.note(saved)
        return saved

    with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved):
        layer(x, mask).sum().backward()
    return counter.largest / H


@pytest.mark.parametrize(
    "kind,options",
    [
        ("local", {"window": 16, "n_global": 2}),
        ("sparse", {"pattern": "fixed", "block": 16}),
        ("sparse", {"pattern": "strided", "block": 16, "stride": 16}),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_blocked_engine_holds_no_tensor_of_t_squared_elements(kind, options, causal):
    t = 1024
    largest = largest_tensor_per_head(kind, options, t, causal)
    assert largest < t * t / 4  # the pattern's pairs: T·(w + b) for local, T·(l + T/l) or T·(b + 2l + T/s) for sparse
    if kind == "local":  # and for a fixed window, linear in T
        assert largest_tensor_per_head(kind, options, 2 * t, causal) <= 2.1 * largest
