"""Performer's FAVOR+ (Choromanski et al. 2021), ``kind: performer``: softmax attention through positive
orthogonal random features, never forming the T × T matrix.

With m = ``n_features`` rows w_f of W (orthogonal in blocks of d_h, each scaled to the norm of a Gaussian
vector) and x scaled by d_h^(−1/4) so that x_q · x_k = q · k / √d_h::

    φ(x)_f  = exp(w_fᵀx − ‖x‖²/2 − c) / √m          E_W[φ(q)·φ(k)] ∝ exp(q·k / √d_h)     (B, h, T, m)
    out_i   = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j)                                O(T·m·d_h)
    causal:   the sums run over j ≤ i (prefix sums)

The constant c cancels in the ratio. Queries use their own max (a per-query constant). Keys use one constant
that does not depend on the data, c = max(0, max_f ‖w_f‖²/2 − 60): since w·x − ‖x‖²/2 ≤ ‖w‖²/2 for every x, no
key feature exceeds e^60 whatever the input, and a future or padded key can change no other position's
numbers, not even by rounding (causality and padding stay exact). φ and the sums are computed in float32
whatever the input's dtype (autocast off inside). Padded keys are zeroed before the sums. There are no
attention probabilities, so no attention dropout (the config check refuses it).

Causal, chunked (C = min(``CHUNK``, T) positions): within a chunk the C × C feature-space scores φ(Q_c) φ(K_c)ᵀ
masked to j ≤ i, across chunks the exclusive prefix sums S_c = Σ_{c' < c} φ(K_c')ᵀ V_c' (m × d_h) and
z_c = Σ_{c' < c} φ(K_c')ᵀ 1: O(T·(C + d_h)·m) time, O((T/C)·m·d_h) memory.

W is a buffer: saved, restored, never redrawn on load. ``redraw`` redraws it in training only: ``never``,
``every_step`` (every training forward), ``every_n_steps`` (every ``redraw_every`` training forwards;
forwards, not optimiser steps, under gradient accumulation). A redraw is seeded by a saved seed and the number
of draws so far, so every DDP rank draws the same W.

Incremental decoding (causal): the running sums S = Σ_{j ≤ t} φ(k_j) v_jᵀ (m × d_h) and z = Σ_{j ≤ t} φ(k_j) (m):
a fixed-size state whatever the position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
from omegaconf import DictConfig
from torch import Tensor

from foundation.errors import check_number, require
from lightning_modules.attention.base import SelfAttention, kind_options, register_attention

CHUNK = 64  # positions per chunk of the causal form
KEY_BOUND = 60.0  # no key feature exceeds e^KEY_BOUND (module docstring)


@dataclass
class PerformerOptions:
    # m: random features per layer (shared by its heads).
    n_features: int = 64
    # When W is redrawn in training: never | every_step | every_n_steps (with redraw_every).
    redraw: Literal["never", "every_step", "every_n_steps"] = "never"
    redraw_every: Optional[int] = None


def orthogonal_features(m: int, d: int, generator: Optional[torch.Generator] = None) -> Tensor:
    """W (m, d): blocks of d orthonormal rows (Q of a Gaussian matrix's QR, signs fixed so Q is Haar-uniform),
    each row scaled to the norm of an independent Gaussian vector, so every row is marginally N(0, I_d)."""
    blocks = []
    for _ in range(-(-m // d)):
        q, r = torch.linalg.qr(torch.randn(d, d, generator=generator))
        blocks.append((q * torch.sign(torch.diagonal(r))).T)
    norms = torch.randn(m, d, generator=generator).norm(dim=1, keepdim=True)
    return torch.cat(blocks)[:m] * norms


@register_attention("performer")
class PerformerAttention(SelfAttention):
    Options = PerformerOptions

    def __init__(self, model: DictConfig, layer: int = 0, shared: Any = None) -> None:
        super().__init__(model, layer, shared)
        opts = kind_options(model.attention)
        self.n_features, self.redraw = int(opts.n_features), str(opts.redraw)
        self.redraw_every = 1 if opts.redraw_every is None else int(opts.redraw_every)
        self.register_buffer("features", orthogonal_features(self.n_features, self.d_head))  # W: (m, d_h)
        self.register_buffer("seed", torch.randint(0, 2**62, ()))
        self.register_buffer("draws", torch.zeros((), dtype=torch.long))  # redraws so far
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))  # training forwards so far

    @classmethod
    def check(cls, model: DictConfig) -> None:
        opts, att = kind_options(model.attention), model.attention
        check_number("model.attention.options.n_features", opts.n_features, 1, 1 << 16, integer=True)
        if opts.redraw == "every_n_steps":
            require(
                opts.redraw_every is not None and opts.redraw_every >= 1,
                f"model.attention.options.redraw_every: redraw=every_n_steps needs an integer >= 1, "
                f"got {opts.redraw_every}",
            )
        else:
            require(
                opts.redraw_every is None,
                f"model.attention.options.redraw_every: {opts.redraw_every} applies "
                f"to redraw=every_n_steps only (redraw is {opts.redraw!r})",
            )
        require(
            att.dropout == 0,
            f"model.attention.dropout: {att.dropout} not allowed for kind 'performer' (FAVOR+ "
            "forms no attention probabilities to drop); set 0 (model.dropout still applies)",
        )

    # ------------------------------------------------------------------------------ random features
    @torch.no_grad()
    def redraw_features(self) -> None:
        """A new W, seeded by (seed, draws): the same on every process. A new tensor, not an in-place copy, so
        a graph still holding the old W (gradient accumulation) stays valid."""
        generator = torch.Generator().manual_seed(int(self.seed) + int(self.draws) + 1)
        w = orthogonal_features(self.n_features, self.d_head, generator)
        self.features = w.to(device=self.features.device, dtype=self.features.dtype)
        self.draws += 1

    def maybe_redraw(self) -> None:
        """Apply the redraw policy at the start of a training forward."""
        if self.redraw == "never":
            return
        if int(self.steps) > 0 and int(self.steps) % self.redraw_every == 0:
            self.redraw_features()
        self.steps += 1

    def feature_map(self, x: Tensor, is_query: bool) -> Tensor:
        """φ(x): (B, h, T, d_h) → (B, h, T, m), in float32."""
        w = self.features.float()  # (m, d_h)
        x = x.float() * self.d_head**-0.25
        logits = x @ w.T - (x * x).sum(-1, keepdim=True) / 2  # w_fᵀx − ‖x‖²/2: (B, h, T, m)
        if is_query:
            shift = logits.amax(-1, keepdim=True).detach()  # per query: cancels in its own ratio
        else:
            shift = ((w * w).sum(-1).amax() / 2 - KEY_BOUND).clamp(min=0)  # one constant for every key
        return (logits - shift).exp() / math.sqrt(self.n_features)

    # ------------------------------------------------------------------------------ FAVOR+
    def attend_qkv(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        if self.training:
            self.maybe_redraw()
        with torch.autocast(q.device.type, enabled=False):  # float32 even under mixed precision
            qf, kf = self.feature_map(q, True), self.feature_map(k, False)  # (B, h, T, m) each
            if mask is not None:
                kf = kf * mask[:, None, :, None]  # padded keys join no sum
            out = self.causal_favor(qf, kf, v.float()) if self.causal else self.favor(qf, kf, v.float())
        return out.to(q.dtype)  # (B, h, T, d_h)

    @staticmethod
    def favor(qf: Tensor, kf: Tensor, v: Tensor) -> Tensor:
        """φ(Q) (φ(K)ᵀ V) / φ(Q) (φ(K)ᵀ 1): (B, h, T, m), (B, h, T, m), (B, h, T, d_h) → (B, h, T, d_h)."""
        kv = kf.transpose(-1, -2) @ v  # Σ_j φ(k_j) v_jᵀ: (B, h, m, d_h)
        z = kf.sum(-2)[..., None]  # Σ_j φ(k_j): (B, h, m, 1)
        return (qf @ kv) / (qf @ z).clamp(min=torch.finfo(qf.dtype).tiny)

    @staticmethod
    def causal_favor(qf: Tensor, kf: Tensor, v: Tensor) -> Tensor:
        """The sums over j ≤ i, chunked (module docstring): same shapes as :meth:`favor`."""
        b, h, t, m = qf.shape
        c = min(CHUNK, t)  # a sequence shorter than a chunk is one chunk of its own length, not padded to CHUNK
        nc = -(-t // c)

        def chunks(x: Tensor) -> Tensor:  # (B, h, T, e) → (B, h, nc, C, e)
            return torch.cat([x, x.new_zeros(b, h, nc * c - t, x.shape[-1])], 2).unflatten(2, (nc, c))

        qc, kc, vc = chunks(qf), chunks(kf), chunks(v)
        kv = kc.transpose(-1, -2) @ vc  # per chunk Σ φ(k) vᵀ: (B, h, nc, m, d_h)
        z = kc.sum(-2)  # per chunk Σ φ(k): (B, h, nc, m)
        s_before = torch.cat([torch.zeros_like(kv[:, :, :1]), kv[:, :, :-1].cumsum(2)], 2)  # chunks c' < c
        z_before = torch.cat([torch.zeros_like(z[:, :, :1]), z[:, :, :-1].cumsum(2)], 2)
        local = (qc @ kc.transpose(-1, -2)).tril()  # φ(q_i)·φ(k_j), j ≤ i: (B, h, nc, C, C)
        num = qc @ s_before + local @ vc  # (B, h, nc, C, d_h)
        den = qc @ z_before[..., None] + local.sum(-1, keepdim=True)  # (B, h, nc, C, 1)
        out = num / den.clamp(min=torch.finfo(qf.dtype).tiny)
        return out.flatten(2, 3)[:, :, :t]

    # ------------------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int, capacity: int, device: Any = None, dtype: Any = None) -> dict:
        """The running sums ``s`` (B, h, m, d_h) and ``z`` (B, h, m), float32; ``t`` the next position."""
        if not self.causal:
            return super().init_state(batch_size, capacity, device, dtype)
        return {
            "t": 0,
            "s": torch.zeros(batch_size, self.n_heads, self.n_features, self.d_head, device=device),
            "z": torch.zeros(batch_size, self.n_heads, self.n_features, device=device),
        }

    def step(self, x: Tensor, state: dict) -> tuple[Tensor, dict]:
        """S += φ(k_t) v_tᵀ, z += φ(k_t); out = φ(q_t)ᵀ S / φ(q_t)ᵀ z: x (B, 1, d) → ((B, 1, d), state)."""
        q = self.heads(self.q_proj(x))  # (B, h, 1, d_h)
        k, v = self.keys_values(x)
        with torch.autocast(x.device.type, enabled=False):
            qf, kf = self.feature_map(q, True), self.feature_map(k, False)  # (B, h, 1, m)
            state["s"] += kf.transpose(-1, -2) @ v.float()  # (B, h, m, d_h)
            state["z"] += kf[:, :, 0]
            out = (qf @ state["s"]) / (qf @ state["z"][..., None]).clamp(min=torch.finfo(qf.dtype).tiny)
        state["t"] += 1
        return self.merge_step(out.to(x.dtype)), state
