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
