"""The length curriculum (``optim.short_steps`` steps over ``optim.short_lengths``, then ``model.max_len``): a training
step in the short phase attends within each short block only, over the same tokens in the same order; validation
and every later step see whole blocks; the config refuses what it cannot cut."""

from types import SimpleNamespace

import pytest
import torch

from foundation.configfile import to_container
from foundation.errors import ConfigError
from lightning_modules.language_model import TARGET_INDEX, MaskedLMModule, cut_blocks, target_index
from training import config as run_config

N, SHORT = 16, 4


SMALL = ["model.d_model=8", "model.n_heads=2", "model.d_ff=16", "model.attention.kind=full"]


def _module(short_steps: int = 3, kind: str = "full"):
    overrides = [
        f"model.max_len={N}",
        *SMALL,
        f"model.attention.kind={kind}",
        f"optim.short_steps={short_steps}",
        f"optim.short_lengths=[{SHORT}]",
        "trainer.max_steps=10",
    ]
    if kind == "linformer":
        overrides.append("model.attention.options.k=8")
    torch.manual_seed(0)
    return MaskedLMModule(to_container(run_config.load(None, overrides)), 11)


def _batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 11, (2, N), generator=g)
    labels = torch.where(torch.rand(2, N, generator=g) < 0.4, ids, torch.full_like(ids, -100))
    labels[0, 0] = 5
    return {"input_ids": ids, "labels": labels, "attention_mask": None}


def _at(module, step: int, training: bool = True):
    """The module as a Trainer shows it at optimiser step ``step``."""
    quiet = SimpleNamespace(should_update_logs=False)  # the step writes no logs
    module._trainer = SimpleNamespace(training=training, global_step=step, _logger_connector=quiet)
    return module


def test_cut_blocks_keeps_every_token_and_target_in_its_flat_place():
    batch = _batch()
    cut = cut_blocks(batch, SHORT)
    assert cut["input_ids"].shape == (2 * N // SHORT, SHORT)
    assert torch.equal(cut["input_ids"].flatten(), batch["input_ids"].flatten())
    assert torch.equal(target_index(cut["labels"]), target_index(batch["labels"]))


@pytest.mark.parametrize("kind", ["full", "linformer"])
def test_a_short_step_never_lets_one_short_block_see_another(kind):
    module = _at(_module(kind=kind), step=0)
    seen = []
    module.training_loss = lambda b: seen.append(b) or torch.zeros(())
    module.training_step(module.on_before_batch_transfer(_batch(), 0), 0)
    batch = seen[0]
    assert batch["input_ids"].shape == (2 * N // SHORT, SHORT)
    assert torch.equal(batch[TARGET_INDEX], target_index(batch["labels"]))
    changed = batch["input_ids"].clone()
    changed[1:] = torch.randint(4, 11, changed[1:].shape)  # every short block but the first
    module.eval()
    with torch.no_grad():
        first, again = module(batch["input_ids"])[0], module(changed)[0]
    assert torch.allclose(first, again, atol=1e-6)


def test_the_short_phase_ends_at_short_steps_and_never_reaches_validation():
    module = _module(short_steps=3)
    assert _at(module, 2).short_length() == SHORT
    assert _at(module, 3).short_length() is None
    assert _at(module, 0, training=False).short_length() is None
    seen = []
    module.training_loss = lambda b: seen.append(b) or torch.zeros(())
    _at(module, 5).training_step(module.on_before_batch_transfer(_batch(), 0), 0)
    assert seen[0]["input_ids"].shape == (2, N)


def test_the_short_steps_are_split_evenly_over_the_lengths_in_order():
    module = MaskedLMModule(
        to_container(
            run_config.load(None, [f"model.max_len={N}", *SMALL, "optim.short_steps=6", "optim.short_lengths=[2,4,8]"])
        ),
        11,
    )
    assert [_at(module, step).short_length() for step in range(8)] == [2, 2, 4, 4, 8, 8, None, None]


def test_no_curriculum_by_default():
    module = MaskedLMModule(to_container(run_config.load(None, [f"model.max_len={N}", *SMALL])), 11)
    assert _at(module, 0).short_length() is None


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["optim.short_steps=5", "optim.short_lengths=[5]"], "optim.short_lengths[0]: must divide model.max_len=16"),
        (["optim.short_steps=5", "optim.short_lengths=[4,16]"], "optim.short_lengths[1]: must divide model.max_len=16"),
        (["optim.short_steps=5", "optim.short_lengths=[0]"], "optim.short_lengths[0]"),
        (["optim.short_steps=5", "optim.short_lengths=[]"], "optim.short_lengths: a length curriculum needs"),
        (["optim.short_steps=50", "optim.short_lengths=[4]"], "at most trainer.max_steps=10"),
        (["optim.short_steps=1", "optim.short_lengths=[4,8]"], "at least one step a length (2)"),
        (["optim.short_steps=-1", "optim.short_lengths=[4]"], "optim.short_steps"),
        (["optim.short_steps=5", "optim.short_lengths=[4]", "task=recall", "data.mqar.n_pairs=4"], "task mlm or clm"),
    ],
)
def test_a_curriculum_it_cannot_cut_is_one_line_naming_the_key(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        run_config.load(None, [f"model.max_len={N}", *SMALL, "trainer.max_steps=10", *overrides])
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)
