"""The attention kinds beyond Linformer (sparse, local, lsh, performer, nystrom, no_context) as one family: decoding
states of a fixed size, or one line where a kind has none, attention dropout, training steps through ``train``, and
config errors in one line. Each kind's own specification (its exact limit, its decoding state, checkpoints,
cross-checks against the field's reference libraries, skipped when ``.[refs]`` is not installed) is the test file
named after its module beside this one; the contract every kind keeps (masks, causality, gradients, checkpoints,
decoding) is ``test_contract.py``'s."""

import math

import pytest
import tiny
import torch
from kinds import D, H, N, V, attention

from experiments import cli
from foundation.errors import ConfigError
from training import config as run_config
from training.train import train


# ----------------------------------------------------------------------------- decoding states and dropout
@pytest.mark.parametrize("name", ["local", "performer"])
def test_local_and_performer_decoding_states_have_a_fixed_size(name):
    enc = tiny.encoder(attention(name, causal=True), vocab=V, random_biases=True).eval()
    state = enc.init_decode_state(2)

    def shapes():
        return [{key: tuple(v.shape) for key, v in s.items() if torch.is_tensor(v)} for s in state["layers"]]

    before = shapes()
    if name == "local":  # a ring of w rows and the g globals
        assert before[0]["ring_k"] == (2, H, 5, D // H) and before[0]["global_k"] == (2, H, 1, D // H)
    else:  # S (m × d_h) and z (m)
        assert before[0]["s"] == (2, H, 8, D // H) and before[0]["z"] == (2, H, 8)
    for _ in range(N):
        enc.decode_step(torch.randint(0, V, (2,)), state)
        assert shapes() == before


def test_kinds_without_a_streaming_form_say_so_in_one_line():
    with pytest.raises(ValueError, match="^attention kind 'lsh' has no streaming form"):
        tiny.encoder(attention("lsh", causal=True), vocab=V).init_decode_state(1)
    with pytest.raises(ValueError, match="^incremental decoding needs causal attention"):
        tiny.encoder(attention("nystrom"), vocab=V).init_decode_state(1)


@pytest.mark.parametrize("name", ["local", "sparse_fixed", "lsh"])
def test_attention_dropout_drops_probabilities_in_training_only(name):
    torch.manual_seed(0)
    dropped = tiny.layer({**attention(name), "dropout": 0.5})
    plain = tiny.layer(attention(name))
    plain.load_state_dict(dropped.state_dict())
    x = torch.randn(2, N, D)
    with torch.no_grad():
        assert not torch.allclose(dropped.train()(x), dropped.train()(x))  # a fresh mask each call
        torch.testing.assert_close(dropped.eval()(x), plain.eval()(x))


@pytest.mark.slow  # a Lightning run per kind
@pytest.mark.parametrize(
    "name,task",
    [
        ("sparse_fixed", "mlm"),
        ("local", "clm"),
        ("lsh", "mlm"),
        ("lsh", "clm"),
        ("performer", "clm"),
        ("nystrom", "mlm"),
    ],
)
def test_every_kind_trains_two_steps_through_train(name, task, tiny_overrides):
    kind, options = tiny.KINDS[name]
    chosen = [f"model.attention.options.{key}={value}" for key, value in options.items()]
    if kind == "performer":
        chosen.append("model.attention.options.redraw=every_step")
    cfg = run_config.load(
        tiny_overrides.config,
        [
            *tiny_overrides.args,
            f"task={task}",
            f"model.attention.kind={kind}",
            f"model.attention.causal={task == 'clm'}",
            *chosen,
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
        ],
    )
    metrics = train(cfg)
    assert metrics["global_step"] == 2 and math.isfinite(metrics["val/loss"])


# ----------------------------------------------------------------------------- config errors
@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["model.attention.kind=lsh", "model.attention.options.n_landmarks=8"],
            "model.attention.options.n_landmarks: not an option of kind 'lsh' (its options: n_hashes, bucket_size)",
        ),
        (
            ["model.attention.kind=nystrom", "task=clm", "model.attention.causal=true"],
            "model.attention.causal: kind 'nystrom' has no causal form (set causal=false or choose another kind)",
        ),
        (
            ["model.attention.kind=local", "model.attention.options.window=129"],
            "model.attention.options.window: 129 must be in [1, model.max_len=128] (window = max_len is full attention)",
        ),
        (
            ["model.attention.kind=local", "model.attention.options.n_global=-1"],
            "model.attention.options.n_global: -1 must be in [0, model.max_len=128]",
        ),
        (
            ["model.attention.kind=local", "model.attention.options.engine=fast"],
            "model.attention.options.engine: Invalid value 'fast', expected one of ['auto', 'blocked', 'dense', 'flex', 'compiled']",
        ),
        (
            ["model.attention.kind=sparse", "model.attention.options.block=0"],
            "model.attention.options.block: 0 must be in [1, model.max_len=128] (block = max_len is full attention)",
        ),
        (
            ["model.attention.kind=sparse", "model.attention.options.stride=4"],
            "model.attention.options.stride: 4 applies to pattern 'strided' only (pattern 'fixed' uses block and summary)",
        ),
        (
            [
                "model.attention.kind=sparse",
                "model.attention.options.pattern=strided",
                "model.attention.options.summary=2",
            ],
            "model.attention.options.summary: 2 applies to pattern 'fixed' only (pattern 'strided' uses block and stride)",
        ),
        (
            ["model.attention.kind=sparse", "model.attention.options.block=8", "model.attention.options.summary=9"],
            "model.attention.options.summary: 9 must be in [1, block=8]",
        ),
        (
            ["model.attention.kind=lsh", "model.attention.options.bucket_size=0"],
            "model.attention.options.bucket_size: 0 must be in [1, model.max_len=128] (bucket_size = max_len is one bucket)",
        ),
        (
            ["model.attention.kind=lsh", "model.attention.options.n_hashes=0"],
            "model.attention.options.n_hashes: must be an integer in [1, 64], got 0",
        ),
        (
            ["model.attention.kind=performer", "model.attention.options.n_features=0"],
            "model.attention.options.n_features: must be an integer in [1, 65536], got 0",
        ),
        (
            ["model.attention.kind=performer", "model.attention.options.redraw=every_n_steps"],
            "model.attention.options.redraw_every: redraw=every_n_steps needs an integer >= 1, got None",
        ),
        (
            ["model.attention.kind=performer", "model.attention.options.redraw_every=10"],
            "model.attention.options.redraw_every: 10 applies to redraw=every_n_steps only (redraw is 'never')",
        ),
        (
            ["model.attention.kind=performer", "model.attention.dropout=0.1"],
            "model.attention.dropout: 0.1 not allowed for kind 'performer' (FAVOR+ forms no attention probabilities to "
            "drop); set 0 (model.dropout still applies)",
        ),
        (
            ["model.attention.kind=nystrom", "model.attention.options.n_landmarks=129"],
            "model.attention.options.n_landmarks: 129 must be in [1, model.max_len=128] (n_landmarks = max_len is full "
            "attention)",
        ),
        (
            ["model.attention.kind=nystrom", "model.attention.options.pinv_iterations=0"],
            "model.attention.options.pinv_iterations: must be an integer in [1, 1000], got 0",
        ),
    ],
)
def test_wrong_options_fail_at_config_time_with_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        run_config.load(run_config.CONFIG_DIR / "base.yaml", overrides)
    assert str(err.value) == message


def test_an_option_of_another_kind_exits_2_through_the_cli(capsys):
    args = [
        "train",
        str(run_config.CONFIG_DIR / "base.yaml"),
        "model.attention.kind=lsh",
        "model.attention.options.n_landmarks=8",
    ]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: model.attention.options.n_landmarks: not an option of kind 'lsh' (its options: n_hashes, bucket_size)"
    ]
