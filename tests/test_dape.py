"""dape against the reference code's formula (chuanyang-Zheng/DAPE, AliBi_DAPE.forward)."""

import math

import pytest
import torch

from posbench.model.attention import causal_attention
from posbench.encodings import ModelDims, build_encoding
from posbench.errors import PosbenchError

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, train_len=8)


def alibi_matrix(T: int, heads: int) -> torch.Tensor:
    """The reference's ALiBi matrix: -slope * (i - j) below the diagonal, 0 above, slopes
    start * start^h with start = 2^(-2^-(log2(H) - 3)) (heads a power of 2)."""
    start = 2 ** (-(2 ** -(math.log2(heads) - 3)))
    slopes = torch.tensor([start * start ** h for h in range(heads)])
    distance = torch.tril(torch.arange(T)[:, None] - torch.arange(T)[None, :])
    return -distance[None].float() * slopes[:, None, None]


@pytest.mark.parametrize("chunk", [1024, 5])
def test_dape_alibi_is_the_reference_formula(chunk):
    torch.manual_seed(0)
    enc = build_encoding({"name": "dape"}, DIMS)
    with torch.no_grad():
        for p in enc.mlps.parameters():
            p.mul_(3)  # a larger MLP term, so a wrong layer or a missing term shows
    T, layer = 20, 1
    q, k, v = (torch.randn(2, 4, T, 8) for _ in range(3))
    x = q @ k.transpose(-1, -2) / math.sqrt(8)
    a = alibi_matrix(T, 4)
    pairs = torch.cat((x, a.expand_as(x)), dim=1).permute(0, 2, 3, 1)
    scores = x + a + enc.mlps[layer](pairs).permute(0, 3, 1, 2)
    future = torch.ones(T, T).triu(1).bool()
    want = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
    with torch.no_grad():
        got = causal_attention(q, k, v, enc, torch.arange(T), layer, chunk_size=chunk)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_dape_takes_the_papers_bases_only():
    assert build_encoding({"name": "dape", "base": "kerple_log"}, DIMS).base.name == "kerple_log"
    assert sum(p.numel() for p in build_encoding({"name": "dape"}, DIMS).mlps.parameters()) == 2 * (8 * 32 + 32 + 32 * 4 + 4)
    with pytest.raises(PosbenchError, match=r"dape base 't5' is not valid; valid choices: alibi, kerple_log, kerple_power, fire"):
        build_encoding({"name": "dape", "base": "t5"}, DIMS)
