"""What the tests of the attention kinds beyond Linformer share: their sizes, a case of ``tiny.KINDS`` as a
``model.attention`` node, the weights every kind shares, full attention beside another kind, a padding mask."""

import tiny
import torch

N, D, H, V = 16, 16, 2, 30


def attention(name, causal=False, **extra):
    """The ``model.attention`` node of case ``name`` of ``tiny.KINDS``, its options updated by ``extra``."""
    kind, options = tiny.KINDS[name]
    return tiny.attention(kind, causal, **{**options, **extra})


def same_weights(source, *targets):
    """Copy the Q/K/V/O weights every kind shares (lsh has no W_k: it is skipped there)."""
    with torch.no_grad():
        for target in targets:
            for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
                mine, theirs = getattr(source, name), getattr(target, name)
                if mine is not None and theirs is not None:
                    theirs.weight.copy_(mine.weight)
                    theirs.bias.copy_(mine.bias)


def full_and(cfg, n=N, h=H):
    """Full attention and the layer of attention node ``cfg``, drawn from seed 0, with the same Q/K/V/O weights."""
    torch.manual_seed(0)
    full = tiny.layer({"kind": "full", "causal": cfg.get("causal", False)}, n=n, h=h)
    other = tiny.layer(cfg, n=n, h=h)
    same_weights(full, other)
    return full, other


def padding_mask(batch=3, t=N, real=10):
    """A padding mask of ``batch`` rows of t positions: every row real but the last, ``real`` tokens then padding."""
    mask = torch.ones(batch, t, dtype=torch.bool)
    mask[-1, real:] = False
    return mask
