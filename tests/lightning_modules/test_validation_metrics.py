"""What validation scores, as specifications: masked-LM targets split by BERT's action (masked, random, kept),
each a token-weighted mean equal to a hand computation; the per-example sums that ``metrics.json`` keeps for
resampling validation sequences; the unigram baselines on the same targets; and a validation set that is the
same examples with the same masks for every seed and every model, spread over the whole split."""

import math

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from datamodules.language_model import IGNORE_INDEX, MLMDataModule, spread, unigram_baseline
from datamodules.tokenizer import MASK_ID, NUM_SPECIAL
from foundation.configfile import to_container
from foundation.errors import ConfigError
from lightning_modules.language_model import MaskedLMModule
from training import config as run_config
from training.train import train

GROUPS = ("masked", "random", "kept")
_ = IGNORE_INDEX  # not a target


def _module(vocab=12):
    cfg = run_config.load(
        None, ["model.max_len=6", "model.d_model=8", "model.n_heads=2", "model.d_ff=16", "model.attention.kind=full"]
    )
    torch.manual_seed(0)
    return MaskedLMModule(to_container(cfg), vocab, GROUPS).eval()


def _batch(example_index, labels, group, vocab=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.tensor(labels)
    return {
        "input_ids": torch.randint(NUM_SPECIAL, vocab, labels.shape, generator=generator),
        "labels": labels,
        "target_group": torch.tensor(group),
        "example_index": torch.tensor(example_index),
        "attention_mask": None,
    }


def _validate(module, batches):
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.validate(module, dataloaders=torch.utils.data.DataLoader(batches, batch_size=None), verbose=False)
    return trainer.callback_metrics


def test_masked_random_and_kept_scores_equal_a_hand_computation_per_target_and_per_example():
    module = _module()
    # Two batches of two examples, presented out of order (indices 2, 0 then 1, 3); -1: not a target.
    batches = [
        _batch([2, 0], [[7, _, 9, _, _, 5], [_, 6, _, _, 8, _]], [[0, -1, 2, -1, -1, 0], [-1, 1, -1, -1, 0, -1]]),
        _batch(
            [1, 3], [[_, _, 11, _, _, _], [5, 5, _, 7, _, 10]], [[-1, -1, 0, -1, -1, -1], [0, 2, -1, 0, -1, 1]], seed=1
        ),
    ]
    got = _validate(module, batches)
    # By hand: each target's cross-entropy and correctness, collected per example and per group.
    per_example = {i: {g: [] for g in ("all", *GROUPS)} for i in range(4)}
    with torch.no_grad():
        for batch in batches:
            logits = module(batch["input_ids"])  # (B, T, V)
            for row, example in enumerate(batch["example_index"].tolist()):
                for t, label in enumerate(batch["labels"][row].tolist()):
                    if label == IGNORE_INDEX:
                        continue
                    loss = float(F.cross_entropy(logits[row, t], torch.tensor(label)))
                    right = float(logits[row, t].argmax() == label)
                    group = GROUPS[int(batch["target_group"][row, t])]
                    per_example[example]["all"].append((loss, right))
                    per_example[example][group].append((loss, right))
    for group, prefix in (("all", ""), *((g, f"{g}_") for g in GROUPS)):
        scored = [score for example in per_example.values() for score in example[group]]
        assert float(got[f"val/{prefix}loss"]) == pytest.approx(np.mean([s[0] for s in scored]), rel=1e-5)
        assert float(got[f"val/{prefix}accuracy"]) == pytest.approx(np.mean([s[1] for s in scored]), abs=1e-6)
        # Entry i is validation example i, whatever order the batches came in.
        sums = got[f"validation_examples/{prefix}loss/sum"].tolist()
        counts = got[f"validation_examples/{prefix}loss/count"].tolist()
        assert counts == [len(per_example[i][group]) for i in range(4)]
        assert sums == pytest.approx([sum(s[0] for s in per_example[i][group]) for i in range(4)], rel=1e-5)
        right = got[f"validation_examples/{prefix}accuracy/sum"].tolist()
        assert right == [sum(s[1] for s in per_example[i][group]) for i in range(4)]
    assert math.exp(float(got["val/loss"])) == pytest.approx(float(got["val/ppl"]), rel=1e-5)


def test_mlm_targets_are_tagged_with_what_berts_rule_did_to_their_input(tmp_path, tiny_overrides):
    cfg = run_config.load(tiny_overrides.config, [*tiny_overrides.args, "data.tokenizer.kind=byte"])
    dm = MLMDataModule(cfg.data, cfg.model.max_len)
    dm.setup("fit")
    ids = dm.train_blocks.long()
    inputs, labels, group = dm.make_inputs_labels(ids, torch.Generator().manual_seed(0))
    target = labels != IGNORE_INDEX
    assert torch.equal(target, group >= 0) and int(group.max()) == 2
    assert (inputs[group == 0] == MASK_ID).all()  # masked: the input is [MASK]
    assert torch.equal(inputs[group == 2], ids[group == 2])  # kept: the input is the target itself
    replaced = group == 1  # random: a random ordinary token (the target itself only by chance, 1 in 256)
    assert (inputs[replaced] >= NUM_SPECIAL).all() and (inputs[replaced] != ids[replaced]).float().mean() > 0.95
    shares = torch.bincount(group[target], minlength=3).double() / target.sum()
    assert shares.tolist() == pytest.approx([0.8, 0.1, 0.1], abs=0.02)


def test_unigram_baselines_score_each_groups_validation_targets_under_the_training_counts(tiny_overrides):
    cfg = run_config.load(tiny_overrides.config, [*tiny_overrides.args, "data.tokenizer.kind=byte"])
    dm = MLMDataModule(cfg.data, cfg.model.max_len)
    dm.setup("fit")
    counts = torch.zeros(dm.vocab_size, dtype=torch.long)
    generator = torch.Generator().manual_seed(1234)
    for chunk in dm.train_blocks.split(4096):
        labels = dm.make_inputs_labels(chunk.long(), generator)[1]
        counts += torch.bincount(labels[labels != IGNORE_INDEX], minlength=dm.vocab_size)
    _, labels, _, group = dm.val_set.tensors
    got = dm.baselines()
    for g, name in enumerate(GROUPS):
        expected = unigram_baseline(counts, labels[group == g])
        assert got[f"unigram/{name}_loss"] == pytest.approx(expected["trivial_loss"], rel=1e-12)
        assert got[f"unigram/{name}_accuracy"] == pytest.approx(expected["trivial_accuracy"], rel=1e-12)
    assert got["unigram/loss"] == dm.trivial_baseline()["trivial_loss"]


def test_validation_blocks_are_spread_evenly_over_the_whole_split():
    blocks = np.arange(100)[:, None] * np.ones((1, 3), dtype=int)
    assert spread(blocks, 4)[:, 0].tolist() == [0, 25, 50, 75]
    assert spread(blocks, 3)[:, 0].tolist() == [0, 33, 66]
    assert spread(blocks, None) is blocks and spread(blocks, 500) is blocks


@pytest.mark.slow  # two Lightning runs
def test_every_seed_and_every_kind_scores_the_same_validation_targets(tiny):
    common = [*tiny.args, "data.tokenizer.kind=byte", "data.max_val_blocks=16", "trainer.limit_val_batches=2"]
    runs = [
        train(run_config.load(tiny.config, [*common, f"seed={seed}", f"model.attention.kind={kind}"]))
        for seed, kind in ((0, "full"), (1, "no_context"))
    ]
    examples = [run["validation_examples"] for run in runs]
    for metric in ("loss", "masked_loss", "random_loss", "kept_loss"):
        assert examples[0][metric]["count"] == examples[1][metric]["count"]
        assert len(examples[0][metric]["count"]) == 16
    assert runs[0]["baselines"] == runs[1]["baselines"]
    for run, example in zip(runs, examples):
        total = sum(example["masked_loss"]["sum"]) / sum(example["masked_loss"]["count"])
        assert total == pytest.approx(run["val/masked_loss"], rel=1e-5)


def test_validation_set_and_masks_are_the_same_for_every_seed(tiny_overrides):
    cfg = run_config.load(tiny_overrides.config, [*tiny_overrides.args, "data.max_val_blocks=9"])
    sets = []
    for seed in (0, 7):
        dm = MLMDataModule(cfg.data, cfg.model.max_len, seed)
        torch.manual_seed(seed)  # the global RNG changes nothing either
        dm.setup("fit")
        sets.append(dm.val_set.tensors)
    assert len(sets[0][0]) == 9 and all(torch.equal(a, b) for a, b in zip(*sets))


def test_a_validation_pass_shorter_than_the_validation_set_is_refused(tiny_overrides):
    with pytest.raises(ConfigError, match=r"^trainer.limit_val_batches: 2 batches .* validate 16 of"):
        run_config.load(tiny_overrides.config, [*tiny_overrides.args, "data.max_val_blocks=40"])
