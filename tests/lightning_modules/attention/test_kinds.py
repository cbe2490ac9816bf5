"""The attention kinds beyond Linformer (sparse, local, lsh, performer, nystrom, no_context) as specifications: each
kind's exact limit, decoding state, checkpoints, FLOP counts, config errors, and cross-checks against the field's
reference libraries (skipped when ``.[refs]`` is not installed). The contract every kind keeps (masks, causality,
gradients, checkpoints, decoding) is ``test_contract.py``'s."""

import functools
import math

import pytest
import tiny
import torch
import torch.nn.functional as F
from kinds import D, H, N, V, attention, full_and, padding_mask, same_weights

from experiments import cli
from foundation.errors import ConfigError
from lightning_modules.attention.lsh import SELF_SCORE
from lightning_modules.attention.performer import orthogonal_features
from lightning_modules.flops import count_flops
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


# ----------------------------------------------------------------------------- exact limits
@pytest.mark.parametrize("causal", [False, True])
def test_no_context_output_at_a_position_is_blind_to_every_other_token_exactly(causal):
    enc = tiny.encoder(attention("no_context", causal), vocab=V, random_biases=True).eval()  # two layers
    ids = torch.randint(5, V, (3, N))
    mask = padding_mask()  # the last row: 10 real tokens, then padding
    with torch.no_grad():
        base = enc(ids, mask)
        torch.testing.assert_close(enc(ids), base, atol=0, rtol=0)  # padding changes no output either
        for i in range(N):
            others = (ids + torch.randint(1, V - 5, ids.shape)) % (V - 5) + 5  # every token changed …
            others[:, i] = ids[:, i]  # … but the one at position i
            out = enc(others, mask)
            assert torch.equal(out[:, i], base[:, i]), f"position {i} saw another token"
            assert not torch.allclose(out[:, i - 1], base[:, i - 1]), "a token did not reach its own output"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_global", [0, 3])
