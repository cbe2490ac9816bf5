"""Local data files (``data.source`` a file, a glob, or a folder with a file per split), read as written.

Formats by suffix: ``.txt`` (one example per line), ``.csv``, ``.tsv`` (GLUE's: tab-separated, quote characters
are text), ``.json``/``.jsonl``, ``.parquet``; all through ``datasets.load_dataset``.

- **Text stays text.** CSV and TSV cells are read as strings, with no NA conversion: pandas would turn a sentence
  ``NA``, ``N/A``, ``null``, ``None``, ``nan`` or an empty cell into a missing value (``keep_default_na=False``),
  and a column of numbers (``1984``, ``007``) into integers (the text columns and the label column go through
  ``str``). Only an empty label cell is missing. The label column is then typed from what it holds: integers if
  every label is one, else numbers if every label is one, else strings (class names).
- **UTF-8 checked where the file is read** (:func:`check_utf8`): a byte sequence that is not UTF-8, in any text
  format, is one line naming the file and the line, not a decoding traceback later. A UTF-8 byte-order mark is
  skipped; CRLF line ends are line ends.
- **Header-less files** (GLUE's original CoLA: source, label, original label, sentence) are read with
  ``data.column_names``, which names every column in order; a file whose first row has another number of fields is
  refused in one line.
- Where an example sits (:func:`locate`): its file and row (1-based, a header not counted), for one-line errors.
"""

from __future__ import annotations

import codecs
import csv
import glob
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict, Value, load_dataset
from datasets.exceptions import DatasetGenerationError

from datamodules.cache import NO_ROOM, no_room_in_hf_cache
from foundation.errors import ConfigError

