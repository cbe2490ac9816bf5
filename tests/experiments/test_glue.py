"""GLUE as Table 2 uses it: every task's shipped config and official metric (checked against hand arithmetic),
local copies in the hub's layout and in GLUE's original TSV layout, MNLI's two validation sets, STS-B's
regression, unlabelled test splits never scored, the offline refusal, and the pipeline's table."""

import csv
import json
import math

import pytest
import torch
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny import TINY_MODEL, run_of

from datamodules.classification import eval_set_names, label_array, labelled_splits, load_labelled
from experiments import cli, pipeline
from experiments.glue import GLUE_TASKS, task_config
from experiments.glue_standin import STAND_IN_LINE, write_standin
from foundation.configfile import to_container
from foundation.errors import ConfigError
from lightning_modules.classifier import FROM_SCRATCH, SequenceClassifierModule
from training import config as run_config

GLUE = run_config.CONFIG_DIR / "glue"
SHRINK = [
    *TINY_MODEL,
    "data.batch_size=8",
    "data.tokenizer.vocab_size=300",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "trainer.accelerator=cpu",
    "optim.warmup_steps=1",
    "data.val_fraction=0.25",
]


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """A hub-layout copy of every task (written by glue-standin): 40 training examples each."""
    folder = tmp_path_factory.mktemp("glue")
    write_standin(folder, list(GLUE_TASKS), examples=40)
    return folder


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def cfg_of(task, tmp_path, *overrides):
    return run_config.load(GLUE / f"{task}.yaml", [*SHRINK, f"data.cache_dir={tmp_path / 'cache'}", *overrides])


# ------------------------------------------------------------------------------- configs and metrics
OFFICIAL = {
    "cola": ["test/matthews"],
    "sst2": ["test/accuracy"],
    "mrpc": ["test/f1", "test/accuracy"],
    "qqp": ["test/f1", "test/accuracy"],
    "stsb": ["test/pearson", "test/spearman"],
    "mnli": ["test/matched/accuracy", "test/mismatched/accuracy"],
    "qnli": ["test/accuracy"],
    "rte": ["test/accuracy"],
    "wnli": ["test/accuracy"],
}
COLUMNS = {
    "cola": ("sentence", None),
    "sst2": ("sentence", None),
    "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "stsb": ("sentence1", "sentence2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}


def test_every_glue_task_ships_with_the_hubs_columns_and_its_official_metrics():
    assert sorted(p.stem for p in GLUE.glob("*.yaml")) == sorted(GLUE_TASKS)
    for task in GLUE_TASKS:
        cfg = task_config(task)
        assert (cfg.data.source, cfg.data.subset, cfg.task) == ("nyu-mll/glue", task, "classify")
        assert (cfg.data.text_column, cfg.data.text_pair_column) == COLUMNS[task]
        assert pipeline.official_keys(cfg) == OFFICIAL[task], task
        assert cfg.data.classify.regression == (task == "stsb")


def hand_binary(preds, labels):
    """Accuracy, F1 of class 1 and Matthews correlation from the confusion counts."""
    tp = sum(p == 1 and y == 1 for p, y in zip(preds, labels))
    tn = sum(p == 0 and y == 0 for p, y in zip(preds, labels))
    fp = sum(p == 1 and y == 0 for p, y in zip(preds, labels))
    fn = sum(p == 0 and y == 1 for p, y in zip(preds, labels))
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return {"accuracy": (tp + tn) / len(labels), "f1": 2 * tp / (2 * tp + fp + fn), "matthews": mcc}


def pearson(x, y):
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def ranks(x):
    order = sorted(range(len(x)), key=lambda i: x[i])
    out = [0.0] * len(x)
    for r, i in enumerate(order):
        out[i] = float(r + 1)
    return out


