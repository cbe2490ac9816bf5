"""Quality against speed in a study's report: the Pareto front and the time to a target quality."""

import json
import types

import pytest

from sweeps.report import efficiency, figures


def row(arm, quality, speed, run_dir=None):
    trial = types.SimpleNamespace(
        user_attrs={"metrics": {"val/loss": quality, "tokens_per_sec": speed}, "run_dir": run_dir}
    )
    return types.SimpleNamespace(arm=arm, trial=trial, metrics=trial.user_attrs["metrics"])


def test_pareto_front_keeps_exactly_the_non_dominated_arms():
    points = [(100, 2.0), (200, 2.5), (50, 1.9), (150, 2.6), (200, 2.5)]  # (speed, loss)
    # (150, 2.6) is slower and worse than (200, 2.5); the two equal points do not dominate each other
    assert efficiency.pareto_front(points, maximize_quality=False) == [0, 1, 2, 4]
    assert efficiency.pareto_front([(1, 0.9), (2, 0.8), (3, 0.95)], maximize_quality=True) == [2]


def test_time_to_target_is_the_worst_arms_final_quality_and_interpolates(tmp_path):
    def run(name, curve):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps({"ppl_vs_wallclock": curve}))
        return str(tmp_path / name)

    rows = [
        row("fast", 2.3, 1000.0, run("f0", [[10, 1e4, 30.0], [20, 2e4, 12.0]])),
        row("fast", 2.4, 1200.0, run("f1", [[10, 1e4, 25.0], [20, 2e4, 14.0]])),
        row("slow", 2.0, 300.0, run("s0", [[30, 1e4, 20.0], [60, 2e4, 8.0]])),
    ]
    arms = efficiency.arm_speeds(rows, "val/loss")
    assert [a.arm for a in arms] == ["fast", "slow"]
    target = efficiency.target_ppl(arms)
    assert target == pytest.approx(13.0)  # median of the fast arm's finals 12, 14
    seconds, reached = efficiency.time_to(arms[0], target)
    # f0 crosses 13 at 10 + 10·(30−13)/(30−12) = 19.44 s; f1 never gets to 13
    assert reached == 1 and seconds == pytest.approx(10 + 10 * 17 / 18)
    seconds, reached = efficiency.time_to(arms[1], target)
    assert reached == 1 and seconds == pytest.approx(30 + 30 * 7 / 12)
    text = "\n".join(efficiency.section(arms, "val/loss", maximize=False))
    assert "| fast | 2 | 2.35 ± 0.071 | 1,100 | yes | 19.4 s (1/2) |" in text
    assert "| slow | 1 | 2 ± nan | 300 | yes | 47.5 s (1/1) |" in text
    assert (
        efficiency.pareto(arms, "val/loss", False, tmp_path / "pareto.png") and (tmp_path / "pareto.png").stat().st_size
    )


def test_a_resumed_runs_curve_is_in_step_order_with_the_values_written_last(tmp_path):
    """Two events files whose names sort against the order they were written in, as a resume can leave them
    (counter 10 before 9): the curve comes out by step, the re-trained step with its later value."""
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    run.mkdir()
    for name, points in (("9", [(0, 3.0), (1, 2.0), (2, 1.9)]), ("10", [(2, 1.5), (3, 1.25)])):  # 9 first
        writer = SummaryWriter(str(tmp_path / name))
        for step, value in points:
            writer.add_scalar("val/loss", value, step)
        writer.close()
        (written,) = (tmp_path / name).glob("events.out.tfevents.*")
        written.rename(run / f"events.out.tfevents.1700000000.host.1.{name}")
    assert sorted(p.name for p in run.iterdir())[0].endswith(".10")  # read first
    assert figures.step_curves([row("a", 1.2, 1.0, str(run))]) == {"a": [([0, 1, 2, 3], [3.0, 2.0, 1.5, 1.25])]}


def test_a_runs_events_are_read_once_until_it_writes_more(tmp_path, monkeypatch):
    """A ×F report draws the curves and then judges each arm's end from them: one read of a run's events serves both,
    and a run that logged more since (a resume's new events file) is read again."""
    from tensorboard.backend.event_processing import event_accumulator
    from torch.utils.tensorboard import SummaryWriter

    reads = []
    real = event_accumulator.EventAccumulator

    def counted(path, **kwargs):
        reads.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(event_accumulator, "EventAccumulator", counted)
    run = tmp_path / "run"
    with SummaryWriter(str(run)) as writer:
        writer.add_scalar("val/loss", 3.0, 0)
    rows = [row("a", 3.0, 1.0, str(run))]
    assert figures.step_curves(rows) == figures.step_curves(rows) == {"a": [([0], [3.0])]}
    assert len(reads) == 1
    with SummaryWriter(str(run), filename_suffix=".resumed") as writer:
        writer.add_scalar("val/loss", 2.5, 1)
    assert figures.step_curves(rows) == {"a": [([0, 1], [3.0, 2.5])]} and len(reads) == 2


