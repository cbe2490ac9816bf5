"""Linformer's settings (lightning_modules/attention/linformer/options.py): combinations that cannot work fail at
config time in one line, those that work pass the config check and build, and each variant has an experiment file
that selects it."""

import pytest
import tiny
import torch

from foundation.configfile import to_container
from foundation.errors import ConfigError
from lightning_modules.encoder import TransformerEncoder
from training import config as run_config

V = 40


# ----------------------------------------------------------------------------- config-time errors
@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["model.attention.options.projection=conv", "model.attention.options.order=compress_first"],
            "model.attention.options.order: 'compress_first' needs E to commute with W_k, which conv's per-channel weights do not; "
            "use auto or project_first",
        ),
        (
            ["model.attention.options.compress=keys", "model.attention.options.order=compress_first"],
            "model.attention.options.order: 'compress_first' does not apply with compress='keys' (the lift needs every key row); "
            "use auto or project_first",
        ),
        (
            ["task=clm", "model.attention.causal=true", "model.attention.options.order=compress_first"],
            "model.attention.options.order: 'compress_first' does not apply with causal=true (the local block needs every key); "
            "use auto or project_first",
        ),
        (
            ["task=clm", "model.attention.causal=true", "model.attention.options.compress=values"],
            "model.attention.options.compress: 'values' cannot be causal (its lift P = E⁺E mixes every position into every row); "
            "use compress=both with causal=true",
        ),
        (
            [
                "model.attention.options.projection=conv",
                "model.attention.options.share=layerwise",
                "model.attention.options.k=[32,16]",
            ],
            "model.attention.options.k: per-layer k [32, 16] needs one window per layer, which share=layerwise cannot give a "
            "conv projection; use share none, headwise or kv",
        ),
        (
            [
                "task=clm",
                "model.attention.causal=true",
                "model.attention.options.share=layerwise",
                "model.attention.options.k_schedule={first: 32, last: 8}",
            ],
            "model.attention.options.k: per-layer k [32, 8] needs one window per layer, which share=layerwise cannot give a "
            "causal projection; use share none, headwise or kv",
        ),
        (
            ["model.attention.options.init=theorem2", "model.attention.options.share=kv"],
            "model.attention.options.init: 'theorem2' needs distinct E and F (share none or headwise, compress both), "
            "got share=kv, compress=both",
        ),
        (
            ["model.attention.options.init=theorem2", "model.attention.options.compress=keys"],
            "model.attention.options.init: 'theorem2' needs distinct E and F (share none or headwise, compress both), "
            "got share=none, compress=keys",
        ),
        (
            [
                "model.attention.options.init=window",
                "model.attention.options.share=layerwise",
                "model.attention.options.k=[32,16]",
            ],
            "model.attention.options.init: 'window' draws one window per slot of the shared 32 × n matrix, so under "
            "share=layerwise a layer with k < 32 would see only the start of the sequence (per-layer k [32, 16]); use share "
            "none, headwise or kv",
        ),
        (
            ["model.attention.kind=nope"],
            "model.attention.kind: unknown kind 'nope' (allowed: full, linformer, local, lsh, no_context, nystrom, performer, sparse)",
        ),
        (
            ["model.attention.options.projection=nope"],
            "model.attention.options.projection: unknown projection kind 'nope' (allowed: learned, random, conv, pool)",
        ),
        (
            ["model.attention.kind=full", "model.attention.options={window: 4}"],
            "model.attention.options: kind 'full' takes no options, got {'window': 4}",
        ),
        (
            ["model.attention.causal=true"],
            "task: 'mlm' needs model.attention.causal=false (a masked token is predicted from both sides)",
        ),
    ],
)
def test_combinations_that_cannot_work_fail_at_config_time_with_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        run_config.load(run_config.CONFIG_DIR / "base.yaml", overrides)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "model.attention.options.projection=pool",
            "model.attention.options.share=layerwise",
            "model.attention.options.k=[32,16]",
        ],
        ["model.attention.options.share=layerwise", "model.attention.options.k=[32,16]"],
        ["model.attention.options.projection=conv", "model.attention.options.init=theorem2"],
        [
            "task=clm",
            "model.attention.causal=true",
            "model.attention.options.projection=conv",
            "model.attention.options.k=[32,16]",
        ],
    ],
)
def test_combinations_that_work_pass_the_config_check_and_build(overrides):
    cfg = run_config.load(run_config.CONFIG_DIR / "base.yaml", overrides + ["model.max_len=64"])
    assert TransformerEncoder(to_container(cfg.model), V)(torch.randint(0, V, (1, 64))).shape == (1, 64, 128)


VARIANT_FILES = {  # file → (task, what it sets under model.attention)
    "random_projection": ("mlm", {"projection": "random"}),
    "nonuniform_k": ("mlm", {"k_schedule": {"kind": "linear", "first": 12, "last": 4}}),
    "key_only": ("mlm", {"compress": "keys"}),
    "value_only": ("mlm", {"compress": "values"}),
    "conv_projection": ("mlm", {"projection": "conv"}),
    "pool_projection": ("mlm", {"projection": "pool"}),
    "causal_lm": ("clm", {"kind": "linformer", "causal": True}),
    "causal_full": ("clm", {"kind": "full", "causal": True}),
}


@pytest.mark.parametrize("name", VARIANT_FILES)
def test_each_variant_has_an_experiment_file_that_selects_it(name):
    cfg = to_container(run_config.load(run_config.CONFIG_DIR / f"{name}.yaml"))
    task, attention = VARIANT_FILES[name]
    assert (cfg["experiment"], cfg["task"]) == (name, task)
    att = cfg["model"]["attention"]
    assert {key: att[key] if key in ("kind", "causal") else att["options"][key] for key in attention} == attention


@pytest.mark.parametrize("causal,draw,other", [(False, "normal", "jl"), (True, "jl", "normal")])
def test_the_default_draw_of_e_f_is_each_forms_authors_draw(causal, draw, other):
    """``init: auto`` draws E/F as the explicit per-form draw does, weight for weight (normal bidirectional, jl
    causal), and not as the other one."""

    def bank(init):
        enc = tiny.encoder(tiny.attention(causal=causal, k=4, init=init), seed=3, init_std=0.1)
        return torch.cat([p.flatten() for p in enc.shared.state_dict().values()])

    auto = bank("auto")
    assert torch.equal(auto, bank(draw))
    assert not torch.equal(auto, bank(other))
