"""Data layer: corpora and THE embedded split, tokenizer caching, packing, masking, error messages."""

import json
import math
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiny
import torch

from datamodules import language_model
from datamodules import tokenizer as tokenizer_mod
from datamodules.corpus import iter_texts, load_text_corpus
from datamodules.embedded import clean_text, load_embedded, split_of
from datamodules.language_model import CausalLMDataModule, MLMDataModule
from datamodules.sampling import batch_generator
from datamodules.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID, UNK_ID, build_tokenizer
from foundation.errors import ConfigError

WORDS = "the a film movie plot actor scene good bad great awful story music ending love hate slow fast".split()


def sentences(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))) + "." for _ in range(n)]


@pytest.fixture
def txt_corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(sentences(3000)) + "\n")
    return path


def byte_cfg(tmp_path, source, **overrides):
    return tiny.data_cfg(
        tmp_path, source=str(source), val_fraction=0.1, batch_size=8, tokenizer={"kind": "byte"}, **overrides
    )


def assert_config_error(message, fn, *args):
    with pytest.raises(ConfigError) as err:
        fn(*args)
    assert str(err.value) == message and "\n" not in str(err.value)


# ------------------------------------------------------------------------------- embedded split
def test_clean_text_removes_html_breaks_and_squeezes_whitespace():
    assert clean_text("Great.<br /><br />Really   <i>great</i>\n film<BR>") == "Great. Really great film"


def test_split_rule_is_pinned():
    """THE split must never drift: later tasks and published numbers depend on it."""
    assert [split_of(t) for t in ("A great movie.", "Terrible.", "x")] == ["test", "train", "train"]
    assert split_of("I rented it<br /><br />and  loved it") == split_of("I rented it and loved it")


@pytest.fixture(scope="module")
def reviews():
    return load_embedded()


def test_embedded_split_is_80_10_10_per_source_and_deterministic(reviews):
    assert set(reviews) == {"train", "validation", "test"}
    assert reviews["train"].column_names == ["text", "label", "source"]
    for source, total in (("imdb", 25000), ("rotten_tomatoes", 8530)):
        counts = {s: sum(1 for x in reviews[s]["source"] if x == source) for s in reviews}
        assert sum(counts.values()) == total
        for split, p in (("train", 0.8), ("validation", 0.1), ("test", 0.1)):
            assert abs(counts[split] / total - p) < 5 * math.sqrt(p * (1 - p) / total), (source, split, counts)
    for split in reviews:
        sample = reviews[split].select(range(200))["text"]
        assert {split_of(t) for t in sample} == {split}
    again = load_embedded(sources="rotten_tomatoes")
    assert set(again["validation"]["source"]) == {"rotten_tomatoes"}
    val = reviews["validation"]
    rt_val = [t for t, s in zip(val["text"], val["source"]) if s == "rotten_tomatoes"]
    assert list(again["validation"]["text"]) == rt_val


def test_mlm_corpus_on_embedded_never_sees_validation_or_test_texts(tmp_path, reviews):
    corpus = load_text_corpus(tiny.data_cfg(tmp_path, source="embedded"))
    assert corpus["train"].column_names == ["text"]
    train, val = set(iter_texts(corpus["train"])), set(iter_texts(corpus["validation"]))
    held_out = set(reviews["validation"]["text"]) | set(reviews["test"]["text"])
    assert train and not train & held_out
    assert val == set(reviews["validation"]["text"]) - {""}
    assert {split_of(t) for t in train} == {"train"}
    capped = load_text_corpus(tiny.data_cfg(tmp_path, source="embedded", max_texts=500))
    capped_texts = list(iter_texts(capped["train"]))
    assert len(capped_texts) == 500 and set(capped_texts) <= train
    source_of = dict(zip(reviews["train"]["text"], reviews["train"]["source"]))
    assert {source_of[t] for t in capped_texts} == {"imdb", "rotten_tomatoes"}  # spread over the corpus


