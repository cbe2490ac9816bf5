"""Causal Linformer beyond the contract every kind keeps (no output sees a later token, incremental decoding equals
the parallel forward: ``tests/lightning_modules/attention/test_contract.py``): its decoding state has a fixed size,
its block mask is built once, its chunked rows equal the written-out form, and a causal LM learns on the embedded
corpus."""

import json
import math

import pytest
import tiny
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny import run_of

from experiments import cli

N, D, H, V = 14, 16, 2, 30

CAUSAL = {
    "learned": {"k": 4},  # w = 4: blocks 4,4,4,2 (T = 14 is not a multiple)
    "conv": {"k": 4, "projection": "conv"},
    "nonuniform_k": {"k": [7, 4, 2], "share": "none"},  # w = 2, 4, 7 per layer
}


def test_the_check_catches_a_dense_e_that_mixes_the_future():
    """The same check on bidirectional Linformer: a dense E puts token t into every slot."""
    torch.manual_seed(0)
    enc = tiny.encoder(tiny.attention(k=4), vocab=V, n=N, d=D, h=H, layers=1).eval()
    ids = torch.randint(0, V, (1, N))
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % V
    assert not torch.allclose(enc(changed)[:, 0], enc(ids)[:, 0])


@pytest.mark.parametrize("name", ["learned", "conv", "nonuniform_k"])
def test_linformer_decoding_state_has_a_fixed_size(name):
    """Per layer and head: the completed slots (≤ k) and the current block (w rows), whatever t."""
    enc = tiny.encoder(
        tiny.attention(causal=True, **CAUSAL[name]), vocab=V, random_biases=True, n=N, d=D, h=H, layers=3
    ).eval()
    state = enc.init_decode_state(2)

    def shapes():
        return [{key: tuple(v.shape) for key, v in layer.items() if torch.is_tensor(v)} for layer in state["layers"]]

    before = shapes()
    for layer, attention in zip(before, (block.attn for block in enc.blocks)):
        k, w = attention.bank.ks[attention.layer], attention.bank.window(attention.layer)
        assert layer["slot_k"] == layer["slot_v"] == (2, H, math.ceil(N / w) - 1, D // H) and math.ceil(N / w) <= k
        assert layer["block_k"] == layer["block_v"] == (2, H, w, D // H)
    for _ in range(N):
        enc.decode_step(torch.randint(0, V, (2,)), state)
        assert shapes() == before


def test_the_block_mask_is_built_once_per_shape_not_in_every_layer_and_step(monkeypatch):
    """Without padding, causal Linformer's visibility mask depends on (B, T, w) only: the layers and steps
    after the first reuse it (the same outputs as with an all-True mask, which builds it)."""
    enc = tiny.encoder(
        tiny.attention(causal=True, **CAUSAL["learned"]), vocab=V, random_biases=True, n=N, d=D, h=H, layers=3
    ).eval()
    ids = torch.randint(5, V, (2, N))
    with torch.no_grad():
        first = enc(ids)
        fills, fill = [], torch.Tensor.masked_fill_
        monkeypatch.setattr(torch.Tensor, "masked_fill_", lambda t, *a: fills.append(t.shape) or fill(t, *a))
        again = enc(ids)
        monkeypatch.undo()
        padded_form = enc(ids, torch.ones(2, N, dtype=torch.bool))
    assert fills == []
    torch.testing.assert_close(again, first)
    torch.testing.assert_close(padded_form, first, atol=1e-5, rtol=1e-5)
    enc.train()
    enc(ids).sum().backward()  # a mask first built without autograd serves a training step
    with torch.inference_mode():
        enc(ids[:1])  # one built in inference mode (which autograd cannot save) does not
    enc(ids[:1]).sum().backward()


def explicit_causal_linformer(layer, x, mask):
    """Causal Linformer written out: one softmax per query over [slots j < ⌊i/w⌋ (non-empty) ; real keys of its
    own block up to i], every score materialised (B, h, T, nb − 1 + T)."""
    q, (k, v) = layer.heads(layer.q_proj(x)), layer.keys_values(x)
    t, w = x.shape[1], layer.bank.window(layer.layer)
    past = (math.ceil(t / w) - 1) * w
    past_mask = None if mask is None else mask[:, :past]
    sk = layer.bank.compress(layer.layer, 0, k[:, :, :past], past_mask)  # (B, h, nb-1, d_h)
    sv = layer.bank.compress(layer.layer, 1, v[:, :, :past], past_mask)
    i = torch.arange(t)
    slot_ok = torch.arange(sk.shape[2])[None, :] < (i // w)[:, None]  # (T, nb-1)
    local_ok = (i[None, :] // w == i[:, None] // w) & (i[None, :] <= i[:, None])  # (T, T)
    if mask is not None:
        nonempty = layer.bank.nonempty_slots(layer.layer, past_mask)  # (B, nb-1)
        slot_ok, local_ok = slot_ok & nonempty[:, None, :], local_ok & mask[:, None, :]
    visible = torch.cat([slot_ok, local_ok], -1)  # (T, S) or (B, T, S)
    visible = visible if mask is None else visible[:, None]
    scores = torch.cat([q @ sk.transpose(-1, -2), q @ k.transpose(-1, -2)], -1) / math.sqrt(layer.d_head)
    p = scores.masked_fill(~visible, float("-inf")).softmax(-1).nan_to_num()  # padded queries: zeros
    out = p @ torch.cat([sv, v], 2)  # (B, h, T, d_h)
    return layer.out_proj(out.transpose(1, 2).reshape(x.shape))


@pytest.mark.parametrize("rows_per_call", [1, 3, 10**9])  # every row its own call, 3 rows per call, one call
@pytest.mark.parametrize("padded", [False, True])
def test_chunked_rows_equal_the_written_out_causal_linformer(rows_per_call, padded, monkeypatch):
    """T = 45, w = 4, d_h = 4: rows of u = 8 queries, 6 rows (the last one padded), 11 blocks."""
    from lightning_modules.attention.linformer import CausalLinformer

    monkeypatch.setattr(CausalLinformer, "rows_per_call", staticmethod(lambda t, u, nb: rows_per_call))
    torch.manual_seed(0)
    n, d = 45, 16
    layer = tiny.layer(tiny.attention(causal=True, k=12), n, d, 4)
    x = torch.randn(2, n, d, requires_grad=True)
    mask = None
    if padded:  # sequence 1: 29 real tokens, then padding
        mask = torch.ones(2, n, dtype=torch.bool)
        mask[1, 29:] = False
    real = torch.ones(2, n, dtype=torch.bool) if mask is None else mask
    expected = explicit_causal_linformer(layer, x, mask)
    with torch.no_grad():  # written over the queries, chunk by chunk
        torch.testing.assert_close(layer(x, mask)[real], expected[real], atol=1e-5, rtol=1e-5)
    got = layer(x, mask)  # with autograd: the chunks concatenated
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)
    weights = torch.randn_like(got) * real[..., None]
    grad = torch.autograd.grad((got * weights).sum(), x)[0]
    torch.testing.assert_close(grad, torch.autograd.grad((expected * weights).sum(), x)[0], atol=1e-5, rtol=1e-5)


def test_full_attention_decodes_with_a_kv_cache():
    enc = tiny.encoder(tiny.attention("full", causal=True), vocab=V, random_biases=True, n=N, d=D, h=H, layers=3).eval()
    state = enc.init_decode_state(2)
    assert all(layer["k"].shape == (2, H, N, D // H) for layer in state["layers"])


def test_decoding_past_max_len_or_without_causal_attention_is_an_error():
    enc = tiny.encoder(tiny.attention(causal=True, k=4), vocab=V, random_biases=True, n=N, d=D, h=H, layers=1).eval()
    state = enc.init_decode_state(1)
    for _ in range(N):
        enc.decode_step(torch.zeros(1, dtype=torch.long), state)
    with pytest.raises(ValueError, match=f"decoding position {N} exceeds model.max_len={N}"):
        enc.decode_step(torch.zeros(1, dtype=torch.long), state)
    bidirectional = tiny.encoder(tiny.attention(k=4), vocab=V, n=N, d=D, h=H, layers=1)
    with pytest.raises(ValueError, match="incremental decoding needs causal attention"):
        bidirectional.init_decode_state(1)


# ----------------------------------------------------------------------------- causal LM end to end
def _train_losses(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("train/loss")], [e.value for e in acc.Scalars("val/loss")]


def test_causal_linformer_lm_learns_on_the_embedded_corpus(tiny_overrides, tmp_path):
    args = [
        "train",
        str(tiny_overrides.config),
        *tiny_overrides.args,
        "task=clm",
        "model.attention.causal=true",
        "trainer.max_steps=40",
        "trainer.val_check_interval=20",
        "optim.lr=3e-3",
        "optim.warmup_steps=5",
    ]
    assert cli.main(args) == 0
    run = run_of(tmp_path / "runs" / "tiny")
    train, val = _train_losses(run)
    metrics = json.loads((run / "metrics.json").read_text())
    assert math.isfinite(metrics["val/loss"]) and metrics["global_step"] == 40
    # From about ln(vocab) at the start, clearly down, and still falling on held-out text.
    assert sum(train[-10:]) / 10 < sum(train[:3]) / 3 - 1.0
    assert val[-1] < val[0]


def test_causal_full_attention_lm_runs_end_to_end(tiny_overrides, tmp_path):
    args = [
        "train",
        str(tiny_overrides.config),
        *tiny_overrides.args,
        "task=clm",
        "model.attention.causal=true",
        "model.attention.kind=full",
    ]
    assert cli.main(args) == 0
    metrics = json.loads((run_of(tmp_path / "runs" / "tiny") / "metrics.json").read_text())
    assert math.isfinite(metrics["val/ppl"]) and metrics["projection_parameters"] == 0


@pytest.mark.parametrize("n, k", [(2048, 64), (3000, 100)])
def test_causal_linformer_forward_holds_no_more_memory_than_causal_sdpa(n, k):
    """Inference forward of one layer (B = 2, d = 64, 2 heads), peak bytes above the start, same process:
    the rows' calls write over the consumed queries, so nothing of length T beyond Q, K, V is held."""
    from experiments.benchmarks import cases
    from experiments.benchmarks.measure import peak_memory_bytes

    shape = cases.Shape(
        d_model=64, n_heads=2, n_layers=1, d_ff=256, vocab=V, batch=2, dtype=torch.float32, device=torch.device("cpu")
    )
    peaks = []
    for variant, kk, causal in [("sdpa", None, True), ("causal", k, False)]:
        case = cases.build("layer", "fwd", variant, kk, "auto", n, shape, causal=causal)
        case.run()  # warm-up: the cached mask of the unpadded shape is built here
        peaks.append(peak_memory_bytes(case.run, shape.device))
    sdpa, linformer = peaks
    assert linformer <= sdpa, f"causal Linformer {linformer / 2**20:.2f} MiB > causal SDPA {sdpa / 2**20:.2f} MiB"
