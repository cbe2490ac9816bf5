"""The training loss of the token-prediction modules: the targets' positions are found on the host, before the batch
moves to the device, so a step runs no operation whose output size depends on the data (on a GPU such an operation,
a boolean index or ``nonzero``, makes the host wait for the device every step), and the loss and its gradients are
the boolean-index formula's to the last bit."""

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from foundation.configfile import to_container
from lightning_modules.language_model import TARGET_INDEX, CausalLMModule, MaskedLMModule
from training import config as run_config

DATA_DEPENDENT = {"nonzero", "masked_select", "nonzero_static"}


def _module(cls, causal: bool, kind: str = "full"):
    overrides = [
        "model.max_len=8",
        "model.d_model=8",
        "model.n_heads=2",
        "model.d_ff=16",
        f"model.attention.kind={kind}",
    ]
    if kind == "linformer":
        overrides.append("model.attention.options.k=4")
    if causal:
        overrides += ["task=clm", "model.attention.causal=true"]
    torch.manual_seed(0)
    return cls(to_container(run_config.load(None, overrides)), 11)


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 11, (3, 8), generator=g)
    labels = torch.where(torch.rand(3, 8, generator=g) < 0.4, ids, torch.full_like(ids, -100))
    labels[0, 0] = 5  # at least one target
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[2, 6:] = False  # padding
    labels[2, 6:] = -100
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def _grads(module, loss):
    module.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in module.parameters() if p.grad is not None]


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name == "index" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None
        ):
            name = "index with a boolean mask"
        self.seen.add(name)
        return func(*args, **(kwargs or {}))


def test_the_loss_and_its_gradients_are_the_boolean_index_formulas_to_the_last_bit():
    for cls, causal, kind in (
        (MaskedLMModule, False, "full"),
        (MaskedLMModule, False, "linformer"),
        (CausalLMModule, True, "full"),
    ):
        module = _module(cls, causal, kind)
        for seed in range(3):
            batch = _batch(seed)
            target = batch["labels"] != -100
            torch.manual_seed(seed)  # the same dropout draws for each formula
            hidden = module.encoder(batch["input_ids"], batch["attention_mask"])
            expected = F.cross_entropy(module.head(hidden[target]).float(), batch["labels"][target])
            want = _grads(module, expected)
            moved = module.on_before_batch_transfer(dict(batch), 0)
            assert torch.equal(moved[TARGET_INDEX], target.flatten().nonzero().squeeze(1))
            for given in (moved, batch):  # found on the host, or (a batch that skipped the hook) on the spot
                torch.manual_seed(seed)
                loss = module.training_loss(given)
                assert torch.equal(loss, expected), (cls.__name__, kind, seed)
                assert all(torch.equal(a, b) for a, b in zip(_grads(module, loss), want))


def test_a_step_on_a_batch_through_the_hook_runs_no_operation_whose_size_depends_on_the_data():
    module = _module(MaskedLMModule, False, "linformer")
    batch = _batch()
    with _Ops() as without_hook:
        module.training_loss(batch).backward()
    assert without_hook.seen & (DATA_DEPENDENT | {"index with a boolean mask"})  # what the check would catch
    moved = module.on_before_batch_transfer(dict(batch), 0)
    with _Ops() as ops:
        module.training_loss(moved).backward()
    assert not ops.seen & (DATA_DEPENDENT | {"index with a boolean mask"}), ops.seen
