"""Distributed data-parallel training on 2 CPU processes (gloo).

Fork-based launches: plain ``strategy=ddp`` re-executes the launching script in each extra rank, which under
pytest is the whole test session.
"""

import contextlib
import datetime
import itertools
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny import TINY_MODEL, run_of
from torch.nn.parallel import DistributedDataParallel

from foundation.checkpoint import read_checkpoint
from foundation.configfile import to_container
from foundation.errors import ConfigError
from foundation.rundir import CHECKPOINT, RUN_DIR_ENV, choose_run_dir, shared_with_ranks
from lightning_modules.attention.linformer import LinformerOptions
from lightning_modules.attention.linformer.projections import PROJECTION_KINDS
from lightning_modules.language_model import TokenPredictionModule
from training import config as run_config
from training.train import build_datamodule, build_module, train

WORLD = 2


@pytest.fixture
def small_corpus(tmp_path):
    """A text file whose validation split is a few dozen 32-byte blocks: validated whole, not sampled."""
    rng = random.Random(0)
    words = ["linear", "attention", "low", "rank", "projection", "softmax", "keys", "values", "sequence", "the"]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(25)) for _ in range(150)) + "\n")
    return path


class RecordRank(L.Callback):
    """Each rank writes what it trained on and its final weights (the test compares ranks)."""

    def __init__(self, out: Path) -> None:
        self.out, self.blocks = out, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.blocks.extend(map(tuple, batch["labels"].tolist()))

    def on_fit_end(self, trainer, pl_module):
        torch.save(
            {"weights": pl_module.state_dict(), "blocks": self.blocks, "world": trainer.world_size},
            self.out / f"rank{trainer.global_rank}.pt",
        )


def block_losses(cfg, weights: dict) -> list[tuple]:
    """(summed loss, target count) of every validation block in one process, in the set's order, with ``weights``."""
    datamodule = build_datamodule(cfg)
    datamodule.setup("fit")
    module = build_module(cfg, datamodule)
    module.load_state_dict(weights)
    module.eval()
    val = datamodule.val_set.tensors
    assert len(val[0]) % WORLD == 1  # an odd count: a sampler that pads to equal shares would repeat a block
    with torch.no_grad():
        return [
            (
                F.cross_entropy(module(ids[None])[labels[None] != -100], labels[labels != -100], reduction="sum"),
                (labels != -100).sum(),
            )
            for ids, labels in zip(val[0], val[1])
        ]


@pytest.mark.processes  # ddp_spawn: a second rank
def test_two_process_ddp_keeps_ranks_identical_and_validates_on_the_whole_set(tiny_overrides, tmp_path, small_corpus):
    cfg = run_config.load(
        tiny_overrides.config,
        [
            *tiny_overrides.args,
            f"data.source={small_corpus}",
            "data.tokenizer.kind=byte",
            "data.val_fraction=0.15",
            "data.batch_size=4",
            "trainer.max_steps=4",
            "trainer.val_check_interval=2",
            "trainer.limit_val_batches=1000",
            "model.dropout=0.0",
            "trainer.devices=2",
            "trainer.strategy=ddp_spawn",
            f"run_dir={tmp_path / 'ddp'}",
        ],
    )
    metrics = train(cfg, callbacks=[RecordRank(tmp_path)])

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    assert [r["world"] for r in ranks] == [WORLD, WORLD]
    for name, value in ranks[0]["weights"].items():
        assert torch.equal(value, ranks[1]["weights"][name]), f"{name} differs between the ranks"
    # Each rank trained on its own half of every global batch: 4 steps x 4 blocks each, no block on both.
    assert len(ranks[0]["blocks"]) == len(ranks[1]["blocks"]) == 16
    assert not set(ranks[0]["blocks"]) & set(ranks[1]["blocks"])
    assert metrics["global_step"] == 4 and metrics["tokens"] == 4 * 2 * 4 * 32
    # The checkpoint holds each rank's own generators (gathered), for each rank to restore its own.
    saved = read_checkpoint(tmp_path / "ddp" / CHECKPOINT)["resume_state"]["rng_by_rank"]
    assert len(saved) == WORLD and all(state["cuda"] is None for state in saved)  # a CPU run: no CUDA state

    # The logged validation loss (at the last step, with the final weights) is that of the whole validation set
    # in one process: every block once, token-weighted, although each rank saw only its half.
    losses = block_losses(cfg, ranks[0]["weights"])
    whole = float(sum(s for s, _ in losses) / sum(n for _, n in losses))
    half = float(sum(s for s, _ in losses[::2]) / sum(n for _, n in losses[::2]))
    acc = EventAccumulator(str(tmp_path / "ddp"))
    acc.Reload()
    logged = acc.Scalars("val/loss")
    assert [e.step for e in logged] == [1, 3]
    assert logged[-1].value == pytest.approx(whole, abs=1e-5) and metrics["val/loss"] == pytest.approx(whole, abs=1e-5)
    assert abs(half - whole) > 1e-4  # the check can tell the whole set from one rank's share
    # The per-example sums of metrics.json (gathered from both ranks, brought back from the spawned ones): every
    # validation block once, in the set's order.
    examples = metrics["validation_examples"]["loss"]
    assert examples["count"] == [float(n) for _, n in losses]
    assert examples["sum"] == pytest.approx([float(s) for s, _ in losses], rel=1e-4)


