"""Streaming decode: time per token at a position, causal Linformer against a growing KV cache.

Both models are whole causal encoders built from config dicts and stepped token by token through
``TransformerEncoder.decode_step(input_ids_t (B,), state) -> (hidden (B, d), state)`` from
``init_decode_state(B)``. Causal Linformer's state has a fixed size per layer and head (k slots and
a block of w = n/k keys), so a step should cost O((k + w)·d) wherever it is; full attention's
key/value cache grows, so its step costs O(t·d) at position t. After a warm-up on a throwaway state,
the two models are stepped alternately (paired, like the other cases); the time at position p is the
median over the ``window`` steps just before p.
"""

from __future__ import annotations

import time

import torch

from experiments.benchmarks.cases import Shape, model_config
from experiments.benchmarks.measure import median, synchronize
from lightning_modules.encoder import TransformerEncoder


def decode_seconds(positions: list[int], k: int, shape: Shape, window: int) -> dict[str, dict[int, float]]:
    """{"causal": {p: s/token}, "sdpa": {p: s/token}} for each position p (needs p ≥ window)."""
    if not hasattr(TransformerEncoder, "decode_step"):
        raise NotImplementedError("TransformerEncoder.decode_step does not exist yet")
    length = max(positions)
    models = {}
    for variant in ("causal", "sdpa"):
        torch.manual_seed(0)
        cfg = model_config("model", variant, k, "auto", length, shape, causal=True)
        models[variant] = TransformerEncoder(cfg, shape.vocab).to(device=shape.device, dtype=shape.dtype).eval()
    ids = torch.randint(0, shape.vocab, (shape.batch, length), device=shape.device)
    steps: dict[str, list[float]] = {name: [] for name in models}
    with torch.inference_mode():
        for model in models.values():  # warm-up on a throwaway state: first calls are slow
            state = model.init_decode_state(shape.batch)
            for t in range(min(length, 2 * window)):
                _, state = model.decode_step(ids[:, t], state)
        states = {name: m.init_decode_state(shape.batch) for name, m in models.items()}
        for t in range(length):
            for name in list(models) if t % 2 == 0 else list(models)[::-1]:
                synchronize(shape.device)
                start = time.perf_counter()
                _, states[name] = models[name].decode_step(ids[:, t], states[name])
                synchronize(shape.device)
                steps[name].append(time.perf_counter() - start)
    return {name: {p: median(s[max(0, p - window) : p]) for p in positions} for name, s in steps.items()}
