"""What the bench knows of each attention kind (experiments/benchmarks/variants.py): its tables name registered kinds
and their own variants."""

from experiments.benchmarks import variants
from lightning_modules.attention import ATTENTION_KINDS


def test_the_benchs_tables_of_kinds_name_registered_kinds_and_their_own_variants():
    """``variants.py`` keys its tables by kind: each key is a registered kind, each variant a config of that kind,
    and each library race one of its kind's variants."""
    for kind, offered in variants.BENCH_VARIANTS.items():
        assert kind in ATTENTION_KINDS
        assert {att["kind"] for att in offered(8, 64).values()} == {kind}
    for kind, reference in variants.REFERENCES.items():
        assert reference.variant in variants.BENCH_VARIANTS[kind](8, 64)
        assert reference.attention(64, 8)["kind"] == kind
