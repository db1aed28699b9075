"""posbench.testing: every built-in encoding passes the checks a plugin author runs, and each
check fails on an encoding that breaks what it checks."""

import pytest
import torch
from torch import nn

from posbench.encodings import REGISTRY, PositionEncoding
from posbench.errors import PosbenchError
from posbench.testing import CHECKS, ConformanceError, check_encoding


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_builtin_encoding_conforms(name, check):
    threads = torch.get_num_threads()
    if name == "rnn" and check == "long":  # 2048 sequential small steps: a second thread only adds barrier waits
        torch.set_num_threads(1)
    try:
        assert check_encoding(name, checks=[check]) == [check]
    finally:
        torch.set_num_threads(threads)


def test_options_reach_the_encoding():
    """A variant is checked with its own options: t5 with a table per layer, whose instance
    withdraws the class's layer_invariant_bias claim."""
    assert check_encoding("t5", {"per_layer": True}, checks=["layer_invariant", "kernels"])
    with pytest.raises(PosbenchError, match="'t5' has no option 'per_leyer'; its options: num_buckets"):
        check_encoding("t5", {"per_leyer": True}, checks=["causality"])


# ---- each check catches what it is for ---------------------------------------------------------

class Slopes(PositionEncoding):
    """-s_h (i - j): a relative bias that is the same in every layer (claims nothing)."""

    def __init__(self, dims):
        super().__init__(dims)
        self.slopes = nn.Parameter(torch.linspace(0.1, 1.0, dims.n_heads))

    def bias(self, q_pos, k_pos, layer):
        return -self.slopes[:, None, None] * (q_pos[:, None] - k_pos[None, :]).float()


class PerLayerSlopes(Slopes):
    """A different bias in every layer that claims to be layer invariant."""

    layer_invariant_bias = True

    def bias(self, q_pos, k_pos, layer):
        return (1 + layer) * super().bias(q_pos, k_pos, layer)


class AbsoluteClaimsRelative(Slopes):
    """Depends on the key's position itself, yet claims relative_bias."""

    relative_bias = True

    def bias(self, q_pos, k_pos, layer):
        return super().bias(q_pos, k_pos, layer) + 0.01 * k_pos.float()[None, None, :]


class PeeksAhead(PositionEncoding):
    """Adds the mean of every token embedding, future ones included, to each position."""

    def embed(self, x, positions, tokens):
        return x + x.mean(dim=1, keepdim=True)


class SaysItReadsNoPositions(Slopes):
    reads_positions = False


class DeadParameter(Slopes):
    def __init__(self, dims):
        super().__init__(dims)
        self.unused = nn.Parameter(torch.zeros(3))


class FullTable(Slopes):
    """Builds the whole (H, T, T) table at every call, whatever the query chunk."""

    relative_bias = True

    def bias(self, q_pos, k_pos, layer):
        full = -self.slopes[:, None, None] * (k_pos[:, None] - k_pos[None, :]).float()  # (H, Tk, Tk)
        return full[:, torch.searchsorted(k_pos, q_pos)]


@pytest.mark.parametrize("cls, check, match", [
    (PeeksAhead, "causality", "a query sees keys after it"),
    (PerLayerSlopes, "layer_invariant", "claims layer_invariant_bias"),
    (AbsoluteClaimsRelative, "relative", "claims relative_bias"),
    (SaysItReadsNoPositions, "reads_positions", "says reads_positions = False, but gapped positions change"),
    (DeadParameter, "bf16", "parameter 'unused' gets no finite non-zero gradient"),
    (FullTable, "long", "over the chunked bound"),
])
def test_each_check_fails_an_encoding_that_breaks_it(cls, check, match):
    check_encoding(Slopes, checks=list(CHECKS))  # the honest parent passes everything
    with pytest.raises(ConformanceError, match=match):
        check_encoding(cls, checks=[check])


def test_the_safe_default_of_a_flag_is_right_even_when_untrue():
    """Not claiming a property costs speed only: a per-layer bias without the flag passes."""
    class Honest(PerLayerSlopes):
        layer_invariant_bias = False

    check_encoding(Honest, checks=["layer_invariant", "kernels", "causality"])


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(PosbenchError, match="unknown check 'speed'; valid choices: causality, kernels"):
        check_encoding("alibi", checks=["speed"])
    with pytest.raises(PosbenchError, match="not a subclass of posbench.encodings.PositionEncoding"):
        check_encoding(nn.Linear)
    with pytest.raises(PosbenchError, match="needs module 'no_such_module'"):
        check_encoding("no_such_module:Encoding")
    with pytest.raises(PosbenchError, match="unknown encoding 'bogus'; valid choices: .*alibi"):
        check_encoding("bogus")
