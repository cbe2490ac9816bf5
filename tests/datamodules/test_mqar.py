"""Multi-query associative recall (task: recall) and the trivial baselines written into metrics.json.

The generator is checked against an independent reading of its sequences: the decoder below knows only
the documented layout (keys 1 … V//2, values V//2+1 … V, no padding) and rebuilds every label itself.
"""

import json
import math

import pytest
import torch
from tiny import run_of

from datamodules.language_model import CausalLMDataModule, MLMDataModule, unigram_baseline
from datamodules.mqar import MQARDataModule
from experiments import cli
from foundation.errors import ConfigError
from training import config as run_config
from training.train import build_module

IGNORE = -100


def decode(tokens: list[int], vocab_size: int) -> tuple[dict[int, int], list[int], list[int]]:
    """Read one sequence left to right: (key → value of each pair, the queries, the labels they imply).

    Pairs are (key, value) tokens at the front; the first key that was already seen starts the queries,
    each of which must be a key of a pair, up to the end. Anything else fails an assertion."""
    n_keys = vocab_size // 2
    is_key = lambda t: 1 <= t <= n_keys  # noqa: E731
    is_value = lambda t: n_keys < t <= vocab_size  # noqa: E731
    pairs: dict[int, int] = {}
    labels: list[int] = []
    i = 0
    while i < len(tokens) and is_key(tokens[i]) and tokens[i] not in pairs:
        assert is_value(tokens[i + 1]), f"key {tokens[i]} at {i} is not followed by a value"
        pairs[tokens[i]] = tokens[i + 1]
        labels += [IGNORE, IGNORE]
        i += 2
    queries = []
    while i < len(tokens):
        assert tokens[i] in pairs, f"position {i} holds {tokens[i]}, which is not a key of this sequence"
        queries.append(tokens[i])
        labels.append(pairs[tokens[i]])
        i += 1
    return pairs, queries, labels


def _cfg(*overrides, max_len=48):
    return run_config.load(
        None,
        [
            "task=recall",
            f"model.max_len={max_len}",
            "model.attention.kind=full",
            "data.mqar.n_train=64",
            "data.mqar.n_val=16",
            *overrides,
        ],
    )


def _data(cfg, seed=0):
    dm = MQARDataModule(cfg.data, cfg.model.max_len, seed)
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("n_pairs, n_queries, vocab_size", [(8, None, 64), (12, 5, 30), (1, 1, 4)])
def test_every_query_is_labelled_with_the_value_paired_with_its_key(n_pairs, n_queries, vocab_size):
    cfg = _cfg(
        f"data.mqar.n_pairs={n_pairs}",
        f"data.mqar.n_queries={'null' if n_queries is None else n_queries}",
        f"data.mqar.vocab_size={vocab_size}",
    )
    dm = _data(cfg)
    for dataset in (dm.train_set, dm.val_set):
        inputs, labels = dataset.tensors[:2]
        assert inputs.shape == labels.shape == (len(inputs), 2 * n_pairs + (n_queries or n_pairs))  # of n = 48
        for row, row_labels in zip(inputs.tolist(), labels.tolist()):
            pairs, queries, expected = decode(row, vocab_size)
            assert len(pairs) == n_pairs
            assert len(queries) == (n_queries or n_pairs) and len(set(queries)) == len(queries)
            assert row_labels == expected
    batch = next(iter(dm.val_dataloader()))
    assert batch["attention_mask"] is None  # nothing is padded
    assert dm.vocab_size == vocab_size + 1 and int(inputs.max()) <= vocab_size


@pytest.mark.parametrize(
    "attention",
    [
        ["model.attention.kind=full"],
        ["model.attention.kind=linformer", "model.attention.options.k=6"],
        ["model.attention.kind=sparse", "model.attention.options={block: 4, summary: 1}"],
        ["model.attention.kind=local", "model.attention.options.window=6"],
        ["model.attention.kind=lsh", "model.attention.options.bucket_size=6"],
        ["model.attention.kind=performer", "model.attention.options.n_features=6"],
        ["model.attention.kind=nystrom", "model.attention.causal=false", "model.attention.options.n_landmarks=6"],
    ],
)
def test_unpadded_sequences_give_the_loss_of_the_same_sequences_padded_to_n(attention):
    """Sequences are 2N + Q tokens, never padded up to n: the model's loss (and gradient) is the one it would
    have on them padded to n under their mask, so dropping the padding changes nothing but the cost."""
    cfg = _cfg("data.mqar.n_pairs=4", "model.dropout=0", "model.attention.causal=true", *attention, max_len=24)
    dm = _data(cfg)
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[1] == 12 and batch["attention_mask"] is None  # 2 · 4 + 4 of n = 24
    padded = {
        "input_ids": torch.nn.functional.pad(batch["input_ids"], (0, 12)),  # [PAD] = 0
        "labels": torch.nn.functional.pad(batch["labels"], (0, 12), value=IGNORE),
        "attention_mask": torch.arange(24).expand(len(batch["input_ids"]), 24) < 12,
    }
    torch.manual_seed(0)
    module = build_module(cfg, dm)
    losses, grads = [], []
    for b in (batch, padded):
        module.zero_grad()
        loss = module.training_loss(b)
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None]))
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_no_answer_appears_in_the_input_after_its_query():
    inputs, labels = _data(_cfg("data.mqar.n_pairs=10", "data.mqar.vocab_size=20")).train_set.tensors
    for row, row_labels in zip(inputs, labels):
        first_query = int((row_labels != IGNORE).nonzero()[0])
        assert not (row[first_query:] > 10).any()  # values are 11 … 20: none from the first query on


