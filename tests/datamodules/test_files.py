"""Data read as written (datamodules/files.py, datamodules/classification.py): a sentence ``NA`` is the text ``NA``,
a missing or empty text, a byte that is not UTF-8 and a split whose classes are named otherwise are one line naming
the file and the row (or line); a header-less file is read by naming its columns; class names are matched across
splits by name."""

from __future__ import annotations

import json
import re

import pytest
import tiny
from datasets import ClassLabel, Dataset, Features, Value

from datamodules.classification import label_array, labelled_splits, load_labelled
from datamodules.corpus import iter_texts, load_text_corpus
from datamodules.files import check_utf8
from foundation.errors import ConfigError

# What pandas and friends read as a missing value by default, and texts that look like numbers: each is a sentence.
# (pandas' "<NA>" is left out: the cleaning rule removes HTML-like tags, and an empty text is refused.)
AS_WRITTEN = ["NA", "N/A", "n/a", "null", "NULL", "None", "nan", "NaN", "-nan", "#N/A", "1984", "007", "1.50"]


def examples(texts: list[str]) -> list[tuple[str, int]]:
    """The texts and 30 more (so that every split the hold-out draws has some), labels alternating."""
    return [(t, i % 2) for i, t in enumerate([*texts, *(f"filler {i}" for i in range(30))])]


def write_table(path, rows: list[tuple], header: tuple = ("text", "label"), crlf: bool = False, bom: bool = False):
    sep = "\t" if path.suffix == ".tsv" else ","
    lines = ([sep.join(header)] if header else []) + [sep.join(str(v) for v in row) for row in rows]
    data = ("\r\n" if crlf else "\n").join(lines) + ("\r\n" if crlf else "\n")
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data.encode("utf-8"))
    return str(path)


def write_jsonl(path, records: list[dict], crlf: bool = False, bom: bool = False):
    data = ("\r\n" if crlf else "\n").join(json.dumps(r) for r in records) + "\n"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data.encode("utf-8"))
    return str(path)


def every_text(cfg) -> list[str]:
    splits, _ = labelled_splits(load_labelled(cfg), cfg)
    return sorted(t for ds in splits.values() for t in ds["text"])


# ------------------------------------------------------------------------------- text as written
@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_na_spellings_and_numbers_are_the_text_they_are_for_classification_and_language_models(tmp_path, suffix):
    rows = examples(AS_WRITTEN)
    path = tmp_path / f"a{suffix}"
    source = (
        write_jsonl(path, [{"text": t, "label": y} for t, y in rows]) if suffix == ".jsonl" else write_table(path, rows)
    )
    cfg = tiny.data_cfg(tmp_path, source=source, val_fraction=0.2)
    assert every_text(cfg) == sorted(t for t, _ in rows)
    splits, _ = labelled_splits(load_labelled(cfg), cfg)
    by_text = {t: y for t, y in rows}
    assert all(by_text[t] == y for ds in splits.values() for t, y in zip(ds["text"], label_array(ds)))
    corpus = load_text_corpus(cfg)  # a language model's corpus read from the same file keeps them too
    assert sorted(t for split in corpus.values() for t in iter_texts(split)) == sorted(t for t, _ in rows)


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".txt"])
def test_a_byte_order_mark_and_crlf_line_ends_read_as_plain_utf8(tmp_path, suffix):
    rows = examples(["first text", "second one", "third"])
    read = []
    for name, marked in (("plain", False), ("marked", True)):
        path = tmp_path / f"{name}{suffix}"
        if suffix == ".jsonl":
            write_jsonl(path, [{"text": t, "label": y} for t, y in rows], crlf=marked, bom=marked)
        elif suffix == ".txt":
            path.write_bytes((b"\xef\xbb\xbf" if marked else b"") + "\r\n".join(t for t, _ in rows).encode())
        else:
            write_table(path, rows, crlf=marked, bom=marked)
        corpus = load_text_corpus(tiny.data_cfg(tmp_path, source=str(path), val_fraction=0.3))
        read.append(sorted(t for split in corpus.values() for t in iter_texts(split)))
    assert read[0] == read[1] == sorted(t for t, _ in rows)


@pytest.mark.parametrize(
    "labels, regression, expected",
    [
        ([" 1", "0 ", "1"], False, [1, 0, 1]),  # "text, 1": pandas took the spaces for none, so do we
        (["0.5", "4", "2.25"], True, [0.5, 4.0, 2.25]),
    ],
)
def test_a_csv_label_column_is_typed_from_what_it_holds(tmp_path, labels, regression, expected):
    rows = [(f"text {i}", y) for i, y in enumerate(labels * 20)]
    cfg = tiny.data_cfg(tmp_path, source=write_table(tmp_path / "a.csv", rows), classify={"regression": regression})
    raw = load_labelled(cfg)["train"]
    assert raw["label"] == expected * 20