def scored(task, tmp_path, outputs, labels):
    """The metrics the task's module computes (its val/ collection) for given model outputs and labels."""
    cfg = cfg_of(task, tmp_path)
    num_labels = 1 if cfg.data.classify.regression else cfg.data.classify.num_labels
    module = SequenceClassifierModule(to_container(cfg), 300, num_labels, eval_set_names(cfg.data))
    module.forward = lambda ids, mask: outputs  # the model's outputs, fixed
    batch = {"input_ids": torch.zeros(len(labels), 3, dtype=torch.long), "attention_mask": None, "labels": labels}
    module._evaluate(batch, module.val_loss, module.val_scores)
    return {k.removeprefix("val/"): float(v) for k, v in module.val_scores.compute().items()}, module


@pytest.mark.parametrize("task", ["cola", "sst2", "mrpc", "qqp", "qnli", "rte", "wnli"])
def test_each_binary_tasks_metrics_equal_the_hand_computation(task, tmp_path):
    preds, labels = [1, 1, 0, 0, 1, 0, 1, 1], [1, 0, 0, 0, 1, 1, 1, 0]
    logits = torch.tensor([[0.0, 1.0] if p else [1.0, 0.0] for p in preds])
    got, module = scored(task, tmp_path, logits, torch.tensor(labels))
    hand = hand_binary(preds, labels)  # tp 3, tn 2, fp 2, fn 1: accuracy 5/8, F1 6/9, MCC 4/sqrt(5*4*4*3)
    for key in OFFICIAL[task]:
        metric = key.removeprefix("test/")
        assert got[metric] == pytest.approx(hand[metric], abs=1e-6), (task, metric)
    assert module.checkpoint_monitor == (f"val/{OFFICIAL[task][0].removeprefix('test/')}", "max")


def test_mnli_accuracy_counts_three_classes_and_both_validation_sets_get_their_own_metrics(tmp_path):
    preds, labels = [0, 1, 2, 2, 1, 0, 2], [0, 1, 1, 2, 0, 0, 2]
    got, module = scored("mnli", tmp_path, torch.eye(3)[preds], torch.tensor(labels))
    assert got["accuracy"] == pytest.approx(5 / 7)
    assert module.test_sets == ["test/matched", "test/mismatched"]
    assert [list(s.keys()) for s in module.test_scores] == [
        ["test/matched/accuracy", "test/matched/f1"],
        ["test/mismatched/accuracy", "test/mismatched/f1"],
    ]


def test_stsb_pearson_and_spearman_equal_the_hand_computation(tmp_path):
    outputs = [0.5, 1.7, 1.2, 4.0, 2.2, 3.1]
    labels = [0.2, 2.0, 1.4, 4.8, 3.5, 3.0]
    got, _ = scored("stsb", tmp_path, torch.tensor(outputs)[:, None], torch.tensor(labels))
    assert got["pearson"] == pytest.approx(pearson(outputs, labels), abs=1e-5)
    assert got["spearman"] == pytest.approx(pearson(ranks(outputs), ranks(labels)), abs=1e-5)
    assert set(got) == {"pearson", "spearman"}


# ------------------------------------------------------------------------------- local copies
def test_a_hub_layout_copy_of_mnli_scores_both_validation_sets_and_never_its_test_splits(standin, tmp_path):
    cfg = cfg_of("mnli", tmp_path, f"data.source={standin / 'mnli'}")
    splits, num_labels = labelled_splits(load_labelled(cfg.data), cfg.data)
    assert num_labels == 3 and set(splits) == {"train", "validation", "test/matched", "test/mismatched"}
    for name, file in (("test/matched", "validation_matched"), ("test/mismatched", "validation_mismatched")):
        rows = [json.loads(line) for line in (standin / "mnli" / f"{file}.jsonl").read_text().splitlines()]
        assert list(splits[name]["text"]) == [r["premise"] for r in rows]
        assert label_array(splits[name]).tolist() == [r["label"] for r in rows]
    hidden = {
        json.loads(line)["premise"] for line in (standin / "mnli" / "test_matched.jsonl").read_text().splitlines()
    }
    scored_texts = {t for ds in splits.values() for t in ds["text"]}
    assert not hidden & scored_texts  # GLUE's unlabelled test splits are read by nothing
    bad = cfg_of("mnli", tmp_path, f"data.source={standin / 'mnli'}", "data.classify.test_splits={m: test_matched}")
    with pytest.raises(ConfigError) as err:
        labelled_splits(load_labelled(bad.data), bad.data)
    assert str(err.value) == (
        f"data.classify.test_splits.m: split 'test_matched' of '{standin / 'mnli'}' is unlabelled (no labels, or all "
        "-1 as GLUE hides its test labels) and cannot be scored"
    )


