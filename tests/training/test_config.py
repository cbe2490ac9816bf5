"""Configuration: merge order, one-line errors naming the key, exit code 2 and nothing written."""

import pytest
from tiny import REPO

from experiments import cli
from foundation.errors import ConfigError
from lightning_modules.attention.linformer import layer_ks
from lightning_modules.config import ModelConfig
from training import config as run_config

CONFIGS = REPO / "experiments" / "configs"


def test_merge_order_defaults_then_yaml_then_overrides(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("model:\n  d_model: 64\n  n_heads: 2\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text("defaults: [base.yaml]\nmodel:\n  n_heads: 4\n")
    cfg = run_config.load(exp, ["model.n_layers=3"])
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.n_layers) == (64, 4, 3)
    assert cfg.model.d_ff == ModelConfig().d_ff


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.attention.kind=banana", "model.attention.kind: unknown kind 'banana' (allowed: full, linformer"),
        (
            "model.attention.shared=kv",
            "model.attention.shared: unknown key (allowed here: kind, causal, dropout, options)",
        ),
        ("model.d_model=wide", "model.d_model: Value 'wide' of type 'str' could not be converted to Integer"),
        (
            "model.attention.options.k=200",
            "model.attention.options.k: k=200 (layer 0) must be in [1, model.max_len=128]",
        ),
        ("model.attention.options.k=[8,16,32]", "model.attention.options.k: has 3 entries but model.n_layers=2"),
        ("model.n_heads=3", "model.d_model: 128 is not divisible by model.n_heads=3"),
        ("task=clm", "task: 'clm' needs model.attention.causal=true"),
        ("trainer.compile=sometimes", "trainer.compile: 'sometimes' is not one of auto, true, false"),
        ("trainer.compile=1", "trainer.compile: 1 is not one of auto, true, false"),
        ("optim.schedule=wsd2", "optim.schedule"),
        ("optim.cooldown_shape=sqrt", "optim.cooldown_shape"),
        ("optim.cooldown_fraction=0", "optim.cooldown_fraction: must be a finite number in (0, 1], got 0"),
        ("optim.projection_lr_scale=-0.1", "optim.projection_lr_scale: must be a finite number in [0, 100], got -0.1"),
        (
            "optim.schedule=wsd optim.cooldown_fraction=0.95",
            "optim.cooldown_fraction: 0.95 of trainer.max_steps=600 starts the cooldown at step 30, inside the warm-up",
        ),
        ("optim.schedule=wsd optim.cooldown_fraction=0.0001", "is no whole step of cooldown"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(override, message):
    with pytest.raises(ConfigError) as err:
        run_config.load(CONFIGS / "base.yaml", override.split())
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_per_layer_k_from_list_and_schedule():
    cfg = run_config.load(None, ["model.n_layers=4", "model.attention.options.k=[64,32,16,8]"])
    assert layer_ks(cfg.model) == [64, 32, 16, 8]
    cfg = run_config.load(
        None, ["model.n_layers=4", "model.attention.options.k_schedule={kind: linear, first: 64, last: 16}"]
    )
    assert layer_ks(cfg.model) == [64, 48, 32, 16]


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["train", "missing.yaml"], "config file missing.yaml: not found"),
        (["train", "{bad}", "model.attention.kind=banana"], "model.attention.kind"),
        (["train", "{malformed}"], "malformed YAML at line"),
        (["train", "{bad}", "trainer.compile=yes please"], "trainer.compile: 'yes please' is not one of auto, true"),
    ],
)
def test_cli_config_errors_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, monkeypatch, args, fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(f"defaults: [{CONFIGS / 'base.yaml'}]\n")
    (tmp_path / "malformed.yaml").write_text("model:\n  d_model: [1, 2\n")
    args = [a.format(bad=tmp_path / "bad.yaml", malformed=tmp_path / "malformed.yaml") for a in args]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "malformed.yaml"]


def test_every_shipped_experiment_file_validates():
    for path in sorted([*CONFIGS.glob("*.yaml"), *CONFIGS.glob("glue/*.yaml")]):
        run_config.load(path)


@pytest.mark.parametrize(
    "config, started, resumed, accepted",
    [
        ("bytes_mlm.yaml", "normal", "auto", True),  # auto is normal on the bidirectional form
        ("bytes_mlm.yaml", "auto", "normal", True),
        ("bytes_mlm.yaml", "auto", "jl", False),
        ("causal_lm.yaml", "auto", "jl", True),  # and jl on the causal form
        ("causal_lm.yaml", "normal", "auto", False),
    ],
)
def test_a_resume_compares_the_draw_that_init_auto_stands_for(tmp_path, config, started, resumed, accepted):
    from omegaconf import OmegaConf

    from training.resume import CONFIG, check_same_config

    init = "model.attention.options.init"
    OmegaConf.save(run_config.load(CONFIGS / config, [f"{init}={started}"]), tmp_path / CONFIG)
    cfg = run_config.load(CONFIGS / config, [f"{init}={resumed}"])
    if accepted:
        check_same_config(cfg, tmp_path)
    else:
        with pytest.raises(ConfigError, match=rf"differs at {init} \('\w+' there, '\w+' here\)"):
            check_same_config(cfg, tmp_path)