# ------------------------------------------------------------------------------- missing and empty texts
def bad_texts(tmp_path, case: str) -> tuple[str, dict, str]:
    """(data.source, config overrides, words of the one line) for each way a text can be missing or empty."""
    good = [(f"text {i}", i % 2) for i in range(8)]
    if case == "csv empty cell":
        return write_table(tmp_path / "a.csv", [*good[:4], ("", 1), *good[4:]]), {}, "row 5 of {d}/a.csv is empty"
    if case == "tsv whitespace only":
        return write_table(tmp_path / "a.tsv", [*good, ("   ", 0)]), {}, "row 9 of {d}/a.tsv is empty"
    if case == "html tags only":
        return write_table(tmp_path / "a.csv", [("<br /><br />", 0), *good]), {}, "row 1 of {d}/a.csv is empty"
    if case == "jsonl null":
        records = [{"text": t, "label": y} for t, y in good] + [{"text": None, "label": 1}]
        return write_jsonl(tmp_path / "a.jsonl", records), {}, "row 9 of {d}/a.jsonl is missing"
    if case == "jsonl key absent":
        records = [{"text": t, "label": y} for t, y in good[:2]] + [{"label": 1}] + [{"text": "x", "label": 0}]
        return write_jsonl(tmp_path / "a.jsonl", records), {}, "row 3 of {d}/a.jsonl is missing"
    if case == "pair empty":
        rows = [(t, f"pair {i}", y) for i, (t, y) in enumerate(good)] + [("text x", "", 0)]
        source = write_table(tmp_path / "a.tsv", rows, header=("question", "sentence", "label"))
        words = "data.text_pair_column: the 'sentence' text at row 9 of {d}/a.tsv is empty"
        return source, {"text_column": "question", "text_pair_column": "sentence"}, words
    if case == "second file of a glob":
        write_table(tmp_path / "g1.csv", good)
        source = write_table(tmp_path / "g2.csv", [*good[:2], ("", 1)])
        return str(tmp_path / "g*.csv"), {}, "row 3 of {d}/g2.csv is empty"
    if case == "dev split of a folder":
        folder = tmp_path / "glue"
        folder.mkdir()
        write_table(folder / "train.tsv", good)
        write_table(folder / "dev.tsv", [*good[:3], ("", 1)])
        return str(folder), {}, "row 4 of {d}/glue/dev.tsv is empty"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "csv empty cell",
        "tsv whitespace only",
        "html tags only",
        "jsonl null",
        "jsonl key absent",
        "pair empty",
        "second file of a glob",
        "dev split of a folder",
    ],
)
def test_a_missing_or_empty_text_is_one_line_naming_the_file_and_the_row(tmp_path, case):
    source, overrides, words = bad_texts(tmp_path, case)
    cfg = tiny.data_cfg(tmp_path, source=source, val_fraction=0.2, **overrides)
    with pytest.raises(ConfigError) as refused:
        labelled_splits(load_labelled(cfg), cfg)
    message = str(refused.value)
    assert words.format(d=tmp_path) in message and message.startswith("data.text") and "\n" not in message, message


# ------------------------------------------------------------------------------- encodings
@pytest.mark.parametrize(
    "name, data, line",
    [
        ("a.jsonl", b'{"text": "fine", "label": 1}\n{"text": "ok", "label": 0}\n{"text": "bad \xff", "label": 0}\n', 3),
        ("a.csv", b"text,label\nfine,1\ncaf\xe9,0\n", 3),  # Latin-1
        ("a.tsv", b"text\tlabel\r\nfine\t1\r\n\xc3(\t0\r\n", 3),
        ("a.txt", b"one\ntwo\nthree \xed\xa0\x80\n", 3),  # a UTF-16 surrogate written as UTF-8
        ("b.txt", b"one\n" + b"x" * (1 << 20) + b"\ntrunc \xe2\x82", 3),  # past the first block, cut mid-character
        ("u16.csv", "text,label\nfine,1\n".encode("utf-16"), 1),
    ],
)
def test_text_that_is_not_utf8_is_one_line_naming_the_file_and_the_line(tmp_path, name, data, line):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=rf"^data.source: {path}: line {line} is not UTF-8 text \(byte 0x"):
        check_utf8(str(path))
    cfg = tiny.data_cfg(tmp_path, source=str(path), val_fraction=0.2)
    for read in (lambda: labelled_splits(load_labelled(cfg), cfg), lambda: load_text_corpus(cfg)):
        with pytest.raises(ConfigError, match=rf"{path}: line {line} is not UTF-8"):
            read()


