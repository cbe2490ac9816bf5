"""Training-level parity with the reference libraries (``bench --levels parity``): each library layer trains
through the project's loop, keeps its own kind-specific draws, refuses padding, and the comparison's numbers are
the paired statistics they claim to be. The full parity run (600 steps, every kind, several seeds) is the bench
level itself, not a test: docs/results.md has its table."""

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from experiments import cli
from experiments.benchmarks import parity
from foundation.errors import ConfigError
from foundation.rundir import CHECKPOINT
from lightning_modules.attention import build_attention
from lightning_modules.encoder import TransformerEncoder
from sweeps.spec.stats import compare
from training import config as run_config
from training.train import train

KINDS = list(parity.WRAPPERS)


@pytest.fixture(autouse=True)
def library_kind():
    """The kind ``library`` exists only while the parity bench trains: these tests build it directly."""
    with parity.library_kind():
        yield


def test_the_library_kind_is_registered_only_while_the_parity_bench_trains():
    from lightning_modules.attention import ATTENTION_KINDS

    assert parity.LIBRARY in ATTENTION_KINDS  # inside this module's fixture
    with parity.library_kind():  # entered again: still there afterwards
        pass
    assert parity.LIBRARY in ATTENTION_KINDS


def needs(kind: str) -> None:
    if not parity.available(kind):
        pytest.skip(f"{parity.library_of(kind)[0]} is not installed (extra refs)")


def tiny_config(tmp_path, **trainer) -> str:
    """The byte-MLM base on a little data: a few steps and one validation batch."""
    steps = trainer.get("max_steps", 1)
    path = tmp_path / "tiny.yaml"
    path.write_text(
        f"defaults: [{parity.DEFAULT_CONFIG}]\n"
        "data: {max_texts: 200, max_val_blocks: 64}\n"
        f"trainer: {{max_steps: {steps}, val_check_interval: {steps}, limit_val_batches: 1, cpu_threads: 1}}\n"
    )
    return str(path)


def model(kind: str, **settings) -> dict:
    return {
        "max_len": 32,
        "d_model": 64,
        "n_heads": 2,
        "n_layers": 2,
        "init_std": 0.1,
        "attention": parity.library_attention(kind, 8, settings),
    }


@pytest.mark.parametrize("kind", KINDS)
def test_each_library_layer_trains_a_step_through_the_projects_loop(kind, tmp_path):
    needs(kind)
    run_dir = tmp_path / "run"
    cfg = run_config.load(tiny_config(tmp_path), parity.overrides(parity.library_attention(kind, 8), 0, 1, 1, run_dir))
    metrics = train(cfg)
    assert metrics["global_step"] == 1 and math.isfinite(metrics[parity.METRIC])
    state = torch.load(run_dir / CHECKPOINT, weights_only=True)["state_dict"]
    inner = [key for key in state if ".attn.inner." in key]
    assert inner and not any(".attn.in_proj." in key for key in state)  # the library's Q/K/V/O, not the project's


def test_the_encoder_redraws_the_library_linears_and_keeps_its_other_draws():
    needs("linformer")
    torch.manual_seed(0)
    layer = TransformerEncoder(model("linformer"), 261).blocks[0].attn.inner
    assert abs(float(layer.to_q.weight.std()) - 0.1) < 0.01  # nn.Linear: N(0, init_std²), as every dense weight
    assert float(layer.to_out.bias.abs().max()) == 0
    e = layer.proj_k  # (n, k): lucidrains' U(±1/√k), the bound from k
    assert float(e.abs().max()) <= 8**-0.5
    assert abs(float(e.var()) - 1 / 24) < 0.01
    assert abs(float((e**2).sum(0).mean()) - 32 / 24) < 0.2  # each slot's squared row norm n/(3k) = 1.33


def test_a_padding_mask_is_refused_in_one_line_and_a_full_mask_is_no_mask():
    needs("linformer")
    layer = build_attention(model("linformer")).eval()
    x = torch.randn(2, 32, 64)
    full = torch.ones(2, 32, dtype=torch.bool)
    assert torch.equal(layer(x, full), layer(x))
    padded = full.clone()
    padded[1, 20:] = False
    with pytest.raises(ValueError, match="padding mask is not supported") as err:
        layer(x, padded)
    assert len(str(err.value).splitlines()) == 1


def test_performer_features_are_redrawn_after_the_librarys_interval_of_training_calls():
    needs("performer")
    layer = build_attention(model("performer", feature_redraw_interval=2))
    features = lambda: layer.inner.updater.instance.fast_attention.projection_matrix.clone()  # noqa: E731
    x, first = torch.randn(1, 32, 64), features()
    layer.eval()
    for _ in range(3):
        layer(x)
    assert torch.equal(features(), first)  # evaluation calls do not count
    layer.train()
    layer(x), layer(x)
    assert torch.equal(features(), first)
    layer(x)  # the third training call: two since the last draw
    assert not torch.equal(features(), first)