# ---------------------------------------------------------------------------------------- every variant
def _choices(cls: type, name: str) -> tuple:
    if name == "projection":  # a registry, not a Literal: every registered projection kind
        return tuple(PROJECTION_KINDS)
    return typing.get_args(typing.get_type_hints(cls)[name])


STRUCTURAL = ("share", "projection", "compress", "order", "causal")


def attention_variants() -> list[dict]:
    """Every combination of the attention schema's structural choices (read from the schema, so variants are
    covered as they are added); ``order: auto`` is one of ``compress_first`` / ``project_first``."""
    choices = {f: _choices(LinformerOptions, f) for f in STRUCTURAL[:-1]}
    choices["order"] = tuple(p for p in choices["order"] if p != "auto")
    out = [{"kind": "full", "causal": causal} for causal in (False, True)]
    for *combo, causal in itertools.product(*choices.values(), (False, True)):
        out.append({"kind": "linformer", "causal": causal, "options": {"k": 5, **dict(zip(STRUCTURAL, combo))}})
    return out


def accepted_configs(variants: list[dict]) -> list[dict]:
    """Run configs of the variants that the config checks accept (others are refused with a ConfigError)."""
    base = OmegaConf.structured(run_config.RunConfig)
    out = []
    for attention in variants:
        model = {
            "max_len": 16,
            "d_model": 16,
            "n_heads": 2,
            "n_layers": 2,
            "d_ff": 32,
            "norm": "post",
            "attention": attention,
        }
        cfg = OmegaConf.merge(base, {"task": "clm" if attention["causal"] else "mlm", "model": model})
        try:
            run_config.check(cfg)
        except ConfigError:
            continue
        out.append(to_container(cfg))
    return out


def _label(config: dict) -> str:
    att = config["model"]["attention"]
    return " ".join(f"{f}={att.get(f, att['options'].get(f))}" for f in ("kind", *STRUCTURAL))


def _train_every_variant(rank: int, rendezvous: str, configs: list[dict], results) -> None:
    """One rank: each variant wrapped in DDP(find_unused_parameters=False) for 3 SGD steps on this rank's own
    batches; a parameter without gradient makes DDP raise at the next step's forward."""
    failures, label = [], "setup"
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=rendezvous, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120)
        )
        for config in configs:
            label = _label(config)
            torch.manual_seed(0)
            module = TokenPredictionModule(config, vocab_size=40)
            model = DistributedDataParallel(module, find_unused_parameters=False)
            optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
            generator = torch.Generator().manual_seed(rank)
            for step in range(3):
                ids = torch.randint(5, 40, (2, 16), generator=generator)
                mask = torch.ones_like(ids, dtype=torch.bool)
                mask[1, 11:] = False  # padding in one sequence
                if rank == 1 and step == 1:
                    mask[:, 4:] = False  # all of this rank's sequences shorter than k: E still needs a gradient
                loss = F.cross_entropy(model(ids, mask)[mask], ids[mask])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            flat = torch.cat([p.detach().flatten() for p in module.parameters()])
            gathered = [torch.empty_like(flat) for _ in range(WORLD)]
            dist.all_gather(gathered, flat)
            if not torch.equal(gathered[0], gathered[1]):
                failures.append(f"{label}: the ranks' weights differ")
    except Exception as err:  # the process group is out of step after a failed reduction: stop here
        failures.append(f"{label}: {type(err).__name__}: {str(err).splitlines()[0]}")
    results.put((rank, failures))
    # No destroy_process_group: destroying a gloo group while its worker thread still releases the last
    # collective's tensors can deadlock on the GIL; the process ends here (os._exit) anyway.