def test_mnli_without_test_splits_is_refused_rather_than_ignoring_its_validation_sets(standin, tmp_path):
    cfg = cfg_of("mnli", tmp_path, f"data.source={standin / 'mnli'}", "data.classify.test_splits=null")
    with pytest.raises(ConfigError) as err:
        labelled_splits(load_labelled(cfg.data), cfg.data)
    assert str(err.value).startswith(
        f"data.source: '{standin / 'mnli'}' has labelled split(s) validation_matched, validation_mismatched that this "
        "run would ignore; score them with data.classify.test_splits={matched: validation_matched, mismatched: "
    )


def write_original_mnli(folder):
    """MNLI as GLUE first shipped it: TSV files dev_matched.tsv …, columns sentence1, sentence2, gold_label (names)."""
    names = ["entailment", "neutral", "contradiction"]
    folder.mkdir()
    for split, n in (("train", 30), ("dev_matched", 6), ("dev_mismatched", 5), ("test_matched", 4)):
        header = ["index", "genre", "sentence1", "sentence2"] + ([] if split.startswith("test") else ["gold_label"])
        lines = ["\t".join(header)]
        for i in range(n):
            label = [] if split.startswith("test") else [names[i % 3]]
            lines.append("\t".join([str(i), "fiction", f"{split} premise {i}", f"hypothesis {i}", *label]))
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")


def test_glues_original_tsv_layout_is_read_by_its_file_names(tmp_path):
    write_original_mnli(tmp_path / "MNLI")
    overrides = [
        f"data.source={tmp_path / 'MNLI'}",
        "data.text_column=sentence1",
        "data.text_pair_column=sentence2",
        "data.label_column=gold_label",
        "data.classify.label_names=[entailment,neutral,contradiction]",
    ]
    cfg = cfg_of("mnli", tmp_path, *overrides)
    splits, _ = labelled_splits(load_labelled(cfg.data), cfg.data)
    assert list(splits["test/matched"]["text"]) == [f"dev_matched premise {i}" for i in range(6)]
    assert label_array(splits["test/mismatched"]).tolist() == [0, 1, 2, 0, 1]
    (tmp_path / "MNLI" / "diagnostic.tsv").write_text("index\tsentence1\n0\tx\n")
    with pytest.raises(ConfigError) as err:
        load_labelled(cfg.data)
    assert str(err.value).startswith(
        f"data.source: '{tmp_path / 'MNLI'}' holds diagnostic.tsv, which names no split (a file per split, named train, "
    )


def test_stsb_float_labels_are_regression_targets_and_classification_refuses_them(tmp_path):
    rows = [{"sentence1": f"a {i}", "sentence2": f"b {i}", "label": i / 7, "idx": i} for i in range(40)]
    write_jsonl(tmp_path / "stsb" / "train.jsonl", rows)
    write_jsonl(tmp_path / "stsb" / "validation.jsonl", rows[:5])
    write_jsonl(tmp_path / "stsb" / "test.jsonl", [{**r, "label": -1.0} for r in rows[:3]])
    cfg = cfg_of("stsb", tmp_path, f"data.source={tmp_path / 'stsb'}")
    splits, num_labels = labelled_splits(load_labelled(cfg.data), cfg.data)
    assert num_labels == 1
    assert label_array(splits["test"]).tolist() == pytest.approx([r["label"] for r in rows[:5]])
    as_classes = cfg_of("mrpc", tmp_path, f"data.source={tmp_path / 'stsb'}")
    with pytest.raises(ConfigError, match="holds float64 values, not integer class ids .a regression"):
        labelled_splits(load_labelled(as_classes.data), as_classes.data)