def test_library_settings_override_the_librarys_defaults():
    needs("nystrom")
    assert build_attention(model("nystrom")).inner.residual  # its default: the value convolution
    assert not build_attention(model("nystrom", residual=False)).inner.residual


@pytest.mark.parametrize(
    "options, message",
    [
        ({"of": "sparse"}, "model.attention.options.of: 'sparse' has no library wrapper (allowed: linformer, "),
        ({"of": "local", "k": 40}, "model.attention.options.k: 40 must be in [1, model.max_len=32]"),
    ],
)
def test_bad_library_options_are_one_line_errors(options, message):
    cfg = model("local")
    cfg["attention"]["options"] = options
    with pytest.raises(ConfigError) as err:
        build_attention(cfg)
    assert str(err.value).startswith(message) and len(str(err.value).splitlines()) == 1


def test_the_summary_is_each_sides_mean_and_gain_and_the_paired_difference():
    losses = {("project", 0): 2.9, ("project", 1): 3.0, ("project", 2): 2.8}
    losses |= {("library", 0): 3.05, ("library", 1): 3.13, ("library", 2): 2.97}
    rows = [
        {"kind": "linformer", "side": side, "seed": seed, "k": 8, "loss": v, "baseline": 3.09}
        for (side, seed), v in losses.items()
    ]
    (entry,) = parity.summary(rows)
    assert entry["project"]["mean"] == pytest.approx(2.9) and entry["project"]["sd"] == pytest.approx(0.1)
    assert entry["library"]["gain"] == pytest.approx(3.09 - 3.05)
    c = compare({s: losses["library", s] for s in range(3)}, {s: losses["project", s] for s in range(3)})
    assert (entry["difference"]["lo"], entry["difference"]["hi"]) == pytest.approx(c.ci())
    assert entry["difference"]["mean"] == pytest.approx(0.15) and entry["difference"]["beyond_noise"]
    table = parity.markdown([entry], ["- header"])
    assert "| linformer | linformer | 3 | 3.090 | 2.900 ± 0.100 | 3.050 ± 0.080 | 0.190 | 0.040 | +0.150 [" in table


def test_the_parity_level_writes_its_table_and_json_and_reads_finished_runs_back(tmp_path):
    needs("local")
    config, runs = tiny_config(tmp_path), tmp_path / "runs"
    argv = ["bench", "--levels", "parity", "--kinds", "local", "--n", "32", "--k", "8", "--threads", "1"]
    argv += ["--parity-config", config, "--parity-runs", str(runs)]
    assert cli.main([*argv, "--seeds", "0", "--out", str(tmp_path / "first")]) == 0
    (first,) = (tmp_path / "first").iterdir()
    assert "| local | local-attention | 1 |" in (first / "parity.md").read_text()
    trained = json.loads((first / "parity.json").read_text())["runs"]
    assert cli.main([*argv, "--seeds", "0,1", "--out", str(tmp_path / "second")]) == 0  # seed 0 read back
    (second,) = (tmp_path / "second").iterdir()
    assert "| local | local-attention | 2 |" in (second / "parity.md").read_text()
    rows = json.loads((second / "parity.json").read_text())["runs"]
    assert [(r["side"], r["seed"]) for r in rows] == [("project", 0), ("library", 0), ("project", 1), ("library", 1)]
    assert rows[:2] == trained  # the same runs, the same numbers


def test_library_settings_from_the_command_line_reach_the_library_side_only(tmp_path):
    needs("nystrom")
    argv = ["bench", "--levels", "parity", "--kinds", "nystrom", "--seeds", "0", "--n", "32", "--k", "8"]
    argv += ["--threads", "1", "--parity-config", tiny_config(tmp_path), "--out", str(tmp_path / "out")]
    assert cli.main([*argv, "--settings", "{nystrom: {residual: false}}"]) == 0
    (out,) = (tmp_path / "out").iterdir()
    runs = {r["side"]: r for r in json.loads((out / "parity.json").read_text())["runs"]}
    library = OmegaConf.load(out / "parity_runs" / "nystrom" / "library" / "seed_0" / "config.yaml")
    assert library.model.attention.options.settings == {"residual": False}
    assert "library settings {'nystrom': {'residual': False}}" in (out / "parity.md").read_text()
    assert runs.keys() == {"project", "library"}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--kinds", "local,sparse"], "--kinds: sparse not allowed (choose from linformer,"),
        (["--kinds", "local", "--settings", "{lsh: {n_hashes: 1}}"], "--settings: lsh is not a kind this run trains"),
    ],
)
def test_a_bad_parity_argument_is_a_one_line_error_before_anything_is_written(tmp_path, capsys, extra, message):
    assert cli.main(["bench", "--levels", "parity", *extra, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "out").exists()