# ------------------------------------------------------------------------------- other corpora
def test_local_files_in_every_format_load_alike(tmp_path):
    lines = sentences(400, seed=1)
    rows = [{"body": t, "n": i} for i, t in enumerate(lines)]
    (tmp_path / "c.txt").write_text("\n".join(lines[:200]) + "\n\n   \n" + "\n".join(lines[200:]) + "\n")
    with open(tmp_path / "c.csv", "w") as f:
        f.write("body,n\n" + "".join(f'"{r["body"]}",{r["n"]}\n' for r in rows))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    loaded = {}
    for name, column in (("c.txt", "text"), ("c.csv", "body"), ("c.jsonl", "body"), ("c.parquet", "body")):
        corpus = load_text_corpus(tiny.data_cfg(tmp_path, source=str(tmp_path / name), text_column=column))
        assert set(corpus) == {"train", "validation"} and corpus["train"].column_names == ["text"]
        loaded[name] = (list(iter_texts(corpus["train"])), list(iter_texts(corpus["validation"])))
    first = loaded["c.txt"]
    assert all(v == first for v in loaded.values())
    assert sorted(first[0] + first[1]) == sorted(lines) and 0 < len(first[1]) < 0.25 * len(lines)
    (tmp_path / "d").mkdir()
    for i in range(2):
        (tmp_path / "d" / f"part{i}.txt").write_text("\n".join(lines[i * 200 : (i + 1) * 200]))
    globbed = load_text_corpus(tiny.data_cfg(tmp_path, source=str(tmp_path / "d" / "*.txt")))
    assert list(iter_texts(globbed["train"])) == first[0]


def test_local_directory_laid_out_like_the_hub_repo_loads_by_subset(tmp_path):
    """Same files and README `configs` as Salesforce/wikitext: exercises the hub-id code path offline."""
    repo, subset = tmp_path / "wikitext", "wikitext-2-raw-v1"
    (repo / subset).mkdir(parents=True)
    texts = {
        split: ["", f" = {split} = \n"] + [f" {s} \n" for s in sentences(50, seed=i)]
        for i, split in enumerate(("train", "validation", "test"))
    }
    for split, lines in texts.items():
        pq.write_table(pa.table({"text": lines}), repo / subset / f"{split}-00000-of-00001.parquet")
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: "
        + subset
        + "\n  data_files:\n"
        + "".join(f"  - split: {s}\n    path: {subset}/{s}-*\n" for s in texts)
        + "---\n"
    )
    corpus = load_text_corpus(tiny.data_cfg(tmp_path, source=str(repo), subset=subset))
    assert list(iter_texts(corpus["train"])) == texts["train"][1:]
    assert list(iter_texts(corpus["validation"])) == texts["validation"][1:]  # its own split, not a hold-out
    with pytest.raises(ConfigError, match=r"^data\.source: cannot load .*'nope'.*BuilderConfig 'nope' not found"):
        load_text_corpus(tiny.data_cfg(tmp_path, source=str(repo), subset="nope"))


def test_unreachable_hub_id_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_text_corpus(tiny.data_cfg(tmp_path, source="Salesforce/wikitext", subset="wikitext-2-raw-v1"))
    assert str(err.value).startswith("data.source: cannot load 'Salesforce/wikitext'") and "\n" not in str(err.value)


def test_stdlib_code_is_one_document_per_file_split_by_path(tmp_path):
    corpus = load_text_corpus(tiny.data_cfg(tmp_path, source="stdlib-code", max_texts=50))
    docs = list(iter_texts(corpus["train"]))
    assert len(docs) == 50 and all("\n" in d for d in docs)
    assert len(corpus["validation"]) > 10
    assert not set(docs) & set(iter_texts(corpus["validation"]))