def test_a_study_without_curves_has_no_time_to_target_column():
    arms = efficiency.arm_speeds([row("a", 0.9, 10.0), row("b", 0.8, 20.0)], "val/loss")
    assert efficiency.target_ppl(arms) is None
    assert "seconds to" not in "\n".join(efficiency.section(arms, "val/loss", maximize=False))


def test_long_sequence_costs_of_the_arms_named_after_a_kind(tmp_path):
    costs = {
        "command": "linformer-lab bench --levels layer --mode fwdbwd",
        "machine": "test CPU",
        "date": "2026-12-01",
        "kinds": [
            {
                "kind": "full",
                "variant": "sdpa",
                "k": None,
                "by_n": {"1024": {"time_vs_full": 1.0, "memory_vs_full": 1.0}},
            },
            {
                "kind": "local",
                "variant": "local",
                "k": 128,
                "by_n": {
                    "1024": {"time_vs_full": 1.5, "memory_vs_full": 2.0},
                    "16384": {"time_vs_full": 12.0, "memory_vs_full": 9.0},
                },
            },
            {"kind": "lsh", "variant": "lsh", "k": 128, "by_n": {"1024": {"time_vs_full": 0.5, "memory_vs_full": 0.4}}},
        ],
    }
    path = tmp_path / "kind_costs.json"
    path.write_text(json.dumps(costs))
    lines = efficiency.long_sequence_section(["full", "local", "linformer"], path)
    table = [line for line in lines if line.startswith("| ")]
    assert table[0] == "| kind | time n=1,024 | time n=16,384 | memory n=1,024 | memory n=16,384 |"
    assert table[1:] == ["| full | 1× | — | 1× | — |", "| local (local, k=128) | 1.5× | 12× | 2× | 9× |"]
    assert "    linformer-lab bench --levels layer --mode fwdbwd" in lines  # the command that measured it
    assert efficiency.long_sequence_section(["full", "performer"], path) == []  # one kind alone compares nothing
    assert efficiency.long_sequence_section(["full", "local"], tmp_path / "missing.json") == []


def test_the_shipped_long_sequence_costs_cover_full_attention_and_every_kind_of_the_head_to_head():
    costs = efficiency.kind_costs()
    assert costs is not None and costs["command"].startswith("linformer-lab bench")
    kinds = {c["kind"] for c in costs["kinds"]}
    assert {"full", "linformer", "local", "sparse", "lsh", "performer", "nystrom"} <= kinds


def test_a_target_a_model_without_context_reaches_gets_no_time(tmp_path):
    def run(name, curve, unigram_loss):
        (tmp_path / name).mkdir()
        metrics = {"ppl_vs_wallclock": curve, "baselines": {"unigram/loss": unigram_loss}}
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
        return str(tmp_path / name)

    # the arms end at val ppl 22.4 and 22.1, above the unigram's exp(3.085) = 21.87: the plateau itself
    rows = [
        row("full", 3.11, 1000.0, run("a", [[10, 1e4, 30.0], [20, 2e4, 22.4]], 3.085)),
        row("linformer", 3.10, 1200.0, run("b", [[10, 1e4, 25.0], [20, 2e4, 22.1]], 3.085)),
    ]
    arms = efficiency.arm_speeds(rows, "val/loss")
    floor, source = efficiency.trivial_target(arms, efficiency.target_ppl(arms))
    assert floor == pytest.approx(21.867, abs=1e-3) and source == "the unigram baseline"
    text = "\n".join(efficiency.section(arms, "val/loss", maximize=False))
    assert "seconds to val ppl" not in text
    assert "No time to target: 0 arms ended below the perplexity of a model without context" in text
    # a target below the plateau is kept
    assert efficiency.trivial_target(arms, 12.0) is None
    # ... unless a model without context trained beside the arms reaches it: on masked-LM data it copies the
    # targets BERT keeps unchanged and ends below the unigram (here at 11.5, median of its seeds)
    blind = efficiency.arm_speeds(
        [
            row("no_context", 2.9, 1500.0, run(f"n{i}", [[10, 1e4, 20.0], [20, 2e4, ppl]], 3.085))
            for i, ppl in enumerate([11.0, 11.5, 13.0])
        ],
        "val/loss",
    )
    assert efficiency.trivial_target(arms, 12.0, blind) == (11.5, "the model without context trained beside them")
    assert efficiency.trivial_target(arms, 11.0, blind) is None
    assert efficiency.learned(arms, blind) == []


