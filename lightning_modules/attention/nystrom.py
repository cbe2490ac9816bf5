"""Nyströmformer (Xiong et al. 2021), ``kind: nystrom``: softmax attention through m landmarks.

Landmark j is the mean of the real queries (keys) at positions [j·s, (j+1)·s) of the n = ``max_len`` grid,
s = ⌈n/m⌉ (m = ``n_landmarks``; ⌈n/s⌉ ≤ m landmarks exist)::

    F̃ = softmax(Q K̃ᵀ/√d_h)   (T × m)      Ã = softmax(Q̃ K̃ᵀ/√d_h)   (m × m)      B̃ = softmax(Q̃ Kᵀ/√d_h)   (m × T)
    head_i = F̃ Ã⁺ (B̃ V_i)                                                      (B, h, T, d_h)     O(T·m·d + m³)

Ã⁺ is the iterative Moore–Penrose inverse the paper uses (Razavi et al. 2014), ``pinv_iterations`` steps of
Z ← ¼ Z (13I − ÃZ (15I − ÃZ (7I − ÃZ))) from Z₀ = Ãᵀ / (‖Ã‖₁ ‖Ã‖_∞), per matrix, in float32. With m = n every
landmark is one token, Ã = F̃ = B̃ = softmax(Q Kᵀ/√d_h) and F̃ Ã⁺ B̃ = Ã: full attention (as far as the iteration
converges).

Padding: landmarks average real tokens only and sit on the n-grid, never on the batch's length; a landmark with
no real token is left out (its column of F̃ is zero, its row and column of Ã the identity's, which the
iteration's scaling ignores: Ã's largest column sum is ≥ 1), and B̃ sees real keys only. So appending padding
changes no real token's output. The paper's depthwise-convolution skip on V is not part of the kind.

Non-causal only (``has_causal_form = False``): every landmark mixes a whole segment, future included. No
attention dropout (the config check refuses it): F̃ Ã⁺ B̃ is not a matrix of probabilities. No streaming form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from omegaconf import DictConfig
from torch import Tensor

from foundation.errors import check_number, require
from lightning_modules.attention.base import SelfAttention, register_attention
from lightning_modules.config import kind_options


@dataclass
class NystromOptions:
    # m: landmarks (segment means of length ⌈max_len/m⌉).
    n_landmarks: int = 64
    # Steps of the iterative pseudo-inverse of Ã.
    pinv_iterations: int = 6


def iterative_pinv(a: Tensor, iterations: int) -> Tensor:
    """Ã⁺ of each (…, m, m) matrix by the module docstring's iteration."""
    eye = torch.eye(a.shape[-1], device=a.device, dtype=a.dtype)
    scale = a.abs().sum(-2).amax(-1, keepdim=True) * a.abs().sum(-1).amax(-1, keepdim=True)  # ‖Ã‖₁‖Ã‖_∞: (…, 1)
    z = a.transpose(-1, -2) / scale[..., None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


@register_attention("nystrom")
class NystromAttention(SelfAttention):
    Options = NystromOptions
    has_causal_form = False

    def __init__(self, model: DictConfig, layer: int = 0, shared: Any = None) -> None:
        super().__init__(model, layer, shared)
        opts = kind_options(model.attention)
        self.pinv_iterations = int(opts.pinv_iterations)
        self.segment = -(-int(model.max_len) // int(opts.n_landmarks))  # s = ⌈n/m⌉
        self.n_landmarks = -(-int(model.max_len) // self.segment)  # ⌈n/s⌉ ≤ m

    @classmethod
    def check(cls, model: DictConfig) -> None:
        opts, att, n = kind_options(model.attention), model.attention, model.max_len
        require(
            1 <= opts.n_landmarks <= n,
            f"model.attention.options.n_landmarks: {opts.n_landmarks} must be in "
            f"[1, model.max_len={n}] (n_landmarks = max_len is full attention)",
        )
        check_number("model.attention.options.pinv_iterations", opts.pinv_iterations, 1, 1000, integer=True)
        require(
            att.dropout == 0,
            f"model.attention.dropout: {att.dropout} not allowed for kind 'nystrom' (F̃Ã⁺B̃ "
            "is not a matrix of probabilities to drop); set 0 (model.dropout still applies)",
        )

    def landmarks(self, x: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
        """Segment means of the real rows: x (B, h, T, d_h), real (B, 1, T, 1) → ((B, h, L, d_h), present (B, 1, L))."""
        b, h, t, d = x.shape
        length = self.n_landmarks * self.segment  # ≥ T: the n-grid, whatever T is
        sums = torch.zeros(b, h, length, d, device=x.device, dtype=x.dtype)
        sums[:, :, :t] = x * real
        counts = torch.zeros(b, 1, length, device=x.device, dtype=x.dtype)
        counts[:, :, :t] = real[..., 0]
        sums = sums.unflatten(2, (self.n_landmarks, self.segment)).sum(3)  # (B, h, L, d_h)
        counts = counts.unflatten(2, (self.n_landmarks, self.segment)).sum(3)  # (B, 1, L)
        return sums / counts.clamp(min=1)[..., None], counts > 0

    def attend_qkv(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        b, _, t, _ = q.shape
        real = torch.ones(b, t, dtype=torch.bool, device=q.device) if mask is None else mask
        weight = real[:, None, :, None].to(q.dtype)  # (B, 1, T, 1)
        q_l, present = self.landmarks(q, weight)  # Q̃ (B, h, L, d_h), present (B, 1, L)
        k_l, _ = self.landmarks(k, weight)  # K̃
        scale, lowest = self.d_head**-0.5, torch.finfo(q.dtype).min

        def softmax(scores: Tensor, keep: Tensor) -> Tensor:  # over the last axis, hidden where not keep
            return (scores * scale).masked_fill(~keep, lowest).softmax(-1)

        f = softmax(q @ k_l.transpose(-1, -2), present[:, :, None, :])  # F̃: (B, h, T, L)
        a = softmax(q_l @ k_l.transpose(-1, -2), present[:, :, None, :])  # Ã: (B, h, L, L)
        both = present[:, :, :, None] & present[:, :, None, :]  # (B, 1, L, L)
        a = torch.where(both, a, torch.eye(self.n_landmarks, device=q.device, dtype=q.dtype))  # absent: identity
        bt = softmax(q_l @ k.transpose(-1, -2), real[:, None, None, :])  # B̃: (B, h, L, T)
        with torch.autocast(q.device.type, enabled=False):  # the iteration needs float32
            pinv = iterative_pinv(a.float(), self.pinv_iterations).to(a.dtype)  # Ã⁺: (B, h, L, L)
        return (f @ pinv) @ (bt @ v)  # (B, h, T, d_h)
