"""Cache files on a full disk (datamodules/cache.py, ``write_cache``): one line naming data.cache_dir, the file, the
space it needs and the space free, exit 2, and no partial file left. The disk is a real one that fills: a 64 KiB
tmpfs mounted in a mount namespace of the child process (``unshare``), so nothing is mocked."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
from tiny import REPO, TINY_MODEL


def _can_mount_a_small_disk() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


needs_a_small_disk = pytest.mark.skipif(
    not _can_mount_a_small_disk(), reason="needs unshare with user and mount namespaces (tmpfs)"
)


def on_a_full_disk(tmp_path, script: str) -> subprocess.CompletedProcess:
    """Run ``script`` (sh) with ``$DISK`` a fresh 64 KiB tmpfs seen only by it and its children; the listing of
    what the disk holds afterwards is printed after a line ``--- left:``."""
    disk = tmp_path / "disk"
    disk.mkdir()
    wrapped = f'set -e\nDISK={disk}\nmount -t tmpfs -o size=64k tmpfs "$DISK"\n{script}\necho "--- left:"\nfind "$DISK" -type f\n'
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", wrapped], capture_output=True, text=True, timeout=600, cwd=REPO
    )


@needs_a_small_disk
@pytest.mark.processes
def test_train_with_its_cache_on_a_full_disk_is_one_line_naming_the_key_and_the_space_and_leaves_no_partial_file(
    tmp_path,
):
    args = [
        "experiment=tiny",
        f"output_dir={tmp_path / 'runs'}",
        *TINY_MODEL,
        "data.max_texts=300",
        "data.tokenizer.vocab_size=300",
        "trainer.max_steps=2",
        "trainer.accelerator=cpu",
        "optim.warmup_steps=1",
        'data.cache_dir="$DISK/cache"',
    ]
    run = f"{sys.executable} -m experiments.cli train experiments/configs/base.yaml {' '.join(args)} || echo exit=$?"
    done = on_a_full_disk(tmp_path, run)
    out, left = done.stdout.split("--- left:\n")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert "exit=2" in out and len(errors) == 1, done.stderr[-3000:]
    assert errors[0].startswith(f"error: data.cache_dir: {tmp_path / 'disk'}/cache: no room for the cache file ")
    assert "KiB needed, " in errors[0] and " free)" in errors[0]
    assert all(name.endswith(".json") and "/tokenizers/" in name for name in left.split()), left  # whole ones only
    assert not (tmp_path / "runs").exists()


@needs_a_small_disk
@pytest.mark.processes
def test_a_disk_filled_while_a_cache_is_written_is_one_line_and_the_partial_file_is_removed(tmp_path):
    """The space was there when the write began and another writer took it meanwhile: numpy reports only
    "N requested and M written", which becomes the line naming the key, the space needed and the space free."""
    script = textwrap.dedent(
        f"""
        import os, sys
        import numpy as np
        sys.path.insert(0, {str(REPO)!r})
        from datamodules.cache import NPY_HEADER, write_cache
        from foundation.errors import ConfigError

        disk = os.environ["DISK"]
        blocks = np.zeros(8_000, dtype=np.int32)  # 32 KB: fits the 64 KiB disk when the write begins

        def fill_then_save(f):
            with open(os.path.join(disk, "other-writer"), "wb") as other:
                other.write(bytes(48 * 1024))  # another process takes the space meanwhile
            np.save(f, blocks)

        try:
            write_cache(disk, os.path.join(disk, "blocks", "k.npy"), fill_then_save, blocks.nbytes + NPY_HEADER)
        except ConfigError as err:
            print("error:", err)
        """
    )
    (tmp_path / "fill.py").write_text(script)
    done = on_a_full_disk(tmp_path, f"export DISK\n{sys.executable} {tmp_path / 'fill.py'}")
    out, left = done.stdout.split("--- left:\n")
    assert out.startswith(f"error: data.cache_dir: {tmp_path / 'disk'}: no room for the cache file "), done
    assert "31.4 KiB needed, " in out and " free); free some space" in out
    assert left.split() == [str(tmp_path / "disk" / "other-writer")]  # the temporary file was removed


@needs_a_small_disk
@pytest.mark.processes
def test_a_full_hugging_face_cache_is_one_line_naming_it(tmp_path):
    """``datasets`` converts a data file to Arrow files in its cache (HF_HOME): a disk that cannot take them is one
    line naming that cache, not the data file and not a traceback."""
    rows = "".join(f"review number {i} of a file the cache cannot take,{i % 2}\n" for i in range(5000))
    (tmp_path / "big.csv").write_text("text,label\n" + rows)
    args = ["task=classify", "data.tokenizer.kind=byte", f"data.source={tmp_path / 'big.csv'}"]
    args += [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}", "trainer.accelerator=cpu"]
    run = f'HF_HOME="$DISK/hf" HF_DATASETS_CACHE="$DISK/hf/datasets" {sys.executable} -m experiments.cli train '
    run += f"experiments/configs/base.yaml {' '.join(args)} || echo exit=$?"
    done = on_a_full_disk(tmp_path, run)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert "exit=2" in done.stdout and len(errors) == 1, done.stderr[-3000:]
    assert errors[0].startswith(f"error: HF_DATASETS_CACHE: {tmp_path / 'disk'}/hf/datasets: no room for the data's")
    assert not (tmp_path / "runs").exists()
