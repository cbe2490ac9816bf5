"""Names and paths a user passes on, checked before anything is written (foundation/paths.py): where no unnamed file
can be made, a named one is tried and removed."""

from __future__ import annotations

from pathlib import Path

import pytest

# sysfs takes no new file, whoever asks; its permission bits (os.access) let root through.
UNWRITABLE = "/sys"

needs_sysfs = pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="no sysfs here (Linux only)")


@needs_sysfs
def test_where_no_unnamed_file_can_be_made_a_named_one_is_tried_and_removed(tmp_path, monkeypatch):
    from foundation import paths
    from foundation.errors import ConfigError

    monkeypatch.setattr(paths, "_UNNAMED", 0)  # (macOS, or a file system without O_TMPFILE)
    assert paths.check_folder("output_dir", str(tmp_path / "runs")) == tmp_path / "runs"
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match=f"output_dir: {UNWRITABLE}/runs: cannot write into {UNWRITABLE} "):
        paths.check_folder("output_dir", f"{UNWRITABLE}/runs")


@pytest.mark.parametrize(
    "build, words",
    [
        pytest.param(lambda runs: (runs / "exp").write_text("x\n"), "a file, not a folder", id="a file"),
        pytest.param(
            lambda runs: (runs / "exp").symlink_to(runs / "gone"),
            "is a symbolic link to",
            id="a link to nothing",
        ),
    ],
)
def test_an_experiment_folder_that_cannot_be_one_is_one_line_naming_it_before_a_version_is_chosen(
    tmp_path, build, words
):
    """``<output_dir>/<experiment>`` a file (or a link to nothing): a new run would fail making ``version_0`` in it
    (NotADirectoryError; a dangling link made the run-folder claim retry for ever)."""
    from foundation.errors import ConfigError
    from foundation.rundir import choose_run_dir

    runs = tmp_path / "runs"
    runs.mkdir()
    build(runs)
    before = sorted(p.name for p in runs.iterdir())
    for deeper in ("exp", "exp/sub"):
        with pytest.raises(ConfigError) as refused:
            choose_run_dir(str(runs), deeper, None, False)
        message = str(refused.value)
        assert (
            message.startswith(f"experiment: {runs / deeper}")
            and f"{runs / 'exp'}" in message
            and words in message
            and f"experiment '{deeper}' go into" in message
        )
    assert sorted(p.name for p in runs.iterdir()) == before
