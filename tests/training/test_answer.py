"""What a run answers (training/answer.py): each task's objective, the gain over the no-context level (a small one
said in words), and a classifier beside the majority class."""

import pytest

from training.answer import Objective, answer_lines, objective_of


@pytest.mark.parametrize(
    "task, groups, metric",
    [
        ("mlm", ("masked", "random", "kept"), "val/masked_loss"),
        ("mlm", (), "val/loss"),
        ("clm", (), "val/loss"),
        ("recall", (), "val/accuracy"),
        ("classify", (), "val/accuracy"),
        ("listops", (), "val/accuracy"),
    ],
)
def test_each_task_answers_with_its_studies_objective(task, groups, metric):
    assert objective_of(task, groups).metric == metric


def test_a_loss_gain_is_the_no_context_level_minus_the_loss_and_a_small_one_is_said_in_words():
    metrics = {"val/masked_loss": 2.80, "baselines": {"unigram/masked_loss": 3.09}}
    (line,) = answer_lines(Objective("val/masked_loss"), metrics)
    assert "val/masked_loss 2.8000" in line and "no context 3.0900" in line and "gain +0.2900 nats" in line
    stuck = answer_lines(Objective("val/masked_loss"), {**metrics, "val/masked_loss": 3.06})
    assert len(stuck) == 2 and "did not leave the no-context level" in stuck[1] and "+0.0300" in stuck[1]


def test_classification_stands_beside_the_majority_class():
    metrics = {"val/accuracy": 0.81, "trivial_accuracy": 0.5}
    (line,) = answer_lines(Objective("val/accuracy"), metrics)
    assert "majority class 0.5000 (trivial_accuracy)" in line and "gain +0.3100" in line and "nats" not in line
    stuck = answer_lines(Objective("val/accuracy"), {**metrics, "val/accuracy": 0.51})
    assert "did not leave the no-context level" in stuck[-1]
