"""The fused engine is checked against the reference on its first use per shape (lightning_modules/attention/
linformer/engines.py): a fused engine that returns wrong values is caught on a small input, one line says so, and the
layer runs the reference engine; one that agrees runs."""

import pytest
import tiny
import torch

from lightning_modules.attention.linformer import engines
from lightning_modules.attention.linformer.bidirectional import Linformer
from lightning_modules.attention.linformer.causal import CausalLinformer

N, D, H, V = 16, 16, 2, 30


@pytest.fixture(autouse=True)
def fresh_checks(monkeypatch):
    monkeypatch.setattr(engines, "_CHECKED", {})


def outputs(causal_form: bool, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The reference engine's and the fused engine's outputs of one encoder's weights."""
    encoders = [
        tiny.encoder(tiny.attention(causal=causal_form, engine=engine, k=4), vocab=V, n=N, d=D, h=H)
        for engine in ("reference", "fused")
    ]
    encoders[1].load_state_dict(encoders[0].state_dict())
    with torch.no_grad():  # on a CPU FlexAttention runs without autograd only (the causal fused engine)
        return [e.eval()(tokens) for e in encoders]


def test_a_fused_engine_that_returns_wrong_values_falls_back_to_the_reference_with_one_line(monkeypatch, capsys):
    right = Linformer.fused_keys_values

    def wrong(self, x, mask):
        k, v = right(self, x, mask)
        return k + 0.5, v

    monkeypatch.setattr(Linformer, "fused_keys_values", wrong)
    tokens = torch.randint(0, V, (3, N))
    reference, fused = outputs(False, tokens)
    torch.testing.assert_close(fused, reference)  # the reference engine ran
    lines = [line for line in capsys.readouterr().err.splitlines() if "fused engine differs" in line]
    assert len(lines) == 1  # one line for the shape both layers share, not one per layer or call


def test_a_causal_fused_engine_that_returns_wrong_values_falls_back_too(monkeypatch, capsys):
    right = CausalLinformer.flex_blockwise
    monkeypatch.setattr(CausalLinformer, "flex_blockwise", lambda self, *a, **k: right(self, *a, **k) * 2)
    tokens = torch.randint(0, V, (2, N))
    reference, fused = outputs(True, tokens)
    torch.testing.assert_close(fused, reference)
    assert "fused engine differs" in capsys.readouterr().err


def test_a_fused_engine_that_agrees_runs_and_says_nothing(monkeypatch, capsys):
    calls = []
    right = Linformer.fused_keys_values

    def counted(self, x, mask):
        calls.append(x.shape[0])
        return right(self, x, mask)

    monkeypatch.setattr(Linformer, "fused_keys_values", counted)
    tokens = torch.randint(0, V, (3, N))
    reference, fused = outputs(False, tokens)
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-5)
    assert calls.count(3) == 2  # both layers ran the fused engine on the whole batch
    assert calls.count(1) == 1  # after one check on one sequence (the layers share a shape)
    assert "fused engine" not in capsys.readouterr().err
