"""What would silently skew or break a GPU run, checked on a CPU machine with CUDA faked.

No GPU is needed: the tests replace ``torch.cuda`` functions (device count, capability, RNG state, allocator
peak) with fakes and give callbacks a module that reports a CUDA device.
"""

from __future__ import annotations

import functools
import json
import types
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from lightning_modules import callbacks
from lightning_modules.callbacks import RunMetrics
from training import config as run_config
from training.resume import LastCheckpoint
from training.train import _precision, _trainer, build_datamodule, build_module, train

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def fake_trainer(**attrs) -> types.SimpleNamespace:
    defaults = dict(
        world_size=1,
        global_step=0,
        log_every_n_steps=1,
        sanity_checking=False,
        should_stop=False,
        state=types.SimpleNamespace(fn="fit"),
        loggers=[],
        callback_metrics={},
        is_global_zero=True,
        precision="32-true",
    )
    return types.SimpleNamespace(**{**defaults, **attrs})


class FakeModule:
    """What RunMetrics reads of a LightningModule: its device, and log_dict."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.logged = device, []

    def log_dict(self, values: dict, **kwargs) -> None:
        self.logged.append(values)


# ---------------------------------------------------------------------------------------- 1. peak memory
def test_the_peak_memory_is_the_cuda_allocators_peak_during_training_not_the_rss_after_teardown(monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    run_metrics, module = RunMetrics(), FakeModule(CUDA)
    batch = {"input_ids": torch.zeros(2, 8, dtype=torch.long)}
    for step in range(1, 3):
        trainer = fake_trainer(global_step=step)
        run_metrics.on_train_batch_start(trainer, module, batch, step - 1)
        run_metrics.on_train_batch_end(trainer, module, None, batch, step - 1)
    run_metrics.on_train_end(fake_trainer(global_step=2), module)
    module.device = CPU  # Lightning's teardown moves the module back to the CPU after fit
    assert run_metrics.device == CUDA and run_metrics.peak_mem_mb == 3 * 1024
    assert module.logged[-1]["perf/peak_mem_mb"] == 3 * 1024
    restored = RunMetrics()  # the figure survives a resume and the end of a ddp_spawn fit (callback state)
    restored.load_state_dict(run_metrics.state_dict())
    assert restored.peak_mem_mb == 3 * 1024


def test_train_reports_the_peak_measured_while_training(tiny_overrides, monkeypatch):
    """metrics.json's peak_mem_mb is the figure RunMetrics took during fit, not one read afterwards from
    ``module.device`` (the CPU by then)."""
    monkeypatch.setattr(callbacks, "peak_memory_mb", lambda device: 2048.0)
    cfg = run_config.load(tiny_overrides.config, [*tiny_overrides.args, "trainer.max_steps=2"])
    metrics = train(cfg)
    assert metrics["peak_mem_mb"] == 2048.0
    assert json.loads((Path(metrics["run_dir"]) / "metrics.json").read_text())["peak_mem_mb"] == 2048.0


# ---------------------------------------------------------------------------------------- 3. FlashAttention
@pytest.mark.parametrize("task, causal", [("mlm", False), ("clm", True)])
def test_packed_lm_batches_reach_full_attention_without_a_mask(tiny_overrides, monkeypatch, task, causal):
    """Packed blocks hold no padding: SDPA must get attn_mask=None (is_causal for CLM), which is what lets
    CUDA pick its flash kernel; an all-True mask would force the masked kernels and, causal, a (B, 1, T, T)
    mask built in every layer."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask, is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    cfg = run_config.load(
        tiny_overrides.config,
        [
            *tiny_overrides.args,
            f"task={task}",
            "model.attention.kind=full",
            f"model.attention.causal={str(causal).lower()}",
        ],
    )
    datamodule = build_datamodule(cfg)
    datamodule.setup("fit")
    module = build_module(cfg, datamodule)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    for loader in (datamodule.train_dataloader(), datamodule.val_dataloader()):
        batch = next(iter(loader))
        assert batch["attention_mask"] is None
        module._loss(batch)
    assert len(calls) == 2 * cfg.model.n_layers
    assert all(mask is None and flag == causal for mask, flag in calls)


# ---------------------------------------------------------------------------------------- 5. RNG per rank
def rank_trainer(rank: int, world: int, device: torch.device) -> types.SimpleNamespace:
    """What LastCheckpoint reads of a trainer: its rank, world size and device (no TensorBoard logger)."""
    return fake_trainer(
        global_rank=rank, world_size=world, is_global_zero=rank == 0, strategy=types.SimpleNamespace(root_device=device)
    )


