"""What keeps the project safe to run, read off its code and its Makefile: checkpoints load weights only, YAML loads
safely, nothing unpickles, and the servers bind to the loopback interface."""

from __future__ import annotations

import re

from tiny import REPO

SOURCES = [
    p
    for d in ("foundation", "training", "experiments", "lightning_modules", "datamodules", "sweeps")
    for p in (REPO / d).rglob("*.py")
]


def test_checkpoints_load_weights_only_and_yaml_loads_safely():
    """Every torch.load and every Lightning checkpoint load passes weights_only=True; YAML is only read with safe_load; nothing unpickles."""
    for path in SOURCES:
        text = path.read_text()
        for call in re.findall(r"torch\.load\((?:[^()]|\([^()]*\))*\)", text):
            assert "weights_only=True" in call, f"{path}: {call}"
        # Lightning's loads: fit/validate/test/predict(ckpt_path=...) and load_from_checkpoint pickle unless told
        for call in re.findall(r"\.(?:fit|validate|test|predict|load_from_checkpoint)\((?:[^()]|\([^()]*\))*\)", text):
            if "ckpt_path=" in call or "load_from_checkpoint" in call:
                assert "weights_only=True" in call, f"{path}: {call}"
        assert not re.search(r"yaml\.(load|unsafe_load|full_load)\(", text), path
        assert not re.search(r"pickle\.loads?\(", text), path


def test_servers_bind_to_loopback():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^HOST \?= 127\.0\.0\.1$", makefile, re.M)
    for server in ("tensorboard", "linformer-lab dashboard"):
        lines = [line for line in makefile.splitlines() if f"/{server} " in line and not line.lstrip().startswith("@")]
        assert lines and all("--host $(HOST)" in line for line in lines), server
    from sweeps import dashboard

    assert dashboard.HOST == "127.0.0.1"  # the dashboard command's own default
