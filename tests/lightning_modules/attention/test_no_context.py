"""No context (``kind: no_context``, lightning_modules/attention/no_context.py): the output at a position is blind to
every other token, exactly."""

import pytest
import tiny
import torch
from kinds import N, V, attention, padding_mask


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
