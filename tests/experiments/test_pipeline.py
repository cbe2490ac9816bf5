"""``linformer-lab pipeline`` (experiments/pipeline.py), the paper's Table 2 end to end: it pretrains, fine-tunes from
the encoder and writes the table; the shipped pipeline checks every stage and names a bad variant."""

import csv
import json
import math

import pytest
import torch
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments import cli, pipeline
from foundation.configfile import to_container
from lightning_modules.classifier import SequenceClassifierModule
from training import config as run_config
from training.train import build_datamodule, build_module


def assert_fine_tuned_from_the_pretrained_encoder(root) -> None:
    """The fine-tuned encoder starts as the pretrained one: same tokenizer, weights equal after loading."""
    pre_dir, ft_dir = root / "pretrain" / "linformer", root / "finetune" / "linformer" / "rotten_tomatoes"
    assert (ft_dir / "tokenizer.json").read_text() == (pre_dir / "tokenizer.json").read_text()
    assert (ft_dir / "checkpoints" / "best.ckpt").is_file()
    cfg = run_config.load(ft_dir / "config.yaml", ["run_dir=null"])
    assert cfg.init_from == str(pre_dir)
    dm = build_datamodule(cfg)
    dm.setup("fit")
    loaded_module = build_module(cfg, dm)
    pretrained = torch.load(pre_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    encoder = {k.removeprefix("encoder."): v for k, v in pretrained.items() if k.startswith("encoder.")}
    assert encoder.keys() == loaded_module.encoder.state_dict().keys()
    assert all(torch.equal(v, encoder[k]) for k, v in loaded_module.encoder.state_dict().items())
    fresh = SequenceClassifierModule(to_container(OmegaConf.merge(cfg, {"init_from": None})), dm.vocab_size, 2)
    assert not torch.equal(fresh.encoder.tok.weight, encoder["tok.weight"])
    assert math.isfinite(json.loads((ft_dir / "metrics.json").read_text())["best_val/accuracy"])
    ft_events = EventAccumulator(str(ft_dir), size_guidance={"scalars": 0})
    ft_events.Reload()
    assert {"val/accuracy", "val/f1", "hp/val_accuracy", "test/accuracy", "test/f1"} <= set(ft_events.Tags()["scalars"])


# ------------------------------------------------------------------------------- pipeline
def test_pipeline_pretrains_fine_tunes_from_the_encoder_and_writes_the_table(tiny_overrides, tmp_path, capsys):
    shrink = [
        a
        for a in tiny_overrides.args
        if a.split("=")[0]
        in (
            "data.batch_size",
            "data.cache_dir",
            "trainer.max_steps",
            "trainer.val_check_interval",
            "trainer.limit_val_batches",
            "trainer.log_every_n_steps",
            "trainer.accelerator",
            "optim.warmup_steps",
        )
    ]
    pipeline = {
        "experiment": "t2",
        "output_dir": str(tmp_path / "runs"),
        "pretrain": {"config": str(tiny_overrides.config), "overrides": tiny_overrides.args},
        "variants": {"full": ["model.attention.kind=full"], "linformer": []},
        "tasks": {
            task: {
                "config": str(tiny_overrides.config.parent / f"finetune_{task}.yaml"),
                "overrides": [*shrink, "data.max_texts=200", "data.batch_size=64"],
            }
            for task in ("imdb", "rotten_tomatoes")
        },
    }
    (tmp_path / "p.yaml").write_text(OmegaConf.to_yaml(pipeline))
    assert cli.main(["pipeline", str(tmp_path / "p.yaml")]) == 0
    root = tmp_path / "runs" / "t2" / "version_0"

    with open(root / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["variant"] for r in table] == ["full", "linformer"]
    for r in table:
        accuracies = []
        for task in ("imdb", "rotten_tomatoes"):
            metrics = json.loads((root / "finetune" / r["variant"] / task / "metrics.json").read_text())
            assert float(r[task]) == pytest.approx(metrics["test/accuracy"]) and 0 <= metrics["test/accuracy"] <= 1
            accuracies.append(metrics["test/accuracy"])
        assert float(r["average"]) == pytest.approx(sum(accuracies) / 2)
        pre = json.loads((root / "pretrain" / r["variant"] / "metrics.json").read_text())
        assert float(r["pretrain_val_ppl"]) == pytest.approx(pre["val/ppl"])
    markdown = (root / "results.md").read_text()
    assert "| variant | pretrain val ppl | imdb (acc) | rotten_tomatoes (acc) | average |" in markdown
    linformer = table[1]
    assert (
        f"| linformer | {float(linformer['pretrain_val_ppl']):.2f} | {100 * float(linformer['imdb']):.1f} |" in markdown
    )
    events = EventAccumulator(str(root), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert {"table2/imdb/full", "table2/average/linformer"} <= set(events.Tags()["scalars"])
    assert "table2/text_summary" in events.Tags()["tensors"]

    assert_fine_tuned_from_the_pretrained_encoder(root)
    assert_the_check_knows_what_each_stage_writes(root)
    assert_resume_keeps_finished_stages_and_refuses_changed_ones(tmp_path, pipeline, root, capsys)


def assert_resume_keeps_finished_stages_and_refuses_changed_ones(tmp_path, pipeline, root, capsys) -> None:
    """resume=true keeps every finished stage (nothing trains again); a stage whose config changed since its run
    finished is one line before anything is written (its table would mix two configs)."""
    table = (root / "results.csv").read_text()
    assert cli.main(["pipeline", str(tmp_path / "p.yaml"), "resume=true"]) == 0
    assert (root / "results.csv").read_text() == table
    pipeline["tasks"]["imdb"]["overrides"].append("optim.lr=0.5")
    (tmp_path / "p2.yaml").write_text(OmegaConf.to_yaml(pipeline))
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    capsys.readouterr()
    assert cli.main(["pipeline", str(tmp_path / "p2.yaml"), "resume=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: tasks.imdb (variant full): the finished run resume=true would keep: ") and (
        "differs at optim.lr (" in err
    ), err
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def assert_the_check_knows_what_each_stage_writes(root) -> None:
    """What the pipeline's check before training takes a stage's task to write is what its run wrote."""
    for run_dir in (root / "pretrain" / "full", root / "finetune" / "full" / "imdb"):
        written = json.loads((run_dir / "metrics.json").read_text())
        expected = pipeline.written_scores(OmegaConf.load(run_dir / "config.yaml"))
        assert expected <= set(written) and set(pipeline.RUN_NUMBERS) <= set(written), expected - set(written)


def test_the_shipped_table2_pipeline_checks_every_stage_and_names_a_bad_variant(tmp_path, capsys):
    shipped = run_config.CONFIG_DIR.parent / "pipelines" / "table2.yaml"
    cfg = pipeline.load(shipped)
    stages = pipeline.stages(cfg, shipped.parent, tmp_path / "root")
    assert [(s.variant, s.task) for s in stages[:3]] == [("full", ""), ("full", "imdb"), ("full", "rotten_tomatoes")]
    assert len(stages) == len(cfg.variants) * (1 + len(cfg.tasks))
    for s in stages[1:3]:
        assert s.cfg.task == "classify" and s.cfg.init_from == str(tmp_path / "root" / "pretrain" / "full")
        assert s.cfg.model == stages[0].cfg.model
    bad = OmegaConf.to_container(OmegaConf.load(shipped))
    bad["output_dir"] = str(tmp_path / "runs")
    bad["variants"]["k64"] = ["model.attention.options.k=640"]
    (tmp_path / "bad.yaml").write_text(OmegaConf.to_yaml(bad).replace("../configs/", f"{run_config.CONFIG_DIR}/"))
    assert cli.main(["pipeline", str(tmp_path / "bad.yaml")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: variants.k64: model.attention.options.k: k=640 (layer 0) must be in [1, model.max_len=128]"
    )
    assert not (tmp_path / "runs").exists()


PRETRAIN_CLASSIFY = "pretrain: {{config: {c}/finetune_imdb.yaml}}\nvariants: {{a: []}}\ntasks: {{t: {{config: {c}/finetune_imdb.yaml}}}}\n"


@pytest.mark.parametrize(
    "text, words",
    [
        pytest.param(
            PRETRAIN_CLASSIFY,
            "variants.a: the results table reads 'val/ppl' from its pretraining run, which task 'classify' does not "
            "write (it writes test/accuracy, test/f1, test/loss, val/accuracy, val/f1, val/loss); pretrain.config",
            id="a classification config as pretraining",
        ),
        pytest.param(
            "pretrain: {{config: {c}/base.yaml}}\nvariants: {{a: []}}\nscratch: [a]\ntasks: {{t: {{config: {c}/base.yaml}}}}\n",
            "tasks.t: the results table reads 'test/accuracy' from its fine-tuning runs, which task 'mlm' does not",
            id="a language model as a task",
        ),
        pytest.param(
            PRETRAIN_CLASSIFY.replace("finetune_imdb.yaml}}\nvariants", "base.yaml}}\nvariants") + "metric: val/ppl\n",
            "tasks.t: metric: 'val/ppl' reads 'val/ppl' from its fine-tuning runs, which task 'classify' does not",
            id="a metric the tasks do not write",
        ),
    ],
)
def test_a_stage_whose_results_its_task_never_writes_is_refused_before_anything_trains(tmp_path, capsys, text, words):
    """The table reads val/ppl from each pretraining run and the official metrics (or ``metric``) from each
    fine-tuning: a stage whose task writes no such number is one line before the first step (it used to train both
    stages and end in KeyError 'val/ppl')."""
    path = tmp_path / "p.yaml"
    path.write_text(text.format(c=run_config.CONFIG_DIR) + f"output_dir: {tmp_path / 'runs'}\n")
    assert cli.main(["pipeline", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {words}") and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]