def fake_cuda_rng(monkeypatch, devices: int) -> dict[int, torch.Tensor]:
    """CUDA generators faked per device (a state is 16 bytes: seed and offset); returns what was restored."""
    states = {i: torch.full((16,), i, dtype=torch.uint8) for i in range(devices)}
    restored: dict[int, torch.Tensor] = {}

    def index(device) -> int:
        return torch.device(device).index

    def set_state(state, device="cuda"):
        if index(device) >= devices:
            raise IndexError(f"no CUDA device {index(device)}")
        restored[index(device)] = state

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": states[index(device)].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in states.values()])
    monkeypatch.setattr(
        torch.cuda, "set_rng_state_all", lambda all_states: [set_state(s, i) for i, s in enumerate(all_states)]
    )
    return restored


def test_each_rank_saves_and_restores_its_own_devices_rng_even_with_fewer_gpus_at_resume(tmp_path, monkeypatch):
    import threading

    import torch.distributed as dist

    restored = fake_cuda_rng(monkeypatch, devices=2)
    # Two DDP ranks saving the same checkpoint (threads standing in for processes; the gather is faked).
    barrier, slots, local = threading.Barrier(2), [None, None], threading.local()

    def all_gather_object(out, obj, group=None):
        slots[local.rank] = obj
        barrier.wait()
        out[:] = list(slots)

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    written: dict[int, dict] = {}

    def save(rank: int) -> None:
        local.rank = rank
        written[rank] = {}
        LastCheckpoint(tmp_path / "last.ckpt").on_save_checkpoint(
            rank_trainer(rank, 2, torch.device("cuda", rank)), None, written[rank]
        )

    threads = [threading.Thread(target=save, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    checkpoint = written[0]  # what rank 0 writes

    # Resumed on the same two GPUs: rank 1 gets device 1's stream back, not rank 0's view of device 1.
    LastCheckpoint(tmp_path / "last.ckpt").on_load_checkpoint(
        rank_trainer(1, 2, torch.device("cuda", 1)), None, checkpoint
    )
    assert list(restored) == [1] and torch.equal(restored[1], torch.full((16,), 1, dtype=torch.uint8))
    # Resumed on one GPU: rank 0 restores its own device's state, and nothing asks for a device that is gone.
    restored = fake_cuda_rng(monkeypatch, devices=1)
    LastCheckpoint(tmp_path / "last.ckpt").on_load_checkpoint(
        rank_trainer(0, 1, torch.device("cuda", 0)), None, checkpoint
    )
    assert list(restored) == [0] and torch.equal(restored[0], torch.zeros(16, dtype=torch.uint8))


def test_a_cpu_run_on_a_gpu_machine_never_touches_cuda(tmp_path, monkeypatch):
    fake_cuda_rng(monkeypatch, devices=2)
    for name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all", "_lazy_init"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, name=name, **k: pytest.fail(f"torch.cuda.{name} called"))
    checkpoint: dict = {}
    callback = LastCheckpoint(tmp_path / "last.ckpt")
    callback.on_save_checkpoint(rank_trainer(0, 1, CPU), None, checkpoint)
    before = torch.rand(3)
    callback.on_load_checkpoint(rank_trainer(0, 1, CPU), None, checkpoint)
    assert torch.equal(torch.rand(3), before)  # the CPU generator is restored


# ---------------------------------------------------------------------------------------- 7. host syncs
def test_run_metrics_synchronises_the_device_once_per_logging_window_not_every_step(monkeypatch):
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    run_metrics, module = RunMetrics(), FakeModule(CUDA)
    batch = {"input_ids": torch.zeros(4, 8, dtype=torch.long)}
    run_metrics.on_train_start(fake_trainer(), module)
    for step in range(1, 11):
        trainer = fake_trainer(global_step=step, log_every_n_steps=5)
        run_metrics.on_train_batch_start(trainer, module, batch, step - 1)
        run_metrics.on_train_batch_end(trainer, module, None, batch, step - 1)
    # after the first step (its own stretch: compiling, the FLOP count), then at steps 5 and 10
    assert len(syncs) == 3 and len(module.logged) == 2
    run_metrics.on_train_end(fake_trainer(global_step=10), module)
    assert len(syncs) == 3 and run_metrics.tokens == 10 * 32 and run_metrics.train_seconds > 0
    assert run_metrics.timed_tokens == 9 * 32 and run_metrics.warmup_s > 0
    window = module.logged[-1]
    assert float(window["perf/tokens_per_sec"]) == pytest.approx(5 * 32 / (5 * float(window["perf/step_time_s"])))


def test_the_divergence_guard_reads_the_loss_on_the_host_only_every_n_steps_and_names_the_step():
    from foundation.errors import Diverged
    from training.divergence import DivergenceGuard

    guard, module = DivergenceGuard(every=4), FakeModule(CPU)
    losses = {1: 2.0, 2: float("nan"), 3: 1.0, 4: float("nan")}
    reads = pytest.MonkeyPatch()
    for name in ("__bool__", "item", "tolist", "__float__", "__int__"):
        reads.setattr(torch.Tensor, name, lambda *a, name=name: pytest.fail(f"Tensor.{name} between checks"))
    try:
        for step in (1, 2, 3):
            guard.on_train_batch_end(
                fake_trainer(global_step=step), module, {"loss": torch.tensor(losses[step])}, None, step - 1
            )
    finally:
        reads.undo()
    with pytest.raises(Diverged, match=r"diverged: train/loss=nan at step 2"):
        guard.on_train_batch_end(fake_trainer(global_step=4), module, {"loss": torch.tensor(losses[4])}, None, 3)


class LoggedTypes(L.Callback):
    """Wraps the module's ``log`` to record the type of every value logged during training steps (from the
    step's start to the end of RunMetrics' on_train_batch_end, which runs before this callback's)."""

    def __init__(self) -> None:
        self.types: dict[str, str] = {}
        self.in_step = False

    def record(self, log, name, value, *args, **kwargs):
        if self.in_step:
            self.types[name] = type(value).__name__
        return log(name, value, *args, **kwargs)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if "log" not in vars(pl_module):
            pl_module.log = functools.partial(self.record, pl_module.log)
        self.in_step = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.in_step = False


def test_a_training_step_logs_no_python_number_and_the_bar_refreshes_with_the_loggers(tiny_overrides):
    """A Python number logged on a GPU becomes a host-to-device copy the host waits for, every step; the
    progress bar reads train/loss back from the device whenever it refreshes."""
    spy = LoggedTypes()
    cfg = run_config.load(
        tiny_overrides.config, [*tiny_overrides.args, "trainer.max_steps=2", "trainer.log_every_n_steps=2"]
    )
    trainer = _trainer(cfg, Path(cfg.output_dir), None, [spy])
    assert trainer.progress_bar_callback.refresh_rate % 2 == 0  # the bar (2) or plain lines (20), at log steps
    train(cfg, callbacks=[spy])
    assert {"train/loss", "train/lr"} <= set(spy.types)
    assert set(spy.types.values()) == {"Tensor"}, spy.types


# ---------------------------------------------------------------------------------------- 7. precision
@pytest.mark.parametrize(
    "capability, expected", [((7, 0), "16-mixed"), ((7, 5), "16-mixed"), ((8, 0), "bf16-mixed"), ((9, 0), "bf16-mixed")]
)
def test_mixed_precision_is_bf16_only_where_the_gpu_computes_it(tiny_overrides, monkeypatch, capability, expected):
    """A V100 (7.0) or T4 (7.5) emulates bf16, slowly: fp16 mixed precision there; bf16 from Ampere (8.0) on."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("is_available() initialises CUDA"))
    config = lambda *more: run_config.load(tiny_overrides.config, [*tiny_overrides.args, *more])  # noqa: E731
    assert _precision(config("trainer.accelerator=auto")) == expected
    assert _precision(config("trainer.accelerator=gpu")) == expected
    assert _precision(config("trainer.accelerator=cpu")) == "32-true"
    assert _precision(config("trainer.accelerator=auto", "trainer.precision=32-true")) == "32-true"


# ---------------------------------------------------------------------------------------- 8. MFU
def test_mfu_is_the_models_flops_per_second_over_the_named_peak_of_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    flops = callbacks.TrainingFlops()
    flops.flops_per_batch = 10**12
    run_metrics, module = RunMetrics(flops), FakeModule(CUDA)
    batch = {"input_ids": torch.zeros(4, 8, dtype=torch.long)}
    run_metrics.on_train_start(fake_trainer(precision="bf16-mixed"), module)
    for step in range(1, 5):
        trainer = fake_trainer(global_step=step, log_every_n_steps=2)
        run_metrics.on_train_batch_start(trainer, module, batch, step - 1)
        flops.on_train_batch_end(trainer, module, None, batch, step - 1)
        run_metrics.on_train_batch_end(trainer, module, None, batch, step - 1)
    run_metrics.on_train_end(fake_trainer(global_step=4), module)
    window = module.logged[-1]  # steps 3 and 4: two batches of 10¹² FLOPs
    seconds = 2 * float(window["perf/step_time_s"])
    assert float(window["perf/mfu"]) == pytest.approx(2e12 / seconds / 989e12, rel=1e-5)
    out = run_metrics.utilisation()
    assert out["device"] == "NVIDIA H200" and out["warmup_s"] > 0
    assert out["mfu"] == pytest.approx(3e12 / run_metrics.train_seconds / 989e12)  # the first step is not timed
    assert out["mfu_peak"].startswith("NVIDIA H200 dense bf16 989 TFLOP/s (NVIDIA H200 datasheet")
    restored = RunMetrics(flops)  # a resumed run, and the end of a ddp_spawn fit, keep the peak it was measured on
    restored.load_state_dict(run_metrics.state_dict())
    assert restored.utilisation() == out


def test_a_device_without_a_known_peak_gets_no_mfu_but_the_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L40")
    flops = callbacks.TrainingFlops()
    flops.flops_per_batch = 10**12
    run_metrics, module = RunMetrics(flops), FakeModule(CUDA)
    batch = {"input_ids": torch.zeros(4, 8, dtype=torch.long)}
    run_metrics.on_train_start(fake_trainer(precision="bf16-mixed"), module)
    for step in range(1, 4):
        run_metrics.on_train_batch_start(fake_trainer(global_step=step), module, batch, step - 1)
        run_metrics.on_train_batch_end(fake_trainer(global_step=step), module, None, batch, step - 1)
    assert module.logged and not any("perf/mfu" in logged for logged in module.logged)
    out = run_metrics.utilisation()
    assert (
        "mfu" not in out
        and out["mfu_unavailable"] == "NVIDIA L40 is not in the peak table (lightning_modules/flops.py PEAKS)"
    )


@pytest.mark.parametrize(
    "name, precision, peak",
    [
        ("NVIDIA H200", "bf16-mixed", 989e12),
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", 989e12),  # the SXM board
        ("NVIDIA H100 PCIe", "16-mixed", 756e12),
        ("NVIDIA A100-SXM4-80GB", "bf16-true", 312e12),
        ("NVIDIA A100 80GB PCIe", "bf16-mixed", 312e12),
        ("NVIDIA A10", "16-mixed", 125e12),
        ("NVIDIA L4", "bf16-mixed", 121e12),
        ("NVIDIA L40S", "bf16-mixed", 362e12),
        # variants whose peak is not in the table never borrow a sibling's
        ("NVIDIA H200 NVL", "bf16-mixed", None),
        ("NVIDIA H100 NVL", "bf16-mixed", None),
        ("NVIDIA A10G", "bf16-mixed", None),
        ("NVIDIA L40", "bf16-mixed", None),
        ("NVIDIA H200", "32-true", None),  # TF32 matmuls: no 16-bit peak applies
        ("cpu", "32-true", None),
    ],
)
def test_the_peak_table_names_a_datasheet_peak_or_says_why_there_is_none(name, precision, peak):
    from lightning_modules.flops import device_peak

    found = device_peak(name, precision)
    if peak is None:
        assert isinstance(found, str) and found
    else:
        flops, named = found
        fmt = "bf16" if precision.startswith("bf16") else "fp16"
        assert flops == peak and named.startswith(f"{name} dense {fmt} {peak / 1e12:.0f} TFLOP/s (NVIDIA")


# ---------------------------------------------------------------------------------------- 9. tensor cores, compile
def test_a_process_that_trains_on_cuda_multiplies_float32_on_the_tensor_cores_and_one_on_the_cpu_does_not():
    """Lightning advises set_float32_matmul_precision on a GPU with Tensor Cores whenever it is still "highest"."""
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        cpu = fake_trainer(strategy=types.SimpleNamespace(root_device=CPU))
        callbacks.Accelerate(compile=False).setup(cpu, None, "fit")
        assert torch.get_float32_matmul_precision() == "highest"
        cuda = fake_trainer(strategy=types.SimpleNamespace(root_device=CUDA))
        callbacks.Accelerate(compile=False).setup(cuda, None, "fit")
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_compile_auto_is_on_where_the_run_trains_on_a_gpu_and_off_on_the_cpu(tiny_overrides, monkeypatch):
    from training.train import compiles

    config = lambda *more: run_config.load(tiny_overrides.config, [*tiny_overrides.args, *more])  # noqa: E731
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert not compiles(config("trainer.accelerator=auto"))
    assert not compiles(config("trainer.accelerator=cpu", "trainer.compile=auto"))
    assert compiles(config("trainer.accelerator=cpu", "trainer.compile=true"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert compiles(config("trainer.accelerator=auto"))
    assert compiles(config("trainer.accelerator=gpu"))
    assert not compiles(config("trainer.accelerator=gpu", "trainer.compile=false"))
    assert not compiles(config("trainer.accelerator=cpu"))