def test_local_with_a_window_of_n_is_full_attention(causal, n_global):
    full, local = full_and({"kind": "local", "causal": causal, "options": {"window": N, "n_global": n_global}})
    x, mask = torch.randn(3, N, D), padding_mask()
    with torch.no_grad():
        torch.testing.assert_close(local(x), full(x), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(local(x, mask), full(x, mask), atol=1e-6, rtol=1e-5)


def test_local_sees_exactly_window_positions_centred_and_shifted_inside_the_grid():
    local = tiny.layer({"kind": "local", "options": {"window": 4}})
    i = torch.arange(N)
    seen = local.visible(i[:, None], i[None, :])
    assert (seen.sum(1) == 4).all()
    assert seen[0].nonzero().flatten().tolist() == [0, 1, 2, 3]  # shifted right at the start
    assert seen[8].nonzero().flatten().tolist() == [6, 7, 8, 9]  # i − ⌊w/2⌋ … i + ⌈w/2⌉ − 1
    assert seen[N - 1].nonzero().flatten().tolist() == [12, 13, 14, 15]  # shifted left at the end
    causal = tiny.layer({"kind": "local", "causal": True, "options": {"window": 4, "n_global": 2}})
    assert causal.visible(torch.tensor(9), i).nonzero().flatten().tolist() == [0, 1, 6, 7, 8, 9]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "options",
    [
        {"pattern": "fixed", "block": N},
        {"pattern": "fixed", "block": 4, "summary": 4},
        {"pattern": "strided", "block": 3, "stride": 1},
        {"pattern": "strided", "block": N},
    ],
)
def test_sparse_pattern_covering_every_pair_is_full_attention(options, causal):
    full, sparse = full_and({"kind": "sparse", "causal": causal, "options": options})
    x, mask = torch.randn(3, N, D), padding_mask()
    with torch.no_grad():
        torch.testing.assert_close(sparse(x), full(x), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(sparse(x, mask), full(x, mask), atol=1e-6, rtol=1e-5)


def test_sparse_patterns_are_the_papers_sets():
    i = torch.arange(N)
    fixed = tiny.layer({"kind": "sparse", "causal": True, "options": {"pattern": "fixed", "block": 4, "summary": 1}})
    assert fixed.visible(torch.tensor(10), i).nonzero().flatten().tolist() == [3, 7, 8, 9, 10]  # block 8-11, summaries
    strided = tiny.layer({"kind": "sparse", "causal": True, "options": {"pattern": "strided", "block": 3, "stride": 4}})
    assert strided.visible(torch.tensor(10), i).nonzero().flatten().tolist() == [2, 6, 8, 9, 10]  # last 3, every 4th
    both_ways = tiny.layer({"kind": "sparse", "options": {"pattern": "strided", "block": 2, "stride": 5}})
    assert both_ways.visible(torch.tensor(7), i).nonzero().flatten().tolist() == [2, 6, 7, 8, 12]


def shared_qk_attention(lsh, x, causal):
    """The dense reference: softmax(Q K̂ᵀ/√d_h) V with K̂ = Q/‖Q‖, a query seeing itself only as a last resort."""
    b, t, _ = x.shape
    q, v = lsh.heads(lsh.q_proj(x)), lsh.heads(lsh.v_proj(x))
    scores = q @ F.normalize(q, dim=-1).transpose(-1, -2) / math.sqrt(lsh.d_head)
    scores = scores.masked_fill(torch.eye(t, dtype=torch.bool), SELF_SCORE)
    if causal:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
    out = scores.softmax(-1) @ v
    return lsh.out_proj(out.transpose(1, 2).reshape(b, t, -1))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_hashes", [1, 3])
def test_lsh_with_one_bucket_is_full_shared_qk_attention(causal, n_hashes):
    torch.manual_seed(0)
    lsh = tiny.layer({"kind": "lsh", "causal": causal, "options": {"bucket_size": N, "n_hashes": n_hashes}})
    assert lsh.n_buckets == 1 and lsh.k_proj is None
    x = torch.randn(3, N, D)
    with torch.no_grad():
        torch.testing.assert_close(lsh(x), shared_qk_attention(lsh, x, causal), atol=1e-5, rtol=1e-5)


def test_lsh_identical_rounds_count_each_pair_once():
    """With every round's rotation the same, the union is one round's set: r rounds equal one."""
    torch.manual_seed(0)
    one = tiny.layer({"kind": "lsh", "options": {"bucket_size": 4, "n_hashes": 1}})
    three = tiny.layer({"kind": "lsh", "options": {"bucket_size": 4, "n_hashes": 3}})
    three.load_state_dict({**one.state_dict(), "rotations": one.rotations.expand(3, -1, -1).clone()})
    x = torch.randn(2, N, D)
    with torch.no_grad():
        torch.testing.assert_close(three(x), one(x), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_error_against_full_attention_shrinks_as_features_grow(causal):
    torch.manual_seed(0)
    full = tiny.layer({"kind": "full", "causal": causal})
    x = torch.randn(2, N, D)
    with torch.no_grad():
        reference = full(x)
        errors = []
        for m in (4, 32, 256):
            per_seed = []
            for seed in range(4):
                torch.manual_seed(seed)
                performer = tiny.layer({"kind": "performer", "causal": causal, "options": {"n_features": m}})
                same_weights(full, performer)
                per_seed.append((performer(x) - reference).abs().mean() / reference.abs().mean())
            errors.append(float(torch.stack(per_seed).mean()))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.35 * errors[0], errors


@pytest.mark.parametrize("t", [5, 24, 64, 65, 150])  # shorter than a chunk, one chunk, chunks with a ragged tail
def test_causal_favor_equals_the_quadratic_form_at_every_length(t):
    """Σ_{j ≤ i} φ(q_i)·φ(k_j) v_j / Σ_{j ≤ i} φ(q_i)·φ(k_j), written out as a masked T × T product."""
    torch.manual_seed(0)
    performer = tiny.layer({"kind": "performer", "causal": True, "options": {"n_features": 8}}, n=160)
    q, k, v = (torch.randn(2, H, t, D // H) for _ in range(3))
    qf, kf = performer.feature_map(q, True), performer.feature_map(k, False)  # (B, h, T, m), float32
    scores = (qf.double() @ kf.double().transpose(-1, -2)).tril()  # (B, h, T, T)
    expected = (scores @ v.double()) / scores.sum(-1, keepdim=True)
    torch.testing.assert_close(performer.causal_favor(qf, kf, v).double(), expected, atol=1e-5, rtol=1e-5)


def test_orthogonal_features_are_orthogonal_in_blocks_with_gaussian_norms():
    torch.manual_seed(0)
    w = orthogonal_features(20, 8)  # blocks of 8, 8, 4 rows
    for block in (w[:8], w[8:16], w[16:]):
        gram = block @ block.T
        torch.testing.assert_close(gram - torch.diag(gram.diagonal()), torch.zeros_like(gram), atol=1e-4, rtol=0)
    big = orthogonal_features(4000, 8)
    assert abs(big.norm(dim=1).pow(2).mean().item() - 8) < 0.3  # E‖w‖² = d for w ~ N(0, I_d)


def test_nystrom_with_n_landmarks_is_full_attention_and_converges_with_iterations():
    torch.manual_seed(0)
    full = tiny.layer({"kind": "full"})
    x, mask = torch.randn(3, N, D), padding_mask()
    errors = []
    with torch.no_grad():
        for iterations in (6, 10, 15):
            nystrom = tiny.layer({"kind": "nystrom", "options": {"n_landmarks": N, "pinv_iterations": iterations}})
            same_weights(full, nystrom)
            errors.append((nystrom(x) - full(x)).abs().max().item())
        torch.testing.assert_close(nystrom(x), full(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(nystrom(x, mask)[-1, :10], full(x, mask)[-1, :10], atol=1e-4, rtol=1e-4)
    assert errors[0] > errors[1] > errors[2]


def test_nystrom_iterates_in_float64_for_float64_inputs_down_to_its_rounding():
    torch.manual_seed(0)
    full = tiny.layer({"kind": "full"}).double()
    x = torch.randn(3, N, D, dtype=torch.float64)
    errors = []
    with torch.no_grad():
        for iterations in (6, 10, 20, 40):
            nystrom = tiny.layer(
                {"kind": "nystrom", "options": {"n_landmarks": N, "pinv_iterations": iterations}}
            ).double()
            same_weights(full, nystrom)
            errors.append((nystrom(x) - full(x)).abs().max().item())
    # each step down until float64's rounding of this layer (~1e-13), where the error no longer orders; float32
    # stalls near 1e-4
    assert all(later < earlier or later < 1e-12 for earlier, later in zip(errors, errors[1:]))
    assert errors[0] > 1e-4 and errors[-1] < 1e-10


# ----------------------------------------------------------------------------- performer's random features
def test_performer_features_are_a_buffer_restored_not_redrawn(tmp_path):
    saved, fresh = (tiny.encoder(attention("performer"), seed, V, random_biases=True).eval() for seed in (0, 7))
    names = {n for n, _ in saved.named_buffers()}
    assert {"blocks.0.attn.features", "blocks.0.attn.seed", "blocks.0.attn.steps"} <= names
    assert not torch.equal(fresh.blocks[0].attn.features, saved.blocks[0].attn.features)
    torch.save(saved.state_dict(), tmp_path / "ckpt.pt")
    fresh.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    assert torch.equal(fresh.blocks[0].attn.features, saved.blocks[0].attn.features)


@pytest.mark.parametrize(
    "policy,every,redrawn_after", [("never", None, []), ("every_step", None, [1, 2, 3]), ("every_n_steps", 2, [2])]
)
def test_performer_redraws_by_its_policy_in_training_only(policy, every, redrawn_after):
    extra = {"redraw": policy} if every is None else {"redraw": policy, "redraw_every": every}
    enc = tiny.encoder(attention("performer", **extra), vocab=V, random_biases=True).eval()
    attn = enc.blocks[0].attn
    ids = torch.randint(0, V, (1, N))
    with torch.no_grad():
        for _ in range(3):
            before = attn.features.clone()
            enc.eval()(ids)
            assert torch.equal(attn.features, before)  # evaluation never redraws
        changed = []
        for step in range(4):
            before = attn.features.clone()
            enc.train()(ids)
            if not torch.equal(attn.features, before):
                changed.append(step)
    assert changed == redrawn_after


def test_performer_redraws_the_same_features_on_every_process():
    """Redraws are seeded by the saved seed and the draw count: two ranks holding the same buffers agree."""
    a, b = (
        tiny.encoder(attention("performer", redraw="every_step"), seed, V, random_biases=True).eval() for seed in (0, 1)
    )
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, V, (1, N))
    with torch.no_grad():
        for _ in range(3):
            a.train()(ids), b.train()(ids)
    assert torch.equal(a.blocks[1].attn.features, b.blocks[1].attn.features)


# ----------------------------------------------------------------------------- FLOP counts
def _layer_flops(attention_cfg, n, mode, d=32, h=4, batch=2):
    torch.manual_seed(0)
    attn = tiny.layer(attention_cfg, n=n, d=d, h=h).train(mode == "fwdbwd")
    x = torch.randn(batch, n, d, requires_grad=mode == "fwdbwd")

    def run():
        if mode == "fwd":
            with torch.inference_mode():
                return attn(x)
        attn(x).sum().backward()

    return count_flops(run)[0]


@pytest.mark.parametrize("mode,per_pair", [("fwd", 4), ("fwdbwd", 14)])
def test_local_flop_count_is_4_b_h_n_w_dh_and_full_attentions_at_w_ge_n(mode, per_pair):
    n, w, d, h, b = 64, 8, 32, 4, 2
    projections = 8 * b * n * d * d * (1 if mode == "fwd" else 3)  # Q, K, V, O: forward, then 2× backward
    local = _layer_flops({"kind": "local", "options": {"window": w}}, n, mode)
    assert local - projections == per_pair * b * h * n * w * (d // h)  # 4·B·h·n·w·d_h forward (+10 backward)
    assert _layer_flops({"kind": "local", "options": {"window": n}}, n, mode) == _layer_flops({"kind": "full"}, n, mode)


def test_counting_flops_changes_no_output_and_no_gradient():
    torch.manual_seed(0)
    local = tiny.layer(attention("local"))
    x = torch.randn(2, N, D, requires_grad=True)
    plain = local(x)
    (plain * plain).sum().backward()
    expected = [x.grad.clone(), *(p.grad.clone() for p in local.parameters())]
    x.grad = None
    local.zero_grad(set_to_none=True)

    def run():
        out = local(x)
        (out * out).sum().backward()
        return out

    _, counted_out = count_flops(run)
    assert torch.equal(counted_out, plain)
    for got, want in zip([x.grad, *(p.grad for p in local.parameters())], expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_every_kind_counts_less_attention_work_than_full_at_a_budget_of_k():
    n, k = 64, 8
    full = _layer_flops({"kind": "full"}, n, "fwd")
    for kind, options in (
        ("local", {"window": k}),
        ("sparse", {"block": k}),
        ("lsh", {"bucket_size": k}),
        ("performer", {"n_features": k}),
        ("nystrom", {"n_landmarks": k}),
    ):
        assert 0 < _layer_flops({"kind": kind, "options": options}, n, "fwd") < full, kind


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


# ----------------------------------------------------------------------------- engines
@pytest.mark.slow  # eager FlexAttention's first call builds its machinery: ~5 s on 2 cores
@pytest.mark.parametrize("name", ["local", "sparse_strided"])
@pytest.mark.parametrize("causal", [False, True])
def test_flex_attention_engine_equals_the_dense_engine(name, causal):
    torch.manual_seed(0)
    flex, dense = (
        tiny.layer(attention(name, causal, engine="flex")),
        tiny.layer(attention(name, causal, engine="dense")),
    )
    dense.load_state_dict(flex.state_dict())
    x, mask = torch.randn(2, 13, D), padding_mask(2, 13, 9)
    with torch.no_grad():
        assert flex.engine_for(x, 0.0) == "flex"
        torch.testing.assert_close(flex(x, mask), dense(x, mask), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(flex(x), dense(x), atol=1e-6, rtol=1e-5)


def test_auto_engine_is_blocked_on_cpu_and_where_flex_cannot_run():
    local = tiny.layer(attention("local"))
    q = torch.randn(1, H, N, D // H, requires_grad=True)
    assert local.engine_for(q, 0.0) == "blocked"
    flex = tiny.layer(attention("local", engine="flex"))
    assert flex.engine_for(q, 0.0) == "blocked"  # torch has no CPU FlexAttention backward
    assert flex.engine_for(q.detach(), 0.5) == "blocked"  # Flex applies no attention dropout
    assert flex.engine_for(q.detach(), 0.0) == "flex"


# ----------------------------------------------------------------------------- reference libraries
reformer = functools.partial(pytest.importorskip, "reformer_pytorch")

performer_lib = functools.partial(pytest.importorskip, "performer_pytorch")

nystrom_lib = functools.partial(pytest.importorskip, "nystrom_attention")


def _lsh_pair(n=32, bucket_size=4, n_hashes=2, causal=False, **library_options):
    """Our lsh layer and reformer-pytorch's LSHAttention drawing the same rotations (its draw is replayed)."""
    LSHAttention = reformer().LSHAttention
    ours = tiny.layer(
        {"kind": "lsh", "causal": causal, "options": {"bucket_size": bucket_size, "n_hashes": n_hashes}}, n=n
    )
    theirs = LSHAttention(bucket_size=bucket_size, n_hashes=n_hashes, causal=causal, **library_options).eval()
    torch.manual_seed(5)  # what its hash_vectors draws: randn(1, d_h, n_hashes, n_buckets / 2)
    drawn = torch.randn(1, D // H, n_hashes, ours.n_buckets // 2)
    if ours.n_buckets > 1:
        ours.rotations.copy_(drawn[0].permute(1, 0, 2))
    return ours, theirs


def test_lsh_hashes_like_reformer_pytorch():
    ours, theirs = _lsh_pair()
    q = torch.randn(2, H, 32, D // H)
    torch.manual_seed(5)
    buckets = theirs.hash_vectors(ours.n_buckets, q.flatten(0, 1)).view(2 * H, 2, 32)
    offsets = torch.arange(2)[None, :, None] * ours.n_buckets
    assert torch.equal(ours.buckets(q, None).flatten(0, 1), buckets - offsets)


def test_lsh_matches_reformer_pytorch_within_buckets_with_the_same_rotations():
    """Non-causal, several buckets, two rounds, pairs counted once: the paper's rule, reformer-pytorch's
    ``attend_across_buckets=False, allow_duplicate_attention=False``."""
    ours, theirs = _lsh_pair(attend_across_buckets=False, allow_duplicate_attention=False, return_attn=True)
    q, v = torch.randn(2, H, 32, D // H), torch.randn(2, H, 32, D // H)
    torch.manual_seed(5)
    expected, weights, _ = theirs(q.flatten(0, 1), v.flatten(0, 1))
    expected = expected.view_as(v)
    # A query alone in its bucket in every round sees only itself: ours returns v_i exactly; the library's
    # float32 exp(l − logsumexp l) at l ≈ −5·10⁴ (the self score) is off by up to 0.2% there.
    alone = (weights.diagonal(dim1=-2, dim2=-1) > 0.99).view(2, H, 32)
    assert 0 < int(alone.sum()) < 16
    with torch.no_grad():
        got = ours.lsh_attention(q, v, None, 0.0)
    torch.testing.assert_close(got[~alone], expected[~alone], atol=1e-5, rtol=1e-5)
    assert torch.equal(got[alone], v[alone])


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_full_coverage_matches_reformer_pytorch(causal):
    """Our one bucket against its two half-length chunks that see each other: both full shared-QK attention."""
    ours, theirs = _lsh_pair(n=32, bucket_size=32, n_hashes=1, causal=causal)
    theirs.bucket_size = 16
    q, v = torch.randn(2, H, 32, D // H), torch.randn(2, H, 32, D // H)
    expected = theirs(q.flatten(0, 1), v.flatten(0, 1))[0].view_as(v)
    with torch.no_grad():
        torch.testing.assert_close(ours.lsh_attention(q, v, None, 0.0), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_matches_performer_pytorch_with_the_same_features(causal, monkeypatch):
    """Same W copied into its ``projection_matrix``. Its kernel adds ε = 1e-4 to every feature (a blend of uniform
    attention) and its causal form ε = 1e-6 to the denominator only (which shrinks early outputs when its globally
    stabilised key features are small); both are set to 0 here, after which the two differ only in their
    stabilisers, which cancel."""
    library = performer_lib()
    module = __import__("performer_pytorch.performer_pytorch", fromlist=["softmax_kernel"])
    monkeypatch.setattr(module, "softmax_kernel", functools.partial(module.softmax_kernel, eps=0.0))
    torch.manual_seed(0)
    ours = tiny.layer({"kind": "performer", "causal": causal, "options": {"n_features": 16}})
    theirs = library.FastAttention(dim_heads=D // H, nb_features=16, causal=causal)
    theirs.projection_matrix.copy_(ours.features)
    if causal:
        theirs.causal_linear_fn = functools.partial(module.causal_linear_attention_noncuda, eps=0.0)
    q, k, v = (torch.randn(2, H, N, D // H) for _ in range(3))
    favor = ours.causal_favor if causal else ours.favor
    with torch.no_grad():
        got = favor(ours.feature_map(q, True), ours.feature_map(k, False), v)
        torch.testing.assert_close(got, theirs(q, k, v), atol=1e-4, rtol=1e-4)


def test_nystrom_matches_nystrom_attention_with_the_same_weights():
    """Same Q/K/V/O (its projections have no bias), its convolution skip off; one sequence and one head, because
    its pseudo-inverse's starting scale is a maximum over the whole batch and all heads, ours per matrix."""
    library = nystrom_lib()
    torch.manual_seed(0)
    ours = tiny.layer({"kind": "nystrom", "options": {"n_landmarks": 4, "pinv_iterations": 6}}, h=1)
    theirs = library.NystromAttention(dim=D, dim_head=D, heads=1, num_landmarks=4, pinv_iterations=6, residual=False)
    with torch.no_grad():
        for proj in (ours.q_proj, ours.k_proj, ours.v_proj):
            proj.bias.zero_()
        theirs.to_qkv.weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.to_out[0].load_state_dict(ours.out_proj.state_dict())
        x = torch.randn(1, N, D)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-4)
