"""A Transformer encoder with pluggable self-attention (any registered attention kind).

Token embeddings plus positions, L blocks, then (pre-LN) a final LayerNorm. Positions (``model.position``) are
added to the input, so every attention kind sees them the same way: ``learned`` is a trained table P ∈ R^{n×d}
drawn from N(0, s²); ``sinusoidal`` is the fixed table P[t, 2i] = sin(t/10000^{2i/d}), P[t, 2i+1] = cos(…), times
s·√2 so that its entries have rms s (s = ``model.position_scale``). A block is

* ``pre``  (default): x ← x + Attn(LN(x));  x ← x + FFN(LN(x))   — trains without LR tricks;
* ``post`` (BERT/RoBERTa, the paper's setting): x ← LN(x + Attn(x));  x ← LN(x + FFN(x)).

FFN(x) = W₂ GELU(W₁ x + b₁) + b₂ with W₁ ∈ R^{d_ff×d}. What a kind shares across layers (its
:meth:`~lightning_modules.attention.base.SelfAttention.build_shared`, e.g. Linformer's E/F) is built once and
registered here as ``shared``; ``attention_class`` is the class of every layer (whose hooks callers ask).

Incremental decoding (causal attention only), for generation and for timing the causal variants::

    state = encoder.init_decode_state(batch_size)
    for t in range(T):
        hidden_t, state = encoder.decode_step(input_ids[:, t], state)   # (B,) → (B, d)

``hidden_t`` equals ``encoder(input_ids)[:, t]`` (eval mode). Each layer keeps its own state
(:meth:`SelfAttention.init_state`): a fixed-size one for causal Linformer, a KV cache for full attention.
The model's config is checked (:func:`~lightning_modules.attention.check_model`) before anything is built.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from lightning_modules.attention import (
    InputProjections,
    SelfAttention,
    attention_class,
    check_model,
    misplaced_option,
)
from lightning_modules.config import model_config


class Block(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float, norm: str, attention: SelfAttention) -> None:
        super().__init__()
        self.norm = norm
        self.attn = attention
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return self._residuals(x, lambda h: self.attn(h, mask))

    def step(self, x: Tensor, state: dict) -> Tensor:
        """One decoding position: x (B, 1, d) → (B, 1, d); ``state`` is this layer's, updated in place."""
        return self._residuals(x, lambda h: self.attn.step(h, state)[0])

    def _residuals(self, x: Tensor, attend: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm == "pre":
            x = x + self.drop(attend(self.ln1(x)))
            return x + self.drop(self.ffn(self.ln2(x)))
        x = self.ln1(x + self.drop(attend(x)))
        return self.ln2(x + self.drop(self.ffn(x)))


class TransformerEncoder(nn.Module):
    """input_ids (B, T) [+ mask (B, T) bool, True at real tokens] → hidden states (B, T, d)."""

    def __init__(self, cfg: Any, vocab_size: int) -> None:
        super().__init__()
        cfg = model_config(cfg, misplaced_option)
        check_model(cfg)
        self.max_len, self.vocab_size = cfg.max_len, vocab_size
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.pos.weight.requires_grad_(cfg.position == "learned")
        self.drop = nn.Dropout(cfg.dropout)
        self.attention_class = attention = attention_class(cfg)
        self.shared = attention.build_shared(cfg)  # None, or one module every layer shares (registered here, once)
        self.blocks = nn.ModuleList(
            Block(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.norm, attention(cfg, i, self.shared))
            for i in range(cfg.n_layers)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.apply(functools.partial(init_weights, std=cfg.init_std))
        with torch.no_grad():
            if cfg.position == "learned":
                self.pos.weight.normal_(0.0, cfg.position_scale)
            else:
                self.pos.weight.copy_(sinusoidal_positions(cfg.max_len, cfg.d_model) * cfg.position_scale * 2**0.5)

    def forward(self, input_ids: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        t = input_ids.shape[1]
        if t > self.max_len:
            raise ValueError(f"sequence length {t} exceeds model.max_len={self.max_len}")
        x = self.tok(input_ids) + self.pos.weight[:t]  # (B, T, d)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_f(x)

    def init_decode_state(self, batch_size: int) -> dict:
        """Empty decoding state: the next ``position`` and one state per layer (see module docstring)."""
        weight = self.tok.weight
        return {
            "position": 0,
            "layers": [
                block.attn.init_state(batch_size, self.max_len, device=weight.device, dtype=weight.dtype)
                for block in self.blocks
            ],
        }

    @torch.no_grad()
    def decode_step(self, input_ids_t: Tensor, state: dict) -> tuple[Tensor, dict]:
        """The hidden state at the next position: input_ids_t (B,) → ((B, d), state updated in place).

        Cost per token: O(L·(k + w)·d + L·d²) for causal Linformer, O(L·t·d + L·d²) for full attention.
        """
        t = state["position"]
        if t >= self.max_len:
            raise ValueError(f"decoding position {t} exceeds model.max_len={self.max_len}")
        x = self.drop(self.tok(input_ids_t)[:, None] + self.pos.weight[t])  # (B, 1, d)
        for block, layer_state in zip(self.blocks, state["layers"]):
            x = block.step(x, layer_state)
        state["position"] = t + 1
        return self.ln_f(x)[:, 0], state


def sinusoidal_positions(n: int, d: int) -> Tensor:
    """(n, d): entry (t, 2i) = sin(t / 10000^{2i/d}), (t, 2i + 1) = cos(t / 10000^{2i/d}) (Vaswani et al. 2017)."""
    t = torch.arange(n, dtype=torch.float64)[:, None]  # (n, 1)
    frequency = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (⌈d/2⌉,)
    table = torch.zeros(n, d, dtype=torch.float64)
    table[:, 0::2] = torch.sin(t * frequency)
    table[:, 1::2] = torch.cos(t * frequency[: d // 2])
    return table.float()


def init_weights(module: nn.Module, std: float) -> None:
    """N(0, std²) for linear and embedding weights (BERT: std = 0.02); zero biases. E/F keep their own."""
    if isinstance(module, InputProjections):
        module.normal_(std)
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def count_parameters(module: nn.Module, trainable_only: bool = True) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