# ------------------------------------------------------------------------------- class names across splits
def write_parquet_splits(folder, names_by_split: dict[str, list[str]], n: int = 12) -> dict[str, list[str]]:
    """A folder of parquet splits whose ClassLabel names come in each split's own order; returns each split's
    labels by name, as written."""
    folder.mkdir()
    written = {}
    for split, names in names_by_split.items():
        as_names = (
            [["neg", "pos", "mid"][i % 3] for i in range(n)]
            if len(names) == 3
            else [["neg", "pos"][i % 2] for i in range(n)]
        )
        features = Features({"text": Value("string"), "label": ClassLabel(names=names)})
        rows = {"text": [f"{split} text {i}" for i in range(n)], "label": [names.index(x) for x in as_names]}
        Dataset.from_dict(rows, features=features).to_parquet(str(folder / f"{split}.parquet"))
        written[split] = as_names
    return written


def test_a_split_whose_class_names_come_in_another_order_is_renumbered_by_name(tmp_path):
    folder = tmp_path / "parquet"
    written = write_parquet_splits(
        folder, {"train": ["neg", "pos"], "validation": ["pos", "neg"], "test": ["pos", "neg"]}
    )
    cfg = tiny.data_cfg(tmp_path, source=str(folder))
    splits, num_labels = labelled_splits(load_labelled(cfg), cfg)
    assert num_labels == 2
    for split in ("validation", "test"):
        assert [["neg", "pos"][y] for y in label_array(splits[split])] == written[split]  # train's ids, by name
    # data.classify.label_names orders the classes, whatever order the files give them
    named = tiny.data_cfg(tmp_path, source=str(folder), classify={"label_names": ["pos", "neg"]})
    splits, _ = labelled_splits(load_labelled(named), named)
    for split in ("train", "validation", "test"):
        assert [["pos", "neg"][y] for y in label_array(splits[split])] == written[split]


def test_a_split_with_other_class_names_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "parquet"
    write_parquet_splits(folder, {"train": ["neg", "pos"], "validation": ["neg", "pos", "mid"]})
    cfg = tiny.data_cfg(tmp_path, source=str(folder))
    with pytest.raises(ConfigError) as refused:
        labelled_splits(load_labelled(cfg), cfg)
    assert str(refused.value) == (
        f"data.label_column: the validation split of '{folder}' has the classes ['neg', 'pos', 'mid'], train has "
        "['neg', 'pos']: not the same classes"
    )


# ------------------------------------------------------------------------------- header-less files
COLA = [  # GLUE's original CoLA: source, label, original label ("*" where unacceptable), sentence; no header
    ("gj04", 1, "", "Our friends won't buy this analysis, let alone the next one we propose."),
    ("gj04", 0, "*", 'They drank the pub "dry".'),
    ("gj04", 1, "", "NA"),
    ("cj99", 0, "*", "The more we study verbs, the crazier they get get."),
    ("cj99", 1, "", "Day by day the facts are getting murkier."),
    ("cj99", 0, "*", "null"),
] * 3


def test_a_header_less_file_is_read_by_naming_its_columns(tmp_path):
    folder = tmp_path / "cola"
    folder.mkdir()
    write_table(folder / "train.tsv", COLA, header=())
    write_table(folder / "dev.tsv", COLA[:6], header=())
    names = ["source", "label", "original_label", "sentence"]
    cfg = tiny.data_cfg(tmp_path, source=str(folder), text_column="sentence", column_names=names)
    splits, num_labels = labelled_splits(load_labelled(cfg), cfg)
    assert num_labels == 2
    assert sorted(zip(splits["test"]["text"], label_array(splits["test"]).tolist())) == sorted(
        (s, y) for _, y, _, s in COLA[:6]
    )
    # without the names, the first row is taken for a header: one line that shows it
    with pytest.raises(ConfigError, match=r"data.text_column: 'sentence' not in columns \[gj04, 1, "):
        labelled_splits(load_labelled(tiny.data_cfg(tmp_path, source=str(folder), text_column="sentence")), cfg)


@pytest.mark.parametrize(
    "name, content, names, words",
    [
        ("a.tsv", "gj04\t1\t\tA sentence.\n", ["label", "text"], "names 2 columns (label, text), but the first row"),
        ("a.jsonl", '{"text": "a", "label": 1}\n', ["text", "label"], "names the columns of header-less .csv or .tsv"),
    ],
)
def test_column_names_that_do_not_fit_the_file_are_one_line(tmp_path, name, content, names, words):
    (tmp_path / name).write_text(content)
    cfg = tiny.data_cfg(tmp_path, source=str(tmp_path / name), column_names=names)
    with pytest.raises(ConfigError, match=f"^data.column_names: {re.escape(words)}"):
        load_labelled(cfg)


def test_a_data_file_that_is_a_folder_is_one_line(tmp_path):
    (tmp_path / "train.csv").mkdir()
    cfg = tiny.data_cfg(tmp_path, source=str(tmp_path / "train.csv"))
    for read in (load_labelled, load_text_corpus):
        with pytest.raises(ConfigError, match="is a folder, not a data file"):
            read(cfg)