def test_every_attention_variant_gives_every_parameter_a_gradient_as_ddp_needs():
    """What DDP(find_unused_parameters=False) needs of every accepted combination, checked in one process: after a
    backward every parameter has a gradient (zero counts), also when every sequence of the batch is shorter than
    k, as a rank may draw. Under two real processes, every combination: the slow test below."""
    for config in accepted_configs(attention_variants()):
        torch.manual_seed(0)
        module = TokenPredictionModule(config, vocab_size=40)
        for short in (False, True):
            module.zero_grad(set_to_none=True)
            ids = torch.randint(5, 40, (2, 16))
            mask = torch.ones_like(ids, dtype=torch.bool)
            mask[1, 11:] = False  # padding in one sequence
            if short:
                mask[:, 4:] = False
            F.cross_entropy(module(ids, mask)[mask], ids[mask]).backward()
            missing = [name for name, p in module.named_parameters() if p.requires_grad and p.grad is None]
            assert missing == [], (_label(config), "short" if short else "padded")


@pytest.mark.slow
@pytest.mark.processes
def test_every_attention_variant_and_sharing_mode_trains_under_ddp_without_unused_parameters(tmp_path):
    configs = accepted_configs(attention_variants())
    for field in STRUCTURAL:  # every value of every choice trains in at least one accepted combination
        atts = [c["model"]["attention"] for c in configs if c["model"]["attention"]["kind"] == "linformer"]
        seen = {att["causal"] if field == "causal" else att["options"][field] for att in atts}
        assert seen == set(_choices(LinformerOptions, field) if field != "causal" else (False, True)) - {"auto"}
    ctx = multiprocessing.get_context("spawn")  # fork would copy this process's threads (a deadlock risk)
    results, rendezvous = ctx.Queue(), f"file://{tmp_path / 'rendezvous'}"
    procs = [
        ctx.Process(target=_train_every_variant, args=(rank, rendezvous, configs, results), daemon=True)
        for rank in range(WORLD)
    ]
    for p in procs:
        p.start()
    try:
        outcome = dict(results.get(timeout=300) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert outcome == {0: [], 1: []}, f"{len(configs)} variants"


# ---------------------------------------------------------------------------------------- command-line launches
def _cli_args(config: Path, tmp_path: Path, corpus: Path, data_cache: Path) -> list[str]:
    return [
        "train",
        str(config),
        "experiment=cli",
        f"output_dir={tmp_path / 'runs'}",
        *TINY_MODEL,
        f"data.source={corpus}",
        "data.tokenizer.kind=byte",
        f"data.cache_dir={data_cache}",
        "data.batch_size=4",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.strategy=ddp",
    ]


@pytest.mark.slow
@pytest.mark.processes
def test_strategy_ddp_from_the_command_line_writes_one_run_directory(
    tiny_overrides, tmp_path, small_corpus, data_cache
):
    """Lightning re-runs the command in rank 1, which must join rank 0's run directory, not make its own."""
    args = _cli_args(tiny_overrides.config, tmp_path, small_corpus, data_cache)
    done = subprocess.run([sys.executable, "-m", "experiments.cli", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = run_of(tmp_path / "runs" / "cli")  # one version, in the folder its overrides name
    assert json.loads((run / "metrics.json").read_text())["global_step"] == 4


@pytest.mark.slow
@pytest.mark.processes
def test_torchrun_needs_an_explicit_run_dir_and_then_writes_it_alone(
    tiny_overrides, tmp_path, small_corpus, data_cache
):
    torchrun = [
        str(Path(sys.executable).with_name("torchrun")),
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "experiments.cli",
    ]
    args = _cli_args(tiny_overrides.config, tmp_path, small_corpus, data_cache)
    refused = subprocess.run([*torchrun, *args], capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "error: run_dir: a multi-process launch" in refused.stderr
    assert not (tmp_path / "runs").exists()
    done = subprocess.run(
        [*torchrun, *args, f"run_dir={tmp_path / 'runs' / 'cli' / 'job'}"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.name for p in (tmp_path / "runs" / "cli").iterdir() if p.is_dir()] == ["job"]
    assert json.loads((tmp_path / "runs" / "cli" / "job" / "metrics.json").read_text())["global_step"] == 4


def _children(pid: int) -> set[int]:
    """The processes ``pid`` started (Linux: its threads' children lists)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("signalled", ["rank 0", "rank 1"])
@pytest.mark.processes
def test_sigterm_under_two_rank_ddp_saves_a_resumable_checkpoint_and_exits_143(
    tiny_overrides, tmp_path, small_corpus, data_cache, signalled
):
    """A scheduler's SIGTERM reaches the launching process (rank 0) of a 2-process ``strategy=ddp`` run, or only the
    rank it started: every rank stops after the same step, the checkpoint of that step is saved, the command exits
    143 without metrics.json, no rank is left behind, and ``resume=true`` finishes the run from the saved step."""
    run_dir = tmp_path / "preempted"
    args = [*_cli_args(tiny_overrides.config, tmp_path, small_corpus, data_cache), "trainer.cpu_threads=1"]
    command = [sys.executable, "-m", "experiments.cli"]
    long = [a if a != "trainer.max_steps=4" else "trainer.max_steps=100000" for a in args]
    log = tmp_path / "stderr.txt"  # a file, not a pipe: two ranks' warnings would fill a pipe nobody reads yet
    with log.open("wb") as stderr:
        proc = subprocess.Popen([*command, *long, f"run_dir={run_dir}"], stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / CHECKPOINT).is_file():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.01)
        first = read_checkpoint(run_dir / CHECKPOINT)["global_step"]
        ranks = _children(proc.pid)
        time.sleep(1.0)  # a few steps past that checkpoint
        for pid in [proc.pid] if signalled == "rank 0" else ranks:
            os.kill(pid, signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = log.read_text()
    assert code == 143, err[-3000:]
    assert [line for line in err.splitlines() if line.startswith("terminated: ")], err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert not (run_dir / "metrics.json").exists()
    saved = read_checkpoint(run_dir / CHECKPOINT)
    assert saved["global_step"] > first  # the step reached, not only the last validation's
    assert len(saved["resume_state"]["rng_by_rank"]) == WORLD  # both ranks took part in the save
    deadline = time.monotonic() + 30  # rank 1 ends after rank 0 (Lightning's watcher would kill rank 0 otherwise)
    while [pid for pid in ranks if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ranks and not [pid for pid in ranks if _alive(pid)], "a rank outlived the command by 30 s"
    # It resumes from there, under DDP again, and finishes.
    resumed = [*args, f"trainer.max_steps={saved['global_step'] + 2}", f"run_dir={run_dir}", "resume=true"]
    done = subprocess.run([*command, *resumed], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == saved["global_step"] + 2


def test_a_sigterm_noted_on_any_rank_stops_every_rank_after_the_same_step(monkeypatch):
    """StopTogether in one process, the other rank stood in for by the all-reduce: its handler only notes the
    signal, the all-reduce after each batch carries it (a maximum over ranks), and every rank raises the flag
    Lightning stops on. (Two real processes: the slow test above.)"""
    from training.resume import StopTogether

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    monkeypatch.setattr(StopTogether, "_several", staticmethod(lambda trainer: True))
    sent = []

    def all_reduce(flags, op, other_rank=0):
        sent.append(int(flags.item()))
        flags.fill_(max(int(flags.item()), other_rank))

    here, elsewhere = StopTogether(), StopTogether()
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    here.on_train_batch_end(trainer, None)
    assert sent == [0] and not trainer.received_sigterm  # nobody was signalled: training goes on
    here._note(signal.SIGTERM, None)
    here.on_train_batch_end(trainer, None)
    assert sent == [0, 1] and trainer.received_sigterm  # this rank's signal, sent to the others
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    monkeypatch.setattr(dist, "all_reduce", lambda flags, op: all_reduce(flags, op, other_rank=1))
    elsewhere.on_train_batch_end(trainer, None)
    assert sent[-1] == 0 and trainer.received_sigterm  # another rank's signal stops this one too


def test_every_rank_writes_to_the_run_directory_rank_0_chose(tmp_path, monkeypatch):
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    chosen = choose_run_dir(str(tmp_path), "exp", None, False, rank=0)
    assert chosen == tmp_path / "exp" / "version_0"
    chosen.mkdir(parents=True)
    (chosen / "config.yaml").write_text("")
    with shared_with_ranks(chosen):  # around Trainer.fit, where Lightning starts the ranks of strategy=ddp
        assert choose_run_dir(str(tmp_path), "exp", None, False, rank=1) == chosen.resolve()
    assert RUN_DIR_ENV not in os.environ
    # Ranks that torchrun or srun start side by side cannot agree on "the next free version".
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        with pytest.raises(ConfigError, match="needs run_dir="):
            choose_run_dir(str(tmp_path), "exp", None, False, rank=rank)
    assert choose_run_dir(str(tmp_path), "exp", str(tmp_path / "job"), False, rank=1) == tmp_path / "job"
    assert choose_run_dir(str(tmp_path), "exp", str(tmp_path / "job"), False, rank=0) == tmp_path / "job"