FILE_BUILDERS = {".txt": "text", ".csv": "csv", ".tsv": "tsv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
TABLES = ("csv", "tsv")  # the formats data.column_names can name
_GLOB_CHARS = "*?["
_BLOCK = 1 << 20
_CHECKED: set[tuple[str, int, int]] = set()  # (path, size, mtime) of files found to be UTF-8: read once per process


def is_file_spec(source: str) -> bool:
    """Whether ``data.source`` names local files (a supported suffix, a glob, or an existing file)."""
    return (
        Path(source).suffix.lower() in FILE_BUILDERS or any(c in source for c in _GLOB_CHARS) or os.path.isfile(source)
    )


def local_files(source: str) -> list[str]:
    """The files ``source`` (a file or a glob) names, sorted; one ConfigError line when there are none."""
    pattern = os.path.expanduser(source)
    if any(c in pattern for c in _GLOB_CHARS):
        files = sorted(f for f in glob.glob(pattern, recursive=True) if os.path.isfile(f))
    else:
        files = [pattern] if os.path.isfile(pattern) else []
    if not files and os.path.isdir(pattern):
        raise ConfigError(f"data.source: {source!r} is a folder, not a data file (a folder needs a train.<ext> file)")
    if not files:
        raise ConfigError(f"data.source: file {source!r} not found")
    return files


def load_local_files(source: str, data_cfg) -> DatasetDict:
    """All files matching ``source`` (a file or glob, one type) as one "train" split, read as written (module
    docstring) with the columns ``data_cfg`` names (``text_column``, ``text_pair_column``, ``label_column``,
    ``column_names``)."""
    files = local_files(source)
    builders = {FILE_BUILDERS.get(Path(f).suffix.lower()) for f in files}
    if None in builders or len(builders) > 1:
        raise ConfigError(f"data.source: {source!r} must name files of one type among {', '.join(FILE_BUILDERS)}")
    if all(os.path.getsize(f) == 0 for f in files):
        raise ConfigError(f"data.source: {source!r} is empty")
    kind = builders.pop()
    if kind != "parquet":
        for path in files:
            check_utf8(path)
    builder, options = _reading(kind, files, data_cfg)
    try:
        loaded = load_dataset(builder, data_files=files, **options)
    except (ValueError, DatasetGenerationError) as err:  # a file without rows, malformed CSV/JSON
        cause = err.__cause__ if isinstance(err, DatasetGenerationError) and err.__cause__ else err
        if isinstance(cause, OSError) and cause.errno in NO_ROOM:  # converting it to Arrow filled the disk
            raise no_room_in_hf_cache(cause) from None
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise ConfigError(f"data.source: cannot read {source!r}: {reason}") from err
    if kind in TABLES and data_cfg.get("label_column") in loaded["train"].column_names:
        loaded = DatasetDict(train=typed_labels(loaded["train"], data_cfg.label_column))
    return loaded


def _reading(kind: str, files: list[str], data_cfg) -> tuple[str, dict]:
    """``load_dataset``'s builder and options for files of ``kind``: the module docstring's rules."""
    names = data_cfg.get("column_names")
    if names and kind not in TABLES:
        raise ConfigError(
            f"data.column_names: names the columns of header-less .csv or .tsv files; {files[0]!r} is {kind}"
        )
    if kind == "text":
        return "text", {"encoding": "utf-8-sig"}
    if kind not in TABLES:
        return kind, {}
    options: dict = {"encoding": "utf-8-sig", "keep_default_na": False}
    if kind == "tsv":  # as GLUE distributes it: quote characters are literal text
        options.update(sep="\t", quoting=csv.QUOTE_NONE)
    as_written = [c for c in (data_cfg.get("text_column"), data_cfg.get("text_pair_column")) if c]
    label = data_cfg.get("label_column")
    if label:
        as_written.append(label)
        options["na_values"] = {label: [""]}  # an empty label cell is a missing label, a text cell stays ""
    options["converters"] = {column: str for column in as_written}
    if names:
        for path in files:
            _check_fields(path, kind, list(names))
        options.update(header=None, column_names=list(names))
    return "csv", options


def _check_fields(path: str, kind: str, names: list[str]) -> None:
    """The first row of a header-less file has one field per name of ``data.column_names``."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if kind == "tsv" else {}
        first = next((row for row in csv.reader(f, **dialect) if row), None)
    if first is not None and len(first) != len(names):
        raise ConfigError(
            f"data.column_names: names {len(names)} columns ({', '.join(names)}), but the first row of {path} has "
            f"{len(first)} fields ({'|'.join(field[:20] for field in first)[:120]})"
        )


def typed_labels(ds: Dataset, column: str) -> Dataset:
    """The label column of a CSV/TSV file (read as strings) as integers if every label is one, else as numbers
    if every label is one (spaces around a number allowed: ``text, 1``), else as written; missing labels stay
    missing."""
    trimmed = pc.utf8_trim_whitespace(ds.with_format("arrow")[column])
    for dtype in ("int64", "float64"):
        try:
            typed = pc.cast(trimmed, pa.from_numpy_dtype(dtype))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        return ds.remove_columns(column).add_column(column, typed, feature=Value(dtype))
    return ds


def check_utf8(path: str) -> None:
    """``path`` decodes as UTF-8 (a byte-order mark allowed); else one ConfigError line naming the file, the line
    and the byte. Read in 1 MiB blocks; a file checked once is not read again in this process."""
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key in _CHECKED:
        return
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    lines = 0  # line ends before the current block
    with open(path, "rb") as f:
        while True:
            block = f.read(_BLOCK)
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as err:
                at = max(0, err.start - len(err.object) + len(block))  # the offending byte's offset in this block
                line = lines + block.count(b"\n", 0, at) + 1
                bad = block[at : at + 1].hex() or "end of file"
                hint = " (a UTF-16 file?)" if lines == 0 and block[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
                raise ConfigError(
                    f"data.source: {path}: line {line} is not UTF-8 text (byte 0x{bad}){hint}; save the file as UTF-8"
                ) from None
            if not block:
                break
            lines += block.count(b"\n")
    _CHECKED.add(key)


def locate(files: list[str], row: int, data_cfg) -> tuple[str, int]:
    """(file, 1-based row in that file, a header not counted) of row ``row`` (0-based) of the split that ``files``
    were read into, in order; for a split of several files, each file's rows are counted (it is read again: the
    error path only)."""
    for path in files[:-1]:
        builder, options = _reading(FILE_BUILDERS[Path(path).suffix.lower()], [path], data_cfg)
        n = len(load_dataset(builder, data_files=[path], **options)["train"])
        if row < n:
            return path, row + 1
        row -= n
    return files[-1], row + 1