# ------------------------------------------------------------------------------- runs
def test_stsb_regression_trains_end_to_end_and_writes_pearson_and_spearman(standin, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["train", str(GLUE / "stsb.yaml"), *SHRINK, f"data.source={standin / 'stsb'}", f"output_dir={tmp_path}"]
    assert cli.main([*args, f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    out = capsys.readouterr().out
    assert FROM_SCRATCH in out and "test/pearson" in out
    run = run_of(tmp_path / "glue_stsb")
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"test/pearson", "test/spearman", "val/pearson", "best_val/pearson"} <= set(metrics)
    assert all(-1 <= metrics[k] <= 1 for k in ("test/pearson", "test/spearman"))
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    assert {"val/pearson", "val/spearman", "hp/val_pearson", "test/pearson", "test/spearman"} <= set(
        events.Tags()["scalars"]
    )


def test_mnli_trains_and_scores_both_validation_sets_in_metrics_json(standin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["train", str(GLUE / "mnli.yaml"), *SHRINK, f"data.source={standin / 'mnli'}", f"output_dir={tmp_path}"]
    assert cli.main([*args, f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    metrics = json.loads((run_of(tmp_path / "glue_mnli") / "metrics.json").read_text())
    for name in ("matched", "mismatched"):  # 10 examples each in the stand-in: accuracy a multiple of 1/10
        accuracy = metrics[f"test/{name}/accuracy"]
        assert 0 <= accuracy <= 1 and round(accuracy * 10, 4) == round(accuracy * 10)
    assert not any(k.startswith("test/accuracy") for k in metrics)


@pytest.mark.slow
@pytest.mark.parametrize("task", GLUE_TASKS)
def test_every_task_trains_on_a_hub_layout_copy(task, standin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["train", str(GLUE / f"{task}.yaml"), *SHRINK, f"data.source={standin / task}", f"output_dir={tmp_path}"]
    assert cli.main([*args, f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    metrics = json.loads((tmp_path / f"glue_{task}" / "version_0" / "metrics.json").read_text())
    assert all(math.isfinite(metrics[k]) for k in OFFICIAL[task])


def test_offline_glue_from_the_hub_is_one_line_saying_what_to_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["train", str(GLUE / "cola.yaml"), *SHRINK, f"output_dir={tmp_path / 'runs'}"]
    assert cli.main([*args, f"data.cache_dir={tmp_path / 'cache'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: data.source: cannot load 'nyu-mll/glue' (subset 'cola'): ")
    assert err[0].endswith(
        "; to run offline, save GLUE once on a machine with internet (`linformer-lab glue-download DIR`) and set "
        "data.source=DIR/cola"
    )
    assert not (tmp_path / "runs").exists()
    assert cli.main(["glue-download", str(tmp_path / "glue"), "--tasks", "rte"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: glue-download: cannot load 'nyu-mll/glue' (subset 'rte'): ")


# ------------------------------------------------------------------------------- the table
def test_the_table_scores_each_task_by_its_official_metrics_and_marks_stand_ins_and_scratch(standin, tmp_path):
    cfg = OmegaConf.merge(
        OmegaConf.structured(pipeline.PipelineConfig),
        {
            "variants": {"full": [], "k8": [], "bare": []},
            "scratch": ["bare"],
            "tasks": {t: {"config": "x"} for t in ("mnli", "stsb", "mrpc")},
            "data_dir": str(standin),
            "note": "a subset",
        },
    )
    keys = {"mnli": OFFICIAL["mnli"], "stsb": OFFICIAL["stsb"], "mrpc": OFFICIAL["mrpc"]}
    results = {("full", ""): {"val/ppl": 9.0}, ("k8", ""): {"val/ppl": 11.0}}
    for i, v in enumerate(("full", "k8", "bare")):
        results[v, "mnli"] = {"test/matched/accuracy": 0.6 - i / 10, "test/mismatched/accuracy": 0.5 - i / 10}
        results[v, "stsb"] = {"test/pearson": 0.8, "test/spearman": 0.7}
        results[v, "mrpc"] = {"test/f1": 0.9, "test/accuracy": 0.7}
    notes = pipeline.table_notes(cfg, {"mnli": 800, "stsb": None, "mrpc": 800})
    markdown = pipeline.write_results(tmp_path, cfg, keys, results, notes)
    assert (
        "| variant | pretrain val ppl | mnli (matched/mismatched acc) | stsb (Pearson/Spearman) | mrpc (F1/acc) | "
        in (markdown)
    )
    assert "| full | 9.00 | 60.0/50.0 | 80.0/70.0 | 90.0/70.0 | 70.0 |" in markdown  # (55 + 75 + 80) / 3
    assert "| bare (no pretraining) | – | 40.0/30.0 |" in markdown
    assert STAND_IN_LINE in markdown and "a subset" in markdown and "mnli 800, mrpc 800" in markdown
    assert "bare (no pretraining): fine-tuned from scratch, no pretrained encoder was loaded." in markdown
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[1]["mnli"]) == pytest.approx(0.45) and float(rows[1]["average"]) == pytest.approx(
        (0.45 + 0.75 + 0.8) / 3
    )
    assert rows[2]["pretrained"] == "False" and rows[2]["pretrain_val_ppl"] == "nan"
    assert (tmp_path / "results.png").stat().st_size > 1000


def test_the_glue_pipelines_check_every_stage_and_a_missing_data_dir_is_one_line(tmp_path, capsys):
    for name, n_pretrained, n_tasks in (("table2_glue_cpu", 3, 4), ("table2_glue_gpu", 7, 4)):
        shipped = run_config.CONFIG_DIR.parent / "pipelines" / f"{name}.yaml"
        cfg = pipeline.load(shipped, ["data_dir=null"])
        stages = pipeline.stages(cfg, shipped.parent, tmp_path / "root")
        assert sum(not s.task for s in stages) == n_pretrained and len(cfg.tasks) == n_tasks
        for s in stages:
            if s.task:
                assert s.cfg.task == "classify" and (s.cfg.init_from is None) == (s.variant in cfg.scratch)
    missing = tmp_path / "nowhere"
    shipped = run_config.CONFIG_DIR.parent / "pipelines" / "table2_glue_cpu.yaml"
    assert cli.main(["pipeline", str(shipped), f"data_dir={missing}", f"output_dir={tmp_path / 'runs'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: data_dir: no folder '{missing / 'sst2'}' for task 'sst2'; save GLUE there once with `linformer-lab "
        f"glue-download {missing}` (or write a stand-in without internet: `linformer-lab glue-standin {missing}`)"
    )
    assert not (tmp_path / "runs").exists()


def test_glue_download_saves_each_hub_split_as_a_file_the_configs_read_offline(tmp_path, monkeypatch):
    """The hub is replaced by a DatasetDict of RTE's shape; what glue-download writes trains as the hub would."""
    import datasets

    features = datasets.Features(
        {
            "sentence1": datasets.Value("string"),
            "sentence2": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["entailment", "not_entailment"]),
            "idx": datasets.Value("int32"),
        }
    )

    def split(n, hidden=False):
        return datasets.Dataset.from_dict(
            {
                "sentence1": [f"s{i}" for i in range(n)],
                "sentence2": [f"t{i}" for i in range(n)],
                "label": [-1 if hidden else i % 2 for i in range(n)],
                "idx": list(range(n)),
            },
            features=features,
        )

    hub = datasets.DatasetDict(train=split(40), validation=split(6), test=split(5, hidden=True))
    monkeypatch.setattr(
        datasets, "load_dataset", lambda name, task: hub if (name, task) == ("nyu-mll/glue", "rte") else None
    )
    assert cli.main(["glue-download", str(tmp_path / "glue"), "--tasks", "rte"]) == 0
    assert sorted(p.name for p in (tmp_path / "glue" / "rte").iterdir()) == [
        "test.parquet",
        "train.parquet",
        "validation.parquet",
    ]
    cfg = cfg_of("rte", tmp_path, f"data.source={tmp_path / 'glue' / 'rte'}", "data.classify.num_labels=null")
    raw = load_labelled(cfg.data)
    assert raw["train"].features["label"].names == ["entailment", "not_entailment"]  # class names kept
    splits, num_labels = labelled_splits(raw, cfg.data)
    assert num_labels == 2 and list(splits["test"]["text"]) == [f"s{i}" for i in range(6)]