@pytest.mark.parametrize("case", ["missing_file", "empty", "missing_column", "tokenizer_path"])
def test_input_errors_are_one_line_and_name_the_key(tmp_path, case):
    if case == "missing_file":
        cfg, message = tiny.data_cfg(tmp_path, source="x.txt"), "data.source: file 'x.txt' not found"
        assert_config_error(message, load_text_corpus, cfg)
    elif case == "empty":
        (tmp_path / "e.txt").write_text("\n  \n\t\n")
        cfg = tiny.data_cfg(tmp_path, source=str(tmp_path / "e.txt"))
        assert_config_error(
            f"data.source: '{tmp_path / 'e.txt'}' has no non-empty texts in its training split", load_text_corpus, cfg
        )
    elif case == "missing_column":
        (tmp_path / "t.csv").write_text("a,b\nhello,1\n")
        cfg = tiny.data_cfg(tmp_path, source=str(tmp_path / "t.csv"), text_column="foo")
        assert_config_error("data.text_column: 'foo' not in columns [a, b]", load_text_corpus, cfg)
    else:
        cfg = tiny.data_cfg(tmp_path, tokenizer={"path": "nope.json"})
        assert_config_error(
            "data.tokenizer.path: 'nope.json' not found", build_tokenizer, cfg.tokenizer, ["text"], tmp_path
        )
        cfg = tiny.data_cfg(tmp_path, tokenizer={"path": str(tmp_path)})
        assert_config_error(
            f"data.tokenizer.path: '{tmp_path}' is a folder, not a tokenizer.json file",
            build_tokenizer,
            cfg.tokenizer,
            ["text"],
            tmp_path,
        )


# ------------------------------------------------------------------------------- tokenizer
def test_tokenizers_have_fixed_special_ids_and_round_trip(tmp_path):
    texts = sentences(300) + ["def f(x):\n    return x  # café [MASK]"]
    for kind in ("bpe", "byte"):
        cfg = tiny.data_cfg(tmp_path, tokenizer={"kind": kind, "vocab_size": 300})
        tok = build_tokenizer(cfg.tokenizer, texts, tmp_path)
        assert [tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
            PAD_ID,
            UNK_ID,
            CLS_ID,
            SEP_ID,
            MASK_ID,
        ]
        ids = tok.encode(texts[-1], add_special_tokens=False).ids
        assert min(ids) >= NUM_SPECIAL  # literal "[MASK]" in a text is text, not the special token
        assert tok.decode(ids) == texts[-1]
        assert tok.get_vocab_size() == (300 if kind == "bpe" else NUM_SPECIAL + 256)


def test_tokenizer_cache_reuses_and_rebuilds(tmp_path, monkeypatch):
    texts = sentences(500)
    cfg = tiny.data_cfg(tmp_path, tokenizer={"vocab_size": 300}).tokenizer
    calls = []
    train = tokenizer_mod._train_bpe
    monkeypatch.setattr(tokenizer_mod, "_train_bpe", lambda *a: calls.append(1) or train(*a))
    first = build_tokenizer(cfg, texts, tmp_path)
    files = list((tmp_path / "tokenizers").glob("*.json"))
    assert len(calls) == 1 and len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    again = build_tokenizer(cfg, list(texts), tmp_path)
    assert len(calls) == 1 and files[0].stat().st_mtime_ns == mtime
    assert again.to_str() == first.to_str()
    build_tokenizer(tiny.data_cfg(tmp_path, tokenizer={"vocab_size": 320}).tokenizer, texts, tmp_path)
    build_tokenizer(cfg, texts[:-1] + ["a changed review"], tmp_path)  # same count, new text
    assert len(calls) == 3 and len(list((tmp_path / "tokenizers").glob("*.json"))) == 3
    assert not list((tmp_path / "tokenizers").glob(".*"))  # no temporary files left behind


# ------------------------------------------------------------------------------- packing and batches
def encoded_stream(tok, texts):
    return [i for t in texts for i in tok.encode(t, add_special_tokens=False).ids + [SEP_ID]]


def test_blocks_are_full_and_keep_corpus_order_and_are_cached(tmp_path, txt_corpus, monkeypatch):
    cfg = byte_cfg(tmp_path, txt_corpus)
    dm = CausalLMDataModule(cfg, max_len=64)
    dm.prepare_data()
    assert dm.tokenizer is None  # prepare_data sets no state
    dm.setup("fit")
    corpus = load_text_corpus(cfg)
    for split, blocks in (("train", dm.train_blocks), ("validation", dm.val_set.tensors[0])):
        assert blocks.shape[1] == 64
        stream = encoded_stream(dm.tokenizer, iter_texts(corpus[split]))
        assert len(blocks) == len(stream) // 64
        assert blocks.flatten().tolist() == stream[: len(blocks) * 64]
    blocks = dm.train_blocks
    dm.setup("fit")  # idempotent
    assert dm.train_blocks is blocks
    monkeypatch.setattr(language_model, "encode_documents", lambda *a: pytest.fail("blocks were not cached"))
    fresh = CausalLMDataModule(cfg, max_len=64)
    fresh.setup("fit")
    assert torch.equal(fresh.train_blocks, blocks)
    assert len(list((tmp_path / "cache" / "blocks").glob("*.npy"))) == 2


