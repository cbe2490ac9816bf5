"""The model-size ladder (sweeps/scale.yaml, docs/scale.md): training FLOPs in metrics.json, the ladder field of
a study file, the gap trend and its interval, the scale report, and the GPU presets' configs checked on a CPU."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from tiny import REPO

from experiments import cli
from foundation.configfile import to_container
from foundation.errors import ConfigError
from lightning_modules.callbacks import TrainingFlops
from lightning_modules.flops import count_flops, training_step_flops
from lightning_modules.language_model import MaskedLMModule
from sweeps import stored
from sweeps.spec.study import load_study
from training import config as run_config
from training.train import train


# --------------------------------------------------------------------------------------- training FLOPs
def _tiny_mlm(layers: int = 2, d: int = 32, heads: int = 2, d_ff: int = 64, n: int = 16, vocab: int = 50):
    cfg = run_config.load(
        REPO / "experiments" / "configs" / "base.yaml",
        [
            f"model.n_layers={layers}",
            f"model.d_model={d}",
            f"model.n_heads={heads}",
            f"model.d_ff={d_ff}",
            f"model.max_len={n}",
            "model.dropout=0.0",
            "model.attention.kind=full",
        ],
    )
    return MaskedLMModule(to_container(cfg), vocab)


def test_one_training_step_counts_the_hand_computed_flops_of_a_tiny_transformer():
    """Forward + backward of every linear layer is 6·m·in·out (2 forward, 4 backward: the input's and the
    weight's gradient); attention (SDPA's CPU flash kernel) 4·B·h·T²·d_h forward and 10·B·h·T²·d_h backward;
    the LM head (dense d×d, then the tied decoder d×V) runs only at the M masked positions."""
    layers, d, d_ff, n, vocab, batch = 2, 32, 64, 16, 50, 3
    module = _tiny_mlm(layers, d, 2, d_ff, n, vocab).train()
    input_ids = torch.randint(5, vocab, (batch, n), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(input_ids, -100)
    labels[:, ::4] = input_ids[:, ::4]  # M = 3 · 4 masked positions
    masked = int((labels != -100).sum())
    tokens = batch * n
    expected = (
        6 * tokens * layers * (4 * d * d + 2 * d * d_ff)  # Q, K, V, O and the FFN
        + layers * (4 + 10) * batch * n * n * d  # QKᵀ and PV, forward and backward
        + 6 * masked * (d * d + d * vocab)
    )  # the LM head
    flops = training_step_flops(module, lambda: module.training_loss({"input_ids": input_ids, "labels": labels}))
    assert flops == expected
    # ≈ 6·N·tokens for the non-embedding weights N = L·(4d² + 2·d·d_ff) when attention and the head are small
    six_n_tokens = 6 * layers * (4 * d * d + 2 * d * d_ff) * tokens
    assert six_n_tokens < flops < 1.5 * six_n_tokens


def test_counting_a_step_leaves_the_gradients_and_the_random_state_untouched():
    module = _tiny_mlm()
    module.train()
    batch = {"input_ids": torch.randint(5, 50, (2, 16)), "labels": torch.randint(5, 50, (2, 16))}
    state = torch.get_rng_state()
    flops = training_step_flops(module, lambda: module.training_loss(batch))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in module.parameters())
    direct, _ = count_flops(
        lambda: torch.autograd.grad(module.training_loss(batch), [p for p in module.parameters() if p.requires_grad])
    )
    assert flops == direct


def test_a_run_records_its_training_flops_and_trains_exactly_as_it_would_without_the_count(tiny_overrides, monkeypatch):
    cfg = run_config.load(tiny_overrides.config, tiny_overrides.args + ["model.dropout=0.1"])
    counted = train(cfg)
    assert counted["flops_per_batch"] > 0 and counted["train_flops"] == counted["flops_per_batch"] * 6
    written = json.loads((Path(counted["run_dir"]) / "metrics.json").read_text())
    assert written["train_flops"] == counted["train_flops"]
    monkeypatch.setattr(TrainingFlops, "on_train_batch_start", lambda *args: None)
    plain = train(cfg)
    assert plain["train_flops"] is None
    assert plain["val/loss"] == counted["val/loss"]  # same dropout draws, same updates


# --------------------------------------------------------------------------------------- the trend
def test_the_gap_trend_and_its_slope_interval_match_scipy_linregress():
    from scipy import stats as sp

    from sweeps.report import stats

    x = [4.57, 4.57, 4.57, 5.01, 5.01, 5.01, 5.54, 5.54, 5.54]  # log10 parameters, 3 seeds a rung
    y = [0.021, 0.018, 0.030, 0.034, 0.029, 0.041, 0.052, 0.047, 0.060]  # gaps
    t, ref = stats.trend(x, y), sp.linregress(x, y)
    assert (t.slope, t.intercept, t.slope_se) == pytest.approx((ref.slope, ref.intercept, ref.stderr), rel=1e-12)
    half = sp.t.ppf(0.975, len(x) - 2) * ref.stderr
    assert t.slope_ci() == pytest.approx((ref.slope - half, ref.slope + half), rel=1e-12)
    assert t.at(5.0) == pytest.approx(ref.intercept + 5.0 * ref.slope)
    # too few points for a spread, or a single size: no interval, and no slope without 2 sizes
    assert math.isnan(stats.trend([1.0, 2.0], [0.1, 0.3]).slope_ci()[0])
    assert math.isnan(stats.trend([1.0, 1.0, 1.0], [0.1, 0.2, 0.3]).slope)


# --------------------------------------------------------------------------------------- the ladder field
RUNGS = {
    "s1": {"model.n_layers": 1, "model.d_model": 16, "model.d_ff": 32, "model.attention.options.k": 4},
    "s2": {"model.n_layers": 2, "model.d_model": 24, "model.d_ff": 48, "model.attention.options.k": 6},
    "s3": {"model.n_layers": 2, "model.d_model": 32, "model.d_ff": 64, "model.attention.options.k": 8},
}
LADDER_ARMS = {"full": {"model.attention.kind": "full"}, "linformer": {"model.attention.kind": "linformer"}}


def ladder_study(tmp_path: Path, tiny, name: str = "ladder", **changes) -> Path:
    """A 3-rung ladder (s1 < s2 < s3) × {full, linformer} × seeds 0, 1 over the tiny run config; ``changes``
    replace top-level keys of the study file."""
    base = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in tiny.args)}
    study = {
        "study": name,
        "base": str(tiny.config),
        "overrides": base,
        "space": {"seed": {"choices": [0, 1]}, "rung": {"choices": RUNGS}, "arm": {"choices": LADDER_ARMS}},
        "arms": ["rung", "arm"],
        "ladder": {"rung": "rung", "reference": {"arm": "full"}},
        **changes,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def test_a_ladder_study_names_its_rungs_and_compares_arms_only_within_a_rung(tmp_path, tiny_overrides):
    study = load_study(ladder_study(tmp_path, tiny_overrides))
    assert study.rungs == ["s1", "s2", "s3"] and study.n_trials == 12
    assert study.arm_label({"seed": 0, "rung": "s2", "arm": "full"}) == "s2 full"
    assert study.arm_label({"seed": 0, "rung": "s2", "arm": "full"}, without=["rung"]) == "full"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"ladder": {"rung": "size", "reference": {"arm": "full"}}}, "ladder.rung: 'size' is not a param of space"),
        ({"ladder": {"rung": "seed", "reference": {"arm": "full"}}}, "ladder.rung: 'seed' must be one of arms"),
        (
            {"ladder": {"rung": "rung"}},
            "ladder.reference: give the reference arm's value of 'arm' (choices: full, linformer)",
        ),
        (
            {"ladder": {"rung": "rung", "reference": {"arm": "fast"}}},
            "ladder.reference.arm: 'fast' is not a choice of space.arm (choices: full, linformer)",
        ),
        (
            {"ladder": {"rung": "rung", "reference": {"arm": "full", "seed": 0}}},
            "ladder.reference.seed: not an arm param beside the rung (arm params: arm)",
        ),
        ({"arms": ["rung"]}, "ladder: arms has no param beside the rung 'rung'"),
        (
            {
                "space": {
                    "seed": {"choices": [0, 1]},
                    "rung": {"choices": {"s2": RUNGS["s2"], "s1": RUNGS["s1"]}},
                    "arm": {"choices": LADDER_ARMS},
                }
            },
            "ladder.rung: rungs must grow, smallest first: 's1' has 7,568 parameters, not more than 's2' before it (17,760)",
        ),
        ({"sampler": {"kind": "random"}, "budget": {"n_trials": 2}}, "ladder: a ladder is a grid"),
    ],
)
def test_a_bad_ladder_is_one_line_naming_the_key(tmp_path, tiny_overrides, changes, message):
    with pytest.raises(ConfigError) as err:
        load_study(ladder_study(tmp_path, tiny_overrides, **changes))
    assert message in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------------------- the scale report
def _add_trial(ostudy, seed: int, rung: str, arm: str, value: float, metrics: dict, **attrs) -> None:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    ostudy.add_trial(
        optuna.trial.create_trial(
            params={"seed": seed, "rung": rung, "arm": arm},
            distributions={
                "seed": IntDistribution(0, 1),
                "rung": CategoricalDistribution(list(RUNGS)),
                "arm": CategoricalDistribution(list(LADDER_ARMS)),
            },
            value=value,
            user_attrs={"metrics": {"val/loss": value, **metrics}, **attrs},
        )
    )


def test_the_scale_report_gives_each_rungs_gap_its_verdict_and_the_trend_over_size(tmp_path, tiny_overrides):
    """Stored trials with known numbers (no training): rungs of 10k, 100k and 1M parameters, the Linformer gap
    0.01·(rung + 1) ± 0.002 over two seeds, so the trend is +0.01 per tenfold parameters."""
    from sweeps.report import stats
    from sweeps.report.command import write_report
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

    study = load_study(ladder_study(tmp_path, tiny_overrides, name="fake_ladder"))
    ostudy = open_study(RunStorage(study, None))
    for i, rung in enumerate(RUNGS):
        for seed, noise in ((0, 0.002), (1, -0.002)):
            full = 3.0 - 0.1 * i + 0.05 * seed
            size = {"parameters": 10 ** (4 + i), "train_flops": 6e9 * 10 ** (2 * i), "tokens": 1e6}
            _add_trial(ostudy, seed, rung, "full", full, size)
            _add_trial(ostudy, seed, rung, "linformer", full + 0.01 * (i + 1) + noise, size)
    out = write_report(study)
    summary = (out / "summary.md").read_text()
    lines = summary.splitlines()
    # the answer: the gap at every rung with its verdict, then the trend per tenfold parameters
    t = stats.trend([4, 4, 5, 5, 6, 6], [0.012, 0.008, 0.022, 0.018, 0.032, 0.028])
    lo, hi = t.slope_ci()
    assert t.slope == pytest.approx(0.01)
    assert lines[2] == (
        "**Answer:** linformer − full on val/loss: +0.01 at s1 (10k parameters; undecided), +0.02 at "
        "s2 (100k parameters; undecided), +0.03 at s3 (1M parameters; undecided); the gap changes by "
        f"+0.01 per tenfold parameters (95 % CI [{lo:+.3g}, {hi:+.3g}], least squares over 6 seeds' "
        "gaps): linformer loses ground to full as parameters grow."
    )
    # per rung and arm: parameters, FLOPs, tokens per parameter, the mean, the gap with its paired 95 % CI, verdict
    gap = stats.compare({0: 3.012, 1: 3.058}, {0: 3.0, 1: 3.05}).ci()
    assert (
        f"| s1 | linformer | 10k | 6G | 100 | 3.03 ± 0.0325 (2) | +0.01 [{gap[0]:+.3g}, {gap[1]:+.3g}] | "
        "undecided: 1 more seeds per arm would show 'better' |"
    ) in summary
    assert "| s3 | full | 1M | 60T | 1 | 2.82 ± 0.0354 (2) | - | - |" in summary
    # FLOPs grow 100× a rung, parameters 10×: half the slope per tenfold compute
    assert "- linformer: +0.005 per tenfold training FLOPs (95 % CI" in summary
    # only pairs at the same rung are compared: 3 tests in Holm's family, no s1 against s3
    assert "Holm's correction over the 3 'better' tests" in summary
    assert "| s1 full | s3 " not in summary and "| s1 full | s1 linformer |" in summary
    assert (out / "gap_vs_size.png").stat().st_size > 10_000
    assert "- skipped: rank_vs_size.png (no reference run with a checkpoint here)" in summary
    assert "- skipped: time_to_target_vs_size.png (no run's ppl_vs_wallclock curve here)" in summary


@pytest.mark.processes  # the sweep command's workers
def test_a_tiny_ladder_swept_and_reported_end_to_end_writes_the_gap_rank_and_time_figures(tmp_path, tiny):
    """Three tiny rungs × {full, linformer} × 2 seeds, 6 steps each, two workers; then the report (its time to
    target refused: 6 steps never leave the plateau a model without context reaches)."""
    path = ladder_study(tmp_path, tiny, name="tiny_ladder")
    assert cli.main(["sweep", str(path), "--workers", "2"]) == 0
    study = load_study(path)
    trials = optuna.load_study(study_name=study.name, storage=stored.open_storage(study, None)).get_trials()
    flops = {t.params["rung"]: t.user_attrs["metrics"]["train_flops"] for t in trials if t.params["arm"] == "full"}
    assert flops["s1"] < flops["s2"] < flops["s3"]
    assert cli.main(["report", str(path)]) == 0
    out = tmp_path / "runs" / "tiny_ladder" / "report"
    summary = (out / "summary.md").read_text()
    assert summary.splitlines()[2].startswith("**Answer:** linformer − full on val/loss: ")
    assert "## Scale: linformer against full across model sizes" in summary
    for rung in RUNGS:
        assert f"| {rung} | linformer |" in summary  # gap and verdict per rung
    # the spectrum of full attention at every rung: 1, 2 and 2 layers at n = 32
    table = summary.split("### Spectrum across sizes")[1].split("\n\n")[2].splitlines()[2:]
    cells = [row.strip("| ").split(" | ") for row in table]
    assert [(c[0], c[2], len(c[3].split(", "))) for c in cells] == [("s1", "32", 1), ("s2", "32", 2), ("s3", "32", 2)]
    # 6 steps leave every rung above the unigram's perplexity: no time to a target a model without context reaches
    assert "### Time to target" in summary
    for rung in RUNGS:
        assert (
            f"| {rung} | " in summary
            and "| every arm | - | not timed: a model without context reaches val ppl" in summary
        )
    assert (
        "- skipped: time_to_target_vs_size.png (no rung's target is above what a model without context reaches)"
        in summary
    )
    for png in ("gap_vs_size.png", "rank_vs_size.png"):
        assert (out / png).stat().st_size > 10_000, png


# --------------------------------------------------------------------------------------- the GPU presets
SCALE = REPO / "sweeps" / "scale.yaml"


@pytest.fixture(scope="module")
def gpu_presets():
    """The GPU presets of sweeps/scale.yaml, loaded (and every grid point's config checked) once."""
    return {preset: load_study(SCALE, preset) for preset in ("gpu", "gpu_large")}


@pytest.mark.parametrize("preset", ["gpu", "gpu_large"])
def test_every_rung_of_the_gpu_presets_passes_the_train_check(gpu_presets, preset):
    """What `linformer-lab train <config> --check` does (Trainer arguments, the model on the meta device) for
    every rung and arm, and the ladder's promises: ~3× the parameters a rung, ~5.5 tokens per parameter,
    RoBERTa-base (and, behind gpu_large, RoBERTa-large) shapes at n = 512."""
    from training.train import preflight

    study = gpu_presets[preset]
    configs = {(p["rung"], p["arm"]): study.config(p) for p in study.points if p["seed"] == 0}
    sizes = {}
    for (rung, arm), cfg in configs.items():
        n = preflight(cfg)
        if arm == "full":
            sizes[rung] = n
            tokens = cfg.trainer.max_steps * cfg.data.batch_size * cfg.model.max_len
            assert 5.0 < tokens / n < 6.0, rung
    for p in study.control.points:
        preflight(study.control.config(p))
    ratios = [b / a for a, b in zip(list(sizes.values()), list(sizes.values())[1:])]
    assert all(2.5 < r < 4.0 for r in ratios), ratios
    base = configs[("12x768", "k_scaled")].model
    assert (base.n_layers, base.d_model, base.n_heads, base.max_len, base.attention.options.k) == (
        12,
        768,
        12,
        512,
        256,
    )
    assert configs[("12x768", "k_fixed")].model.attention.options.k == 128
    assert configs[("12x768", "full")].model.attention.kind == "full"
    assert ("24x1024", "full") in configs if preset == "gpu_large" else study.rungs[-1] == "12x768"
    if preset == "gpu_large":
        large = configs[("24x1024", "k_scaled")].model
        assert (large.n_layers, large.d_model, large.n_heads, large.max_len) == (24, 1024, 16, 512)


@pytest.mark.parametrize("arm", ["full", "k_fixed", "k_scaled"])
def test_the_largest_rung_trains_one_step_at_a_sixteenth_of_its_width(gpu_presets, arm):
    """The RoBERTa-large rung's depth, heads, n and k with d_model and d_ff divided by 16 (64 and 256, head
    dimension 4): one AdamW step of masked LM on CPU, which every shape rule of the full-size model passes."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(
        gpu_presets["gpu_large"].config({"seed": 0, "rung": "24x1024", "arm": arm}), resolve=True
    )
    cfg["model"].update(d_model=cfg["model"]["d_model"] // 16, d_ff=cfg["model"]["d_ff"] // 16)
    module = MaskedLMModule(cfg, vocab_size=cfg["data"]["tokenizer"]["vocab_size"]).train()
    optimizer = module.configure_optimizers()["optimizer"]
    n = cfg["model"]["max_len"]
    input_ids = torch.randint(5, 1000, (2, n), generator=torch.Generator().manual_seed(0))
    labels = torch.where(torch.rand(2, n, generator=torch.Generator().manual_seed(1)) < 0.15, input_ids, -100)
    before = module.encoder.blocks[-1].attn.q_proj.weight.detach().clone()
    loss = module.training_loss({"input_ids": input_ids, "labels": labels})
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and len(module.encoder.blocks) == 24 and module.encoder.blocks[0].attn.n_heads == 16
    assert not torch.equal(before, module.encoder.blocks[-1].attn.q_proj.weight)


def test_the_time_figure_draws_each_timed_rung_and_leaves_out_the_refused_ones():
    from sweeps.report import scale

    sizes = {"s1": 1e4, "s2": 3e4, "s3": 9e4}
    ladder = types.SimpleNamespace(
        lines=["linformer"], rungs=list(sizes), reference="full", size=lambda rung, axis="parameters": sizes[rung]
    )
    seconds = {("s1", "full"): {(0,): 10.0, (1,): 12.0}, ("s1", "linformer"): {(0,): 5.0, (1,): 6.0}}
    seconds |= {("s2", "full"): {(0,): 20.0, (1,): 22.0}, ("s2", "linformer"): {(0,): 30.0, (1,): 33.0}}
    ttt = scale.TimeToTarget({"s1": 40.0, "s2": 30.0, "s3": 90.0}, seconds, {}, refused={"s3": 60.0})
    assert ttt.ratio("s1", "linformer", "full").value == pytest.approx(0.5)  # exp(mean(ln 5/10, ln 6/12))
    assert ttt.ratio("s3", "linformer", "full") is None
    fig = scale.figure_time(ladder, ttt)
    (line,) = [c for c in fig.axes[0].containers]  # one errorbar series: the linformer arm
    assert list(line.lines[0].get_xdata()) == [1e4, 3e4]
    assert scale.figure_time(types.SimpleNamespace(**{**vars(ladder), "lines": []}), ttt) is None


def test_a_rung_whose_target_the_trained_model_without_context_reaches_is_not_timed(tmp_path, tiny_overrides):
    """Stored trials with curves: at every rung full ends at val ppl 12 and Linformer at 20, the unigram at 30.
    A model without context trained beside them (the control's degraded arm) at ppl 25 leaves the targets (20)
    timed; one at 18, which copies kept targets as the unigram cannot, reaches them: no rung is timed."""
    from sweeps.report import efficiency, scale
    from sweeps.report.command import Report
    from sweeps.run.command import open_study
    from sweeps.run.storage import RunStorage

    study = load_study(ladder_study(tmp_path, tiny_overrides, name="timed_ladder"))
    ostudy = open_study(RunStorage(study, None))
    for rung in RUNGS:
        for seed in (0, 1):
            for arm, ppl in (("full", 12.0), ("linformer", 20.0)):
                run_dir = tmp_path / "runs_here" / f"{rung}_{arm}_{seed}"
                run_dir.mkdir(parents=True)
                curve = [[5.0 * (seed + 1), 100, 40.0], [10.0 * (seed + 1), 200, ppl]]
                metrics = {"ppl_vs_wallclock": curve, "baselines": {"unigram/loss": math.log(30.0)}}
                (run_dir / "metrics.json").write_text(json.dumps(metrics))
                _add_trial(ostudy, seed, rung, arm, math.log(ppl), {"parameters": 1e4}, run_dir=str(run_dir))
    ladder = Report(study, None).ladder

    def blind(final: float) -> list:
        return [efficiency.ArmSpeed("no_context", [0.0], [1.0], [[[10.0, 200, final]]])]

    timed = scale.time_to_target(ladder, blind(25.0))
    assert timed.refused == {} and timed.targets == {rung: 20.0 for rung in RUNGS}
    # full passes ppl 20 (interpolated) 5/7 of the way from 40 to 12, Linformer only at its last point
    assert timed.ratio(next(iter(RUNGS)), "linformer", "full").value == pytest.approx(1 / (0.5 + 0.5 * 20 / 28))
    refused = scale.time_to_target(ladder, blind(18.0))
    assert refused.refused == {rung: 18.0 for rung in RUNGS} and refused.seconds == {}
    assert scale.time_to_target(ladder).refused == {}  # the unigram alone (30) does not reach 20
