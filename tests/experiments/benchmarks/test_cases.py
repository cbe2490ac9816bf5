"""What the bench compares (experiments/benchmarks/cases.py): every variant's fast order equals its reference order,
the naive baseline computes SDPA's attention, FLOP counts follow the attention formulas, and the sparse variants'
blocks as n grows."""

import pytest
import torch

from experiments.benchmarks import cases
from foundation.errors import ConfigError
from lightning_modules.encoder import TransformerEncoder
from lightning_modules.flops import count_flops

CPU = torch.device("cpu")

SHAPE = cases.Shape(d_model=32, n_heads=4, n_layers=2, d_ff=64, vocab=50, batch=2, dtype=torch.float32, device=CPU)


# ------------------------------------------------------------------------------ what is compared
def _with_random_biases(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()  # a non-zero bias exercises the (E m) bᵀ term of compress_first
    return model.eval()


@pytest.mark.parametrize("variant", list(cases.VARIANTS))
def test_every_variant_fast_order_equals_its_reference_order(variant):
    """The default order (auto: the fastest exact one) and, where it applies, ``compress_first`` give the same
    outputs as Eq. 7 evaluated as written (``project_first``), with and without padding."""
    models = {}
    for order in ("project_first", "auto", "compress_first"):
        torch.manual_seed(0)
        try:
            models[order] = _with_random_biases(
                TransformerEncoder(cases.model_config("model", variant, 4, order, 16, SHAPE), SHAPE.vocab)
            )
        except ConfigError as err:
            assert order == "compress_first" and "order: 'compress_first'" in str(err)  # does not apply here
    ids = torch.randint(5, SHAPE.vocab, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[1, 11:] = False
    reference = models.pop("project_first")
    for model in models.values():
        torch.testing.assert_close(model(ids, mask), reference(ids, mask), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(ids), reference(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_naive_baseline_computes_the_same_attention_as_sdpa(causal):
    torch.manual_seed(0)
    sdpa = (
        TransformerEncoder(cases.model_config("layer", "sdpa", None, "-", 16, SHAPE, causal), SHAPE.vocab)
        .blocks[0]
        .attn
    )
    naive = cases.NaiveAttention(sdpa)
    x = torch.randn(2, 16, SHAPE.d_model)
    torch.testing.assert_close(naive(x), sdpa(x), atol=1e-5, rtol=1e-5)
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[0, 9:] = False
    torch.testing.assert_close(naive(x, mask), sdpa(x, mask), atol=1e-5, rtol=1e-5)


def test_flop_counts_follow_the_attention_formulas():
    """Layer forward, B·(8nd² + 4n²d) for full attention and B·(8nd² + 8nkd) for Eq. 7 as written:
    their ratio is (2d + n)/(2d + 2k), the speed-up a FLOP-bound Linformer can reach."""
    n, k, d, b = 64, 8, SHAPE.d_model, SHAPE.batch
    for variant, expected in (
        ("sdpa", 8 * n * d * d + 4 * n * n * d),
        ("naive", 8 * n * d * d + 4 * n * n * d),
        ("learned", 8 * n * d * d + 8 * n * k * d),
    ):
        case = cases.build("layer", "fwd", variant, k, "project_first", n, SHAPE)
        assert count_flops(case.run)[0] == b * expected, variant
    causal = cases.build("layer", "fwd", "sdpa", None, "-", n, SHAPE, causal=True)
    assert count_flops(causal.run)[0] == b * (8 * n * d * d + 2 * n * n * d)  # the kernel skips the upper half


def test_sparse_block_keeps_its_block_as_n_grows_while_sparse_grows_it_as_root_n():
    """``sparse_block`` measures the fixed pattern at one block (its pairs then grow as n·(k + n/k)); ``sparse``
    follows Child et al.'s l = √n."""
    blocks = {n: cases.VARIANTS["sparse_block"](128, n)["options"]["block"] for n in (4096, 16384)}
    assert blocks == {4096: 128, 16384: 128}
    assert [cases.VARIANTS["sparse"](128, n)["options"]["block"] for n in (4096, 16384)] == [64, 128]
