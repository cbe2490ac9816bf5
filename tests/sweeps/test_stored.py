"""A study as its storage holds it (sweeps/stored.py): a study refuses a changed objective, to the sweep and the
report alike."""

from __future__ import annotations

from studies import write_study

from experiments import cli
from sweeps.spec.study import load_study


def test_an_existing_study_refuses_a_changed_objective(tmp_path, tiny_overrides, capsys):
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

    path = write_study(tmp_path, tiny_overrides, "changed", {"seed": {"type": "categorical", "choices": [0]}})
    open_study(RunStorage(load_study(path), None))  # the study as first run: val/loss, minimize
    changed = write_study(
        tmp_path,
        tiny_overrides,
        "changed",
        {"seed": {"type": "categorical", "choices": [0]}},
        objective=[{"metric": "val/loss", "direction": "maximize"}],
    )
    for command in ("sweep", "report"):
        assert cli.main([command, str(changed)]) == 2
        assert "has objective val/loss (minimize), the file now says val/loss (maximize)" in capsys.readouterr().err