def test_values_and_queried_pairs_cover_their_ranges_uniformly():
    dm = _data(_cfg("data.mqar.n_pairs=4", "data.mqar.vocab_size=8", "data.mqar.n_train=4000"))
    inputs, labels = dm.train_set.tensors
    targets = labels[labels != IGNORE]
    counts = torch.bincount(targets, minlength=9)[5:]  # the 4 values 5 … 8
    assert counts.sum() == 4 * 4000 and (counts - 4000).abs().max() < 300  # ± ~5 standard deviations
    queried_pair = (inputs[:, 8:12, None] == inputs[:, None, 0:8:2]).float().argmax(-1)  # (N, Q): which pair
    assert torch.bincount(queried_pair.flatten(), minlength=4).min() > 3700


def test_training_set_is_fixed_by_the_seed_and_validation_set_by_nothing():
    cfg = _cfg()
    a, b, c = _data(cfg, seed=0), _data(cfg, seed=0), _data(cfg, seed=1)
    assert a.train_set.tensors[0].equal(b.train_set.tensors[0])
    assert not a.train_set.tensors[0].equal(c.train_set.tensors[0])
    assert a.val_set.tensors[0].equal(c.val_set.tensors[0]) and a.val_set.tensors[1].equal(c.val_set.tensors[1])
    order = lambda dm: torch.cat([x["input_ids"] for x in dm.train_dataloader()])  # noqa: E731
    assert order(a).equal(order(b))


def test_recall_trivial_baseline_is_a_uniform_guess_among_the_values():
    dm = _data(_cfg("data.mqar.vocab_size=21", "data.mqar.n_pairs=4"))  # 10 keys, 11 values
    assert dm.trivial_baseline() == pytest.approx({"trivial_loss": math.log(11), "trivial_accuracy": 1 / 11})


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.mqar.n_pairs=33", "data.mqar.n_pairs"),  # only 32 distinct keys in 64 tokens
        ("data.mqar.n_queries=17", "data.mqar.n_queries"),  # more queries than pairs
        ("data.mqar.n_pairs=17", "model.max_len"),  # 3 * 17 > 48
        ("data.mqar.vocab_size=2", "data.mqar.vocab_size"),
        ("data.mqar.n_train=0", "data.mqar.n_train"),
    ],
)
def test_impossible_recall_settings_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        _cfg(override)


def test_unigram_baseline_scores_validation_targets_under_smoothed_training_counts():
    counts = torch.tensor([0, 3, 1])  # p = (c + 1) / 7 = [1, 4, 2] / 7
    got = unigram_baseline(counts, torch.tensor([1, 2, 2]))
    assert got["trivial_loss"] == pytest.approx(-(math.log(4 / 7) + 2 * math.log(2 / 7)) / 3)
    assert got["trivial_accuracy"] == pytest.approx(1 / 3)  # the majority token 1 is right once


@pytest.mark.parametrize("cls", [CausalLMDataModule, MLMDataModule])
def test_language_model_trivial_baseline_is_the_training_unigram_cross_entropy(cls, tiny_overrides):
    cfg = run_config.load(tiny_overrides.config, tiny_overrides.args)
    dm = cls(cfg.data, cfg.model.max_len, 0)
    dm.setup("fit")
    # Independently: the target distribution of both objectives is that of the ordinary tokens of the
    # training text (CLM: every token after the first of a block; MLM: a uniform 15% of ordinary tokens).
    train = dm.train_blocks.long()
    train = train[:, 1:] if cls is CausalLMDataModule else train[train >= 5]
    p = (torch.bincount(train.flatten(), minlength=dm.vocab_size).double() + 1) / (train.numel() + dm.vocab_size)
    val = dm.val_set.tensors[1]
    val = val[val != IGNORE]
    got = dm.trivial_baseline()
    # CLM counts exactly these targets; MLM counts a 15% sample of them, hence the tolerance.
    tol = 1e-9 if cls is CausalLMDataModule else 0.05
    assert got["trivial_loss"] == pytest.approx(float(-p.log()[val].mean()), rel=tol)
    assert got["trivial_accuracy"] == pytest.approx(float((val == p.argmax()).double().mean()), abs=tol)
    assert 0 < got["trivial_loss"] < math.log(dm.vocab_size)


def test_recall_run_writes_recall_accuracy_and_its_trivial_baseline(tiny_overrides, tmp_path):
    args = [
        "train",
        str(tiny_overrides.config),
        *tiny_overrides.args,
        "task=recall",
        "data.mqar.n_pairs=8",
        "data.mqar.vocab_size=16",
        "data.mqar.n_train=256",
        "data.mqar.n_val=32",
        "model.attention.kind=linformer",
        "model.attention.causal=true",
    ]  # as the CPU presets train
    assert cli.main(args) == 0
    metrics = json.loads((run_of(tmp_path / "runs" / "tiny") / "metrics.json").read_text())
    assert metrics["trivial_loss"] == pytest.approx(math.log(8)) and metrics["trivial_accuracy"] == 0.125
    assert metrics["baselines"] == pytest.approx({"unigram/loss": math.log(8), "unigram/accuracy": 0.125})
    assert 0.0 <= metrics["val/accuracy"] <= 1.0 and math.isfinite(metrics["val/loss"])
    # Per validation example (limit_val_batches=2 batches of 8: the first 16 of 32), each of its 8 queries.
    accuracy = metrics["validation_examples"]["accuracy"]
    assert accuracy["count"] == [8.0] * 16 and all(s in range(9) for s in accuracy["sum"])
    assert sum(accuracy["sum"]) / 128 == pytest.approx(metrics["val/accuracy"], abs=1e-6)
