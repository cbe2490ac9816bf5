"""What the pattern kinds (local, sparse) share (lightning_modules/attention/patterned.py): their engines. FlexAttention
equals the dense engine, and ``auto`` chooses the blocked one on a CPU and wherever Flex cannot run."""

import pytest
import tiny
import torch
from kinds import D, H, N, attention, padding_mask


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