def test_time_to_target_is_measured_among_the_arms_that_learned(tmp_path):
    """Two arms leave the no-context level (exp(3.085) = 21.87) and one stays on it: the target is the worse
    learner's final perplexity, the plateau arm gets no time instead of every arm losing its time."""

    def run(name, curve):
        (tmp_path / name).mkdir()
        metrics = {"ppl_vs_wallclock": curve, "baselines": {"unigram/loss": 3.085}}
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
        return str(tmp_path / name)

    rows = [
        row("full", 2.4, 1000.0, run("a", [[10, 1e4, 20.0], [20, 2e4, 11.0]])),
        row("nystrom", 2.7, 1100.0, run("b", [[10, 1e4, 21.0], [20, 2e4, 15.0]])),
        row("linformer", 3.08, 1300.0, run("c", [[10, 1e4, 23.0], [20, 2e4, 22.0]])),
    ]
    arms = efficiency.arm_speeds(rows, "val/loss")
    assert [a.arm for a in efficiency.learned(arms)] == ["full", "nystrom"]
    text = "\n".join(efficiency.section(arms, "val/loss", maximize=False))
    assert "seconds to val ppl ≤ 15 (median, reached)" in text
    assert "among the 2 arms that learned to use their context" in text
    # full crosses 15 at 10 + 10·(20 − 15)/(20 − 11) = 15.6 s; nystrom at its last validation, 20 s
    assert "| full | 1 | 2.4 ± nan | 1,000 | yes | 15.6 s (1/1) |" in text
    assert "| nystrom | 1 | 2.7 ± nan | 1,100 | yes | 20.0 s (1/1) |" in text
    assert "| linformer | 1 | 3.08 ± nan | 1,300 | yes | — (ends at the no-context level) |" in text


def test_learning_curves_plot_the_studys_objective_with_the_no_context_level_of_its_runs(tmp_path, monkeypatch):
    """The figure reads the objective's tag (val/masked_loss, not val/loss) and draws the unigram level on the same
    targets from each run's metrics.json, as summary.md does."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.trial import TrialState
    from torch.utils.tensorboard import SummaryWriter

    rows = []
    for i, level in enumerate((3.0, 3.2)):
        run = tmp_path / f"trial_{i}"
        writer = SummaryWriter(str(run))
        for step, (masked, overall) in enumerate([(3.125, 2.875), (2.625, 2.375)]):  # exact in float32
            writer.add_scalar("val/masked_loss", masked, step)
            writer.add_scalar("val/loss", overall, step)
        writer.close()
        (run / "metrics.json").write_text(json.dumps({"baselines": {"unigram/masked_loss": level}}))
        r = row("full", 2.6, 1.0, str(run))
        r.trial.state, r.complete = TrialState.COMPLETE, True
        rows.append(r)
    assert figures.step_curves(rows, "val/masked_loss") == {"full": [([0, 1], [3.125, 2.625])] * 2}
    assert figures._no_context_level(rows, "val/masked_loss") == (pytest.approx(3.1), "unigram")
    drawn = []
    monkeypatch.setattr(figures, "write_figure", lambda path, fig, dpi: drawn.append(fig.axes[0]))
    monkeypatch.setattr(plt, "close", lambda fig: None)
    assert figures.plot_learning_curves(rows, tmp_path / "curves.png", "val/masked_loss")
    (ax,) = drawn
    assert ax.get_ylabel() == "val/masked_loss"
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and list(dashed[0].get_ydata()) == pytest.approx([3.1, 3.1])
    assert dashed[0].get_label() == "no context (unigram, same targets)"
    assert [list(line.get_ydata()) for line in ax.get_lines() if line.get_linestyle() != "--"] == [[3.125, 2.625]] * 2


def test_recalls_no_context_level_is_labelled_chance_not_unigram(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.trial import TrialState
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "trial_0"
    with SummaryWriter(str(run)) as writer:
        for step, value in ((1, 0.25), (2, 0.5)):
            writer.add_scalar("val_sample/accuracy", value, step)
    (run / "metrics.json").write_text(json.dumps({"baselines": {"unigram/accuracy": 0.0625}}))  # as recall's runs
    r = row("learned", 0.5, 1.0, str(run))
    r.trial.state, r.complete = TrialState.COMPLETE, True
    drawn = []
    monkeypatch.setattr(figures, "write_figure", lambda path, fig, dpi: drawn.append(fig.axes[0]))
    monkeypatch.setattr(plt, "close", lambda fig: None)
    assert figures.plot_learning_curves([r], tmp_path / "curves.png", "val/accuracy", "recall")
    (dashed,) = [line for line in drawn[0].get_lines() if line.get_linestyle() == "--"]
    assert dashed.get_label().startswith("chance") and list(dashed.get_ydata()) == pytest.approx([0.0625] * 2)


def test_the_learning_curves_read_a_runs_sample_curve_where_it_logged_one(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    rows = []
    for i, sampled in enumerate((True, False)):
        run = tmp_path / f"trial_{i}"
        writer = SummaryWriter(str(run))
        for step, value in ((4, 3.0), (9, 2.5)):  # the full validations
            writer.add_scalar("val/masked_loss", value, step)
        if sampled:  # the fixed sample, every fifth of training
            for step, value in ((1, 3.5), (3, 3.25), (5, 3.0), (7, 2.75), (9, 2.5)):
                writer.add_scalar("val_sample/masked_loss", value, step)
        writer.close()
        rows.append(row("full" if sampled else "old", 2.5, 1.0, str(run)))
    assert figures.step_curves(rows, "val/masked_loss") == {
        "full": [([1, 3, 5, 7, 9], [3.5, 3.25, 3.0, 2.75, 2.5])],
        "old": [([4, 9], [3.0, 2.5])],
    }
