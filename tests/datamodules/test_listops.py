"""LRA ListOps: the generator's answers against an independent evaluator, its shapes, and the data module."""

import json
import math
import random
import statistics

import pytest
import tiny
import torch
from omegaconf import OmegaConf
from tiny import run_of

from datamodules import listops
from datamodules.config import ListOpsConfig
from datamodules.listops import VOCAB, ListOpsDataModule, decode, generate
from experiments import cli
from foundation.errors import ConfigError
from training.config import load

CONFIGS = tiny.REPO / "experiments" / "configs"

# ------------------------------------------------------------------------------- independent evaluator
# Written from the task's definition (LRA, Tay et al. 2020), sharing no code with datamodules/listops.py:
# a token-string parser with an explicit stack, and the standard library's median.
SEMANTICS = {
    "[MAX": max,
    "[MIN": min,
    "[MED": lambda xs: math.floor(statistics.median(xs)),
    "[SM": lambda xs: sum(xs) % 10,
}


def evaluate(expression: str) -> tuple[int, int, list[int]]:
    """(value, depth, argument count of every operator) of an expression written as space-separated tokens."""
    stack, depth, arities, value = [], 0, [], None
    for token in expression.split():
        if token in SEMANTICS:
            stack.append([token])
            depth = max(depth, len(stack))
        elif token == "]":
            op, *args = stack.pop()
            arities.append(len(args))
            result = SEMANTICS[op](args)
            if stack:
                stack[-1].append(result)
            else:
                assert value is None, "two top-level expressions"
                value = result
        else:
            assert token.isdigit() and len(token) == 1 and stack, f"stray token {token!r}"
            stack[-1].append(int(token))
    assert not stack and value is not None, "unbalanced expression"
    return value, depth, arities


@pytest.mark.parametrize(
    "expression, value",
    [
        ("[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]", 5),  # LRA paper's example
        ("[MED 1 2 3 4 ]", 2),  # even count: mean of 2 and 3, rounded down
        ("[MED 9 0 ]", 4),
        ("[SM 9 9 [MAX 1 5 ] ]", 3),  # (9 + 9 + 5) mod 10
        ("[MIN [SM 5 5 ] 7 ]", 0),
    ],
)
def test_the_evaluator_itself_follows_the_definition(expression, value):
    assert evaluate(expression)[0] == value


# ------------------------------------------------------------------------------- generator
def cfg(**overrides):
    return OmegaConf.merge(OmegaConf.structured(ListOpsConfig), overrides)


@pytest.mark.parametrize(
    "shape",
    [
        dict(min_length=20, max_length=120, max_depth=4, max_args=5),
        dict(),
    ],  # LRA's: 500-2,000 tokens, depth 10, 10 arguments
    ids=["small", "lra"],
)
def test_generated_answers_match_an_independent_evaluator(shape):
    c = cfg(**shape)
    sequences, values = generate(300 if shape else 25, c, random.Random(7))
    for ids, value in zip(sequences, values):
        expression = decode(ids)
        got, depth, arities = evaluate(expression)
        assert got == value, expression
        assert c.min_length <= len(ids) <= c.max_length
        assert depth <= c.max_depth and all(2 <= a <= c.max_args for a in arities)
    assert len(set(values.tolist())) >= (10 if shape else 4)  # answers spread over the classes


def test_generation_is_seeded_and_uses_the_whole_vocabulary():
    c = cfg(min_length=20, max_length=120, max_depth=4, max_args=5)
    first, again, other = (generate(50, c, random.Random(s)) for s in (1, 1, 2))
    assert all((a == b).all() for a, b in zip(first[0], again[0])) and (first[1] == again[1]).all()
    assert any(len(a) != len(b) or (a != b).any() for a, b in zip(first[0], other[0]))
    used = set(torch.cat([torch.as_tensor(s.astype("int64")) for s in first[0]]).tolist())
    assert used == set(range(1, len(VOCAB)))  # every token but [PAD]


# ------------------------------------------------------------------------------- data module
def listops_data(tmp_path, **listops_cfg):
    """A small ListOps ``data`` config (tiny.data_cfg) with ``listops_cfg`` over its generator settings."""
    return tiny.data_cfg(
        tmp_path,
        batch_size=4,
        listops={
            "n_train": 40,
            "n_val": 12,
            "n_test": 12,
            "min_length": 10,
            "max_length": 60,
            "max_depth": 3,
            "max_args": 4,
            **listops_cfg,
        },
    )


def test_data_module_batches_splits_and_cache(tmp_path, monkeypatch):
    dm = ListOpsDataModule(listops_data(tmp_path), max_len=60, seed=3)
    dm.prepare_data()
    dm.setup("fit")
    assert (dm.vocab_size, dm.num_labels) == (16, 10)
    batch = next(iter(dm.val_dataloader()))
    assert batch["input_ids"].shape[0] == 4 and batch["labels"].shape == (4,)
    assert torch.equal(batch["attention_mask"], batch["input_ids"] != 0)
    for ids, mask, label in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]):
        assert evaluate(decode(ids[mask].tolist()))[0] == label
        assert mask[: mask.sum()].all()  # padding only at the end
    texts = {split: {decode(ids) for ids in dm.datasets[split].ids} for split in ("train", "validation", "test")}
    assert not texts["train"] & texts["validation"] and not texts["validation"] & texts["test"]
    # Another seed changes the training set, never validation or test; a second module reads the cache.
    monkeypatch.setattr(listops, "generate", lambda *a: pytest.fail("regenerated a cached split"))
    same = ListOpsDataModule(listops_data(tmp_path), max_len=60, seed=3)
    same.setup()
    assert [decode(i) for i in same.datasets["train"].ids] == [decode(i) for i in dm.datasets["train"].ids]
    monkeypatch.undo()
    other = ListOpsDataModule(listops_data(tmp_path), max_len=60, seed=4)
    other.setup()
    assert {decode(i) for i in other.datasets["validation"].ids} == texts["validation"]
    assert {decode(i) for i in other.datasets["train"].ids} != texts["train"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.listops.max_length=3000", "model.max_len: 2000 is shorter than data.listops.max_length=3000"),
        ("data.listops.min_length=3", "data.listops.min_length: must be in [4, data.listops.max_length=2000], got 3"),
        ("data.listops.max_args=1", "data.listops.max_args: must be >= 2, got 1"),
    ],
)
def test_listops_config_errors_are_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        load(CONFIGS / "listops.yaml", [override])
    assert str(err.value) == message


def test_listops_trains_end_to_end_with_test_metrics(tiny_overrides, tmp_path):
    args = [
        *tiny_overrides.args,
        "task=listops",
        "model.max_len=48",
        "data.listops.n_train=64",
        "data.listops.n_val=16",
        "data.listops.n_test=16",
        "data.listops.min_length=8",
        "data.listops.max_length=48",
        "data.listops.max_depth=3",
        "data.listops.max_args=4",
    ]
    assert cli.main(["train", str(tiny_overrides.config), *args]) == 0
    run = run_of(tmp_path / "runs" / "tiny")
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ("val/accuracy", "test/accuracy", "test/f1", "test/loss", "trivial_accuracy"):
        assert 0 <= metrics[key] < math.inf, key
    assert (run / "checkpoints" / "best.ckpt").is_file() and not (run / "tokenizer.json").exists()
