"""Classification data (datamodules/classification.py): every layout, splits, pair encoding, truncation, label errors."""

import csv
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiny
import torch
from datasets import ClassLabel, Dataset, Features, Value
from omegaconf import OmegaConf

from datamodules.cache import unit_hash
from datamodules.classification import ClassificationDataModule, encode, label_array, labelled_splits, load_labelled
from datamodules.config import TokenizerConfig
from datamodules.corpus import iter_texts, load_text_corpus
from datamodules.embedded import load_embedded
from datamodules.tokenizer import CLS_ID, SEP_ID, build_tokenizer
from experiments import cli
from foundation.errors import ConfigError

WORDS = "the a film plot actor scene story music ending pace cast".split()

QNLI = ["entailment", "not_entailment"]


def rows(n, seed, pair=False):
    """Labelled examples; some texts hold a double quote, which GLUE's TSV keeps as literal text."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + (' "quoted' if i % 7 == 0 else "")
        out.append(
            {"text": f"{i}-{seed} {text}", "pair": f"is it {i}-{seed}?" if pair else None, "label": rng.randrange(2)}
        )
    return out


def loaded(cfg):
    splits, num_labels = labelled_splits(load_labelled(cfg), cfg)
    triples = {
        name: [
            (t, p, int(y))
            for t, p, y in zip(
                ds["text"], ds["pair"] if "pair" in ds.column_names else [None] * len(ds), label_array(ds)
            )
        ]
        for name, ds in splits.items()
    }
    return triples, num_labels


def as_triples(examples):
    return [(e["text"], e["pair"], e["label"]) for e in examples]


def held_out(examples, low, high):
    """The documented hold-out rule, restated: u = hash(text \\x1f pair) in [low, high)."""
    return [e for e in as_triples(examples) if low <= unit_hash(f"{e[0]}\x1f{e[1] or ''}") < high]


# ------------------------------------------------------------------------------- layouts
def write_glue_tsv(folder, train, dev, test):
    """QNLI as GLUE ships it: index, question, sentence, label (names); test.tsv has no label column."""
    folder.mkdir()
    for name, examples in (("train", train), ("dev", dev), ("test", test)):
        header = ["index", "question", "sentence"] + (["label"] if name != "test" else [])
        lines = ["\t".join(header)] + [
            "\t".join([str(i), e["text"], e["pair"]] + ([QNLI[e["label"]]] if name != "test" else []))
            for i, e in enumerate(examples)
        ]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n")


def write_hub_repo(repo, subset, splits):
    """A local copy laid out like nyu-mll/glue: <subset>/<split>-00000-of-00001.parquet + README configs;
    ClassLabel features, and test labels -1 as GLUE hides them."""
    features = Features(
        {"sentence": Value("string"), "label": ClassLabel(names=["negative", "positive"]), "idx": Value("int32")}
    )
    (repo / subset).mkdir(parents=True)
    for split, examples in splits.items():
        Dataset.from_dict(
            {
                "sentence": [e["text"] for e in examples],
                "label": [-1 if split == "test" else e["label"] for e in examples],
                "idx": list(range(len(examples))),
            },
            features=features,
        ).to_parquet(str(repo / subset / f"{split}-00000-of-00001.parquet"))
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: "
        + subset
        + "\n  data_files:\n"
        + "".join(f"  - split: {s}\n    path: {subset}/{s}-*\n" for s in splits)
        + "---\n"
    )


def test_glue_tsv_sentence_pairs_use_dev_as_test_and_hold_out_validation(tmp_path):
    train, dev, test = rows(60, 1, pair=True), rows(15, 2, pair=True), rows(15, 3, pair=True)
    write_glue_tsv(tmp_path / "QNLI", train, dev, test)
    got, num_labels = loaded(
        tiny.data_cfg(
            tmp_path,
            val_fraction=0.2,
            source=str(tmp_path / "QNLI"),
            text_column="question",
            text_pair_column="sentence",
            classify={"label_names": QNLI},
        )
    )
    assert num_labels == 2
    assert got["test"] == as_triples(dev)  # GLUE's test labels are hidden: its dev set is the test set
    assert got["validation"] == held_out(train, 0.0, 0.2) and got["validation"]
    assert got["train"] == held_out(train, 0.2, 1.0)
    assert any('"quoted' in t for t, _, _ in got["train"])  # quotes are text in GLUE TSV


def test_single_csv_file_holds_out_validation_and_test(tmp_path):
    examples = rows(80, 4)
    with open(tmp_path / "reviews.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["review", "sentiment"])
        writer.writerows([e["text"], e["label"]] for e in examples)
    got, _ = loaded(
        tiny.data_cfg(
            tmp_path,
            val_fraction=0.2,
            source=str(tmp_path / "reviews.csv"),
            text_column="review",
            label_column="sentiment",
        )
    )
    assert got["validation"] == held_out(examples, 0.0, 0.2) and got["validation"]
    assert got["test"] == held_out(examples, 0.2, 0.4) and got["test"]
    assert got["train"] == held_out(examples, 0.4, 1.0)


def test_jsonl_files_with_all_three_splits_are_taken_as_they_are(tmp_path):
    splits = {"train": rows(30, 5), "validation": rows(10, 6), "test": rows(10, 7)}
    (tmp_path / "d").mkdir()
    for name, examples in splits.items():
        (tmp_path / "d" / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": e["text"], "label": e["label"]}) + "\n" for e in examples)
        )
    got, _ = loaded(tiny.data_cfg(tmp_path, val_fraction=0.2, source=str(tmp_path / "d")))
    assert got == {name: as_triples(examples) for name, examples in splits.items()}


def test_parquet_train_and_test_hold_out_only_validation(tmp_path):
    train, test = rows(50, 8), rows(12, 9)
    (tmp_path / "p").mkdir()
    for name, examples in (("train", train), ("test", test)):
        pq.write_table(
            pa.Table.from_pylist([{"text": e["text"], "label": e["label"]} for e in examples]),
            tmp_path / "p" / f"{name}.parquet",
        )
    got, _ = loaded(tiny.data_cfg(tmp_path, val_fraction=0.2, source=str(tmp_path / "p")))
    assert got["test"] == as_triples(test)
    assert got["validation"] == held_out(train, 0.0, 0.2) and got["train"] == held_out(train, 0.2, 1.0)


def test_local_directory_laid_out_like_the_hub_repo_goes_through_the_hub_branch(tmp_path):
    splits = {"train": rows(50, 10), "validation": rows(12, 11), "test": rows(12, 12)}
    write_hub_repo(tmp_path / "glue", "sst2", splits)
    cfg = tiny.data_cfg(
        tmp_path, val_fraction=0.2, source=str(tmp_path / "glue"), subset="sst2", text_column="sentence"
    )
    got, num_labels = loaded(cfg)
    assert num_labels == 2  # from the ClassLabel feature
    assert got["test"] == as_triples(splits["validation"])
    assert got["validation"] == held_out(splits["train"], 0.0, 0.2)
    with pytest.raises(ConfigError, match=r"^data\.classify\.num_labels: 3, but the label feature has 2 classes"):
        loaded(OmegaConf.merge(cfg, {"classify": {"num_labels": 3}}))


# ------------------------------------------------------------------------------- embedded tasks
def test_embedded_tasks_use_the_mlm_split_so_pretraining_never_saw_their_evaluation_text(tmp_path):
    mlm_train = set(iter_texts(load_text_corpus(tiny.data_cfg(tmp_path, val_fraction=0.2, source="embedded"))["train"]))
    for source, total in (("rotten_tomatoes", 8530), ("imdb", 25000)):
        got, num_labels = loaded(tiny.data_cfg(tmp_path, val_fraction=0.2, source=source))
        reference = load_embedded(sources=source)
        assert num_labels == 2 and sum(len(v) for v in got.values()) == total
        for split in ("train", "validation", "test"):
            assert [t for t, _, _ in got[split]] == list(reference[split]["text"])
            assert [y for _, _, y in got[split]] == list(reference[split]["label"])
        evaluated = {t for split in ("validation", "test") for t, _, _ in got[split]}
        assert not evaluated & mlm_train
        assert {t for t, _, _ in got["train"]} & mlm_train  # the same training texts, by construction
        assert not any("<br" in t for split in got.values() for t, _, _ in split)  # HTML breaks cleaned


# ------------------------------------------------------------------------------- encoding
@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory):
    return build_tokenizer(OmegaConf.structured(TokenizerConfig(kind="byte")), [], tmp_path_factory.mktemp("tok"))


def encoded(tokenizer, max_len, text, pair=None):
    columns = {"text": [text]} if pair is None else {"text": [text], "pair": [pair]}
    return encode(tokenizer, Dataset.from_dict(columns), max_len)[0].tolist()


def test_pairs_are_encoded_cls_a_sep_b_sep(byte_tokenizer):
    ids = lambda s: byte_tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    assert encoded(byte_tokenizer, 64, "is it good?", "it is [SEP] good") == (
        [CLS_ID, *ids("is it good?"), SEP_ID, *ids("it is [SEP] good"), SEP_ID]
    )  # a literal [SEP] stays text
    assert encoded(byte_tokenizer, 64, "alone") == [CLS_ID, *ids("alone"), SEP_ID]


@pytest.mark.parametrize(
    "a, b, kept_a, kept_b",
    [
        ("abcdefghij", None, 8, None),  # a single text keeps its first max_len - 2 tokens
        ("ab", "uvwxyz0123", 2, 5),  # a short segment survives whole, the other takes the rest
        ("abcdefgh", "xyz", 4, 3),  # whichever side is longer is cut
        ("abcdefgh", "uvwxyz0123", 4, 3),  # both long: m = 7 places, ceil(7/2) for a, floor(7/2) for b
        ("abcdefghijklmnopqrst", "uvwxyz0123", 4, 3),
    ],
)
def test_truncation_to_max_len_cuts_the_ends_longest_first(byte_tokenizer, a, b, kept_a, kept_b):
    got = encoded(byte_tokenizer, 10, a, b)
    assert len(got) == 10
    expected = [CLS_ID, *byte_tokenizer.encode(a[:kept_a], add_special_tokens=False).ids, SEP_ID]
    if b is not None:
        expected += [*byte_tokenizer.encode(b[:kept_b], add_special_tokens=False).ids, SEP_ID]
    assert got == expected


def test_tokenizing_only_the_first_words_gives_the_tokens_of_the_whole_text(tmp_path):
    """encode() tokenizes a text's first max_len words only (speed); the result must not depend on that."""
    reviews = list(load_embedded(sources="rotten_tomatoes")["validation"]["text"][:300])
    odd = [
        "tabs\tand\nnew  lines   here " * 20,
        "caf\u00e9\u00a0cr\u00e8me \U0001f600 " * 30,
        "x" * 500,
        "  lead " * 40,
        "",
    ]
    texts, pairs = reviews + odd, odd + reviews
    for kind in ("bpe", "byte"):
        tok = build_tokenizer(OmegaConf.structured(TokenizerConfig(kind=kind, vocab_size=400)), reviews, tmp_path)
        full = lambda xs, tok=tok: [e.ids for e in tok.encode_batch(xs, add_special_tokens=False)]  # noqa: E731
        for max_len in (6, 32, 128):
            m = max_len - 3  # the documented pair rule, on the whole texts' tokens
            kept_a = [min(len(a), max((m + 1) // 2, m - len(b))) for a, b in zip(full(texts), full(pairs))]
            expected = [
                [CLS_ID, *a[:ka], SEP_ID, *b[: m - ka], SEP_ID] for a, b, ka in zip(full(texts), full(pairs), kept_a)
            ]
            got = encode(tok, Dataset.from_dict({"text": texts, "pair": pairs}), max_len)
            assert [g.tolist() for g in got] == expected
            singles = encode(tok, Dataset.from_dict({"text": texts}), max_len)
            assert [g.tolist() for g in singles] == [[CLS_ID, *a[: max_len - 2], SEP_ID] for a in full(texts)]


def test_data_module_batches_pad_to_the_longest_and_keep_labels(tmp_path):
    train, dev, test = rows(60, 1, pair=True), rows(15, 2, pair=True), rows(15, 3, pair=True)
    write_glue_tsv(tmp_path / "QNLI", train, dev, test)
    cfg = tiny.data_cfg(
        tmp_path,
        val_fraction=0.2,
        source=str(tmp_path / "QNLI"),
        text_column="question",
        text_pair_column="sentence",
        classify={"label_names": QNLI},
        tokenizer={"kind": "byte"},
        batch_size=4,
    )
    dm = ClassificationDataModule(cfg, max_len=24)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.test_dataloader()))
    assert batch["labels"].tolist() == [e["label"] for e in dev[:4]]
    assert batch["input_ids"].shape[1] == 24 and torch.equal(batch["attention_mask"], batch["input_ids"] != 0)
    assert (batch["input_ids"][:, 0] == CLS_ID).all() and ((batch["input_ids"] == SEP_ID).sum(1) == 2).all()
    baseline = dm.trivial_baseline()
    assert 0.3 < baseline["trivial_accuracy"] < 0.8 and baseline["trivial_loss"] > 0.6


# ------------------------------------------------------------------------------- label errors
def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


LABEL_ERRORS = {
    "missing_column": (
        "a.csv",
        "text,y\nhello,1\n",
        {},
        "data.label_column: 'label' not in columns [text, y] of the train split",
    ),
    "missing_text_column": (
        "a.csv",
        "review,label\nhello,1\n",
        {},
        "data.text_column: 'text' not in columns [review, label] of the train split",
    ),
    "float_labels": (
        "a.csv",
        "text,label\nhello,0.5\nbye,1.0\n",
        {},
        "data.label_column: 'label' holds float64 values, not integer class ids (a regression? set data.classify.regression=true)",
    ),
    "string_labels": (
        "a.csv",
        "text,label\nhello,pos\n",
        {},
        "data.label_column: 'label' holds strings ('pos' at row 1 of {src}), not class ids; list the classes in "
        "order in data.classify.label_names",
    ),
    "unknown_name": (
        "a.csv",
        "text,label\nhello,pos\nbye,meh\n",
        {"classify": {"label_names": ["neg", "pos"]}},
        "data.label_column: label 'meh' at row 2 of {src} is not one of data.classify.label_names ['neg', 'pos']",
    ),
    "outside_classes": (
        "a.csv",
        "text,label\n" + "".join(f"t{i},{i % 3}\n" for i in range(30)),
        {},
        "data.label_column: label 2 in the train split is outside the task's classes 0..1 (data.classify.num_labels=2)",
    ),
    "missing_labels": (
        "a.jsonl",
        '{"text": "a", "label": 1}\n{"text": "b", "label": null}\n',
        {},
        "data.label_column: the 'label' label at row 2 of {src} is missing (1 missing in the train split)",
    ),
}


@pytest.mark.parametrize("case", sorted(LABEL_ERRORS))
def test_label_problems_are_one_line_errors_naming_the_key(tmp_path, case):
    name, content, overrides, message = LABEL_ERRORS[case]
    source = write(tmp_path / name, content)
    cfg = tiny.data_cfg(tmp_path, val_fraction=0.2, source=source, **overrides)
    with pytest.raises(ConfigError) as err:
        loaded(cfg)
    assert str(err.value) == message.replace("{src}", str(source))


def test_an_empty_split_is_an_error_and_the_cli_exits_2_writing_nothing(tmp_path, tiny_overrides, capsys):
    texts = [t for t in (f"review {i}" for i in range(200)) if unit_hash(f"{t}\x1f") >= 0.1][:6]
    source = write(tmp_path / "few.csv", "text,label\n" + "".join(f"{t},{i % 2}\n" for i, t in enumerate(texts)))
    code = cli.main(
        ["train", str(tiny_overrides.config), *tiny_overrides.args, "task=classify", f"data.source={source}"]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2
    assert err == f"error: data.source: '{source}' gives an empty validation split (data.val_fraction=0.05)"
    assert not (tmp_path / "runs").exists()
    header_only = write(tmp_path / "d" / "dev.csv", "text,label\n")
    write(tmp_path / "d" / "train.csv", "text,label\nhello,1\n")
    with pytest.raises(ConfigError, match=f"^data.source: cannot read '{header_only}': "):
        loaded(tiny.data_cfg(tmp_path, val_fraction=0.2, source=str(tmp_path / "d")))