def test_causal_labels_are_the_next_tokens(tmp_path, txt_corpus):
    dm = CausalLMDataModule(byte_cfg(tmp_path, txt_corpus), max_len=32)
    dm.setup("fit")
    rows = {tuple(r) for r in dm.train_blocks.tolist()}
    for batch in (next(iter(dm.train_dataloader())), next(iter(dm.val_dataloader()))):
        ids, labels = batch["input_ids"], batch["labels"]
        assert ids.dtype == labels.dtype == torch.long
        assert torch.equal(labels[:, :-1], ids[:, 1:]) and (labels[:, -1] == -100).all()
        assert batch["attention_mask"] is None  # packed blocks: no padding
    assert all(tuple(r) in rows for r in next(iter(dm.train_dataloader()))["input_ids"].tolist())


def test_mlm_masking_statistics(tmp_path, txt_corpus):
    dm = MLMDataModule(byte_cfg(tmp_path, txt_corpus), max_len=64)
    dm.setup("fit")
    ids = dm.train_blocks.long().clone()
    ids[:, 0], ids[:, 1], ids[:, 2], ids[:, 3] = CLS_ID, PAD_ID, UNK_ID, MASK_ID
    special = ids < NUM_SPECIAL
    torch.manual_seed(0)
    inputs, labels, _ = dm.make_inputs_labels(ids, None)
    selected = labels != -100
    assert not (selected & special).any() and torch.equal(inputs[special], ids[special])
    assert torch.equal(labels[selected], ids[selected]) and torch.equal(inputs[~selected], ids[~selected])
    n, m = int((~special).sum()), int(selected.sum())
    assert n > 50_000 and abs(m / n - 0.15) < 5 * math.sqrt(0.15 * 0.85 / n)
    masked = int((inputs[selected] == MASK_ID).sum())
    kept = int((inputs[selected] == ids[selected]).sum())
    randomized = m - masked - kept
    for count, p in ((masked, 0.8), (randomized, 0.1), (kept, 0.1)):
        assert abs(count / m - p) < 5 * math.sqrt(p * (1 - p) / m) + 1 / 256, (count, m, p)
    assert (inputs[selected] >= NUM_SPECIAL).logical_or(inputs[selected] == MASK_ID).all()


def test_mlm_validation_masks_are_fixed_and_training_masks_are_fresh(tmp_path, txt_corpus):
    cfg = byte_cfg(tmp_path, txt_corpus)
    first, second = MLMDataModule(cfg, max_len=64, seed=1), MLMDataModule(cfg, max_len=64, seed=2)
    first.setup("fit")
    torch.manual_seed(123)  # consuming the global RNG must not change validation masks
    second.setup("fit")
    for a, b in zip(first.val_dataloader(), second.val_dataloader(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "labels"))
        assert (a["labels"] != -100).any()
    # A training batch's masks are a function of (seed, epoch, rank, batch index) alone: fresh for every batch
    # and rank, the same whenever the same batch is drawn again (a resumed run), whatever the global RNG.
    draw = first.train_dataloader().draw
    rows = first.train_blocks[:8].long()
    one, two, other_rank = (draw(rows, batch_generator(1, 0, rank, index)) for rank, index in ((0, 0), (0, 1), (1, 0)))
    assert not torch.equal(one["labels"], two["labels"]) and not torch.equal(one["labels"], other_rank["labels"])
    torch.manual_seed(7)
    assert torch.equal(draw(rows, batch_generator(1, 0, 0, 0))["input_ids"], one["input_ids"])
    loader = first.train_dataloader()
    epochs = []
    for epoch in (0, 1, 0):
        loader.sampler.set_epoch(epoch)
        torch.manual_seed(epoch)
        epochs.append([b["labels"] for b in loader])
    assert sum(len(b) for b in epochs[0]) == first.num_train_blocks
    assert not any(torch.equal(a, b) for a, b in zip(epochs[0], epochs[1]))
    assert all(torch.equal(a, b) for a, b in zip(epochs[0], epochs[2], strict=True))
