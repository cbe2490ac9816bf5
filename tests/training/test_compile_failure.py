"""A failed ``torch.compile`` inside a run is one line naming ``trainer.compile`` and the way out
(lightning_modules/callbacks.py, ``CompileFailed``): at the compile call, and at the compiled model's first call."""

import pytest
import torch

from experiments import cli


def test_a_compile_that_raises_is_one_line_naming_the_setting(tiny_overrides, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated: no compiler for this machine")

    monkeypatch.setattr(torch, "compile", broken)
    code = cli.main(["train", str(tiny_overrides.config), *tiny_overrides.args, "trainer.compile=true"])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("INFO: ")]  # Lightning's
    assert code == 2 and len(err) == 1
    assert err[0].startswith("error: trainer.compile: torch.compile failed") and "trainer.compile=false" in err[0]


def test_a_compiled_model_that_fails_at_its_first_call_is_one_line_too(tiny_overrides, monkeypatch, capsys):
    from torch._dynamo.exc import BackendCompilerFailed

    def compiled(fn, *args, **kwargs):
        def call(*a, **k):
            raise BackendCompilerFailed(fn, RuntimeError("simulated: inductor could not build a kernel"), None)

        return call

    monkeypatch.setattr(torch, "compile", compiled)
    code = cli.main(["train", str(tiny_overrides.config), *tiny_overrides.args, "trainer.compile=true"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "trainer.compile=false" in err[-1] and "BackendCompilerFailed" in err[-1]


@pytest.mark.parametrize("compiling", [False, True])
def test_other_failures_stay_what_they_are(compiling):
    from lightning_modules.callbacks import compile_failures

    with pytest.raises(ValueError, match="not a compiler's"):
        with compile_failures(compiling):
            raise ValueError("not a compiler's")
