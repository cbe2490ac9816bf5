"""Sequence classification on the encoder (lightning_modules/classifier.py): ``init_from`` refuses another
architecture or a run without its tokenizer, and the checkpoint's kind options are part of its architecture."""

from tiny import run_of

from experiments import cli


# ------------------------------------------------------------------------------- init_from
def test_init_from_refuses_another_architecture_or_a_run_without_tokenizer(tiny_overrides, tmp_path, capsys):
    assert (
        cli.main(["train", str(tiny_overrides.config), *tiny_overrides.args, "trainer.max_steps=3", "experiment=pre"])
        == 0
    )
    pre = run_of(tmp_path / "runs" / "pre")
    finetune = [
        "train",
        str(tiny_overrides.config),
        *tiny_overrides.args,
        "task=classify",
        "experiment=ft",
        "data.source=rotten_tomatoes",
        f"init_from={pre}",
    ]
    assert cli.main([*finetune, "model.attention.options.k=4"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: init_from: '{pre / 'checkpoints' / 'last.ckpt'}' was trained with model.attention.options.k=[8, 8], "
        f"this run has model.attention.options.k=[4, 4] (the encoder architecture must match)"
    )
    (pre / "tokenizer.json").unlink()
    assert cli.main(finetune) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: init_from: no tokenizer.json in '{pre}' (set data.tokenizer.path to the tokenizer the encoder was "
        f"pretrained with)"
    )
    assert not (tmp_path / "runs" / "ft").exists()


def test_a_performer_with_its_own_options_fine_tunes_and_other_options_are_one_line(tiny_overrides, tmp_path, capsys):
    """The checkpoint's kind options are part of its architecture: the same ones load, others are refused."""
    performer = ["model.attention.kind=performer", "model.attention.options.n_features=8"]
    pretrain = [*tiny_overrides.args, *performer, "trainer.max_steps=3", "experiment=pre"]
    assert cli.main(["train", str(tiny_overrides.config), *pretrain]) == 0
    pre = run_of(tmp_path / "runs" / "pre")
    finetune = [
        "train",
        str(tiny_overrides.config),
        *tiny_overrides.args,
        "model.attention.kind=performer",
        "task=classify",
        "data.source=rotten_tomatoes",
        f"init_from={pre}",
        "trainer.max_steps=3",
    ]
    assert cli.main([*finetune, "experiment=other", "model.attention.options.n_features=16"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: init_from: '{pre / 'checkpoints' / 'last.ckpt'}' was trained with "
        "model.attention.options.n_features=8, this run has model.attention.options.n_features=16 "
        "(the encoder architecture must match)"
    )
    assert cli.main([*finetune, "experiment=ft", "model.attention.options.n_features=8"]) == 0
    assert (run_of(tmp_path / "runs" / "ft") / "metrics.json").is_file()
