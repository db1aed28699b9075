"""Each encoding's defining property against values computed here from its paper's formula."""

import math

import pytest
import torch

from posbench.attention import causal_attention, reference_attention
from posbench.encodings import REGISTRY, ModelDims, PositionRangeError, build_encoding
from posbench.encodings.bias import alibi_slopes, t5_bucket
from posbench.errors import PosbenchError
from posbench.model import LanguageModel, ModelConfig

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, train_len=16)


def make(name, **params):
    return build_encoding({"name": name, **params}, DIMS)


def test_sinusoidal_matches_vaswani_formula():
    enc = make("sinusoidal")
    x = torch.zeros(1, 50, DIMS.d_model)
    pe = enc.embed(x, torch.arange(50), torch.zeros(1, 50, dtype=torch.long))[0]
    for pos in (0, 1, 7, 49):
        for i in range(DIMS.d_model // 2):
            angle = pos / 10000 ** (2 * i / DIMS.d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_learned_fails_clearly_past_its_table():
    enc = make("learned")
    enc.embed(torch.zeros(1, 16, 32), torch.arange(16), torch.zeros(1, 16, dtype=torch.long))  # fine at its length
    with pytest.raises(PositionRangeError, match="16 entries.*position 63"):
        enc.embed(torch.zeros(1, 64, 32), torch.arange(64), torch.zeros(1, 64, dtype=torch.long))


def test_rope_dot_product_depends_only_on_offset():
    torch.manual_seed(0)
    q0, k0 = torch.randn(8), torch.randn(8)
    T = 40
    q = q0.expand(1, 1, T, 8).clone()
    k = k0.expand(1, 1, T, 8).clone()
    enc4 = build_encoding({"name": "rope"}, ModelDims(32, 4, 2, 16))  # head_dim 8
    qr, kr = enc4.rotate(q, k, torch.arange(T), 0)
    scores = qr[0, 0] @ kr[0, 0].T  # (T, T): q at m, k at n
    for offset in (0, 3, 17):
        diag = torch.diagonal(scores, offset=-offset)  # pairs with m - n = offset
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-4)
    assert not torch.allclose(scores[5, 5], scores[5, 2])  # but it does depend on the offset
    # independent reference: complex rotation of pairs (x_i, x_{i+hs/2}) by m * 10000^(-2i/hs)
    m = 9
    zq = torch.complex(q0[:4], q0[4:]) * torch.polar(torch.ones(4), m * 10000 ** (-torch.arange(0, 8, 2) / 8))
    assert torch.allclose(qr[0, 0, m], torch.cat([zq.real, zq.imag]), atol=1e-5)


def test_alibi_slopes_from_paper():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 12 heads: the 8-head slopes, then every other slope of the 16-head sequence
    expected12 = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected12))


def test_alibi_bias_is_minus_slope_times_distance():
    enc = make("alibi")
    bias = enc.bias(torch.arange(6), torch.arange(6), 0)  # (H, 6, 6)
    slopes = [2.0 ** (-8 / 4 * (h + 1)) for h in range(4)]
    for h in range(4):
        for i in range(6):
            for j in range(i + 1):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h] * (i - j))


def t5_reference(n, num_buckets=32, max_distance=128):
    """T5's unidirectional bucket of a distance n = i - j, straight from the paper's code."""
    n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return n
    return min(num_buckets - 1, exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact)))


def test_t5_buckets_table():
    offsets = [-5, 0, 1, 5, 15, 16, 17, 20, 23, 31, 32, 45, 64, 100, 127, 128, 129, 500, 5000]
    got = t5_bucket(torch.tensor(offsets), 32, 128).tolist()
    assert got == [t5_reference(n) for n in offsets]
    # spot values: exact below 16, log spaced above, capped at 31
    assert got[:3] == [0, 0, 1] and got[5] == 16 and got[-1] == 31 and got[7] == 17


def test_t5_bias_is_shared_table_lookup():
    enc = make("t5")
    bias = enc.bias(torch.arange(40), torch.arange(40), layer=1)
    assert bias.shape == (4, 40, 40)
    assert torch.equal(bias[:, 39, 0], enc.table.weight[t5_reference(39)])
    assert torch.equal(bias, enc.bias(torch.arange(40), torch.arange(40), layer=0))


def test_unknown_encoding_and_option_errors():
    with pytest.raises(PosbenchError, match="unknown encoding 'bogus'; valid choices: .*alibi"):
        make("bogus")
    with pytest.raises(PosbenchError, match="'t5' has no option 'buckets'; its options: num_buckets, max_distance"):
        make("t5", buckets=4)


def tiny_model(name, vocab=64, **model):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, attn_chunk=8, **model)
    return LanguageModel(cfg, vocab, build_encoding({"name": name}, LanguageModel.dims(cfg, 16, vocab))).eval()


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_causality(name):
    """Changing future tokens never changes earlier logits."""
    model = tiny_model(name)
    x = torch.randint(0, 64, (2, 16))
    y = x.clone()
    y[:, 10:] = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-5)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_one_token_embedding_scale_for_every_encoding(name):
    """model.embed_scale: every encoding's embed hook receives the token embeddings times
    sqrt(d_model) (sqrt_d, the default) or times 1 (none), whatever the encoding."""
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(16)
    hidden = {}
    for scale, factor in (("sqrt_d", math.sqrt(32)), ("none", 1.0)):
        model = tiny_model(name, embed_scale=scale)  # the same weights for both settings
        with torch.no_grad():
            x = model.encoding.embed(model.tok_emb(idx) * factor, positions, idx)  # (B, T, D)
            cache = {}
            for layer, block in enumerate(model.blocks):
                x = block(x, model.encoding, positions, layer, cache)
            hidden[scale] = model.hidden(idx)
        assert torch.allclose(hidden[scale], model.ln_f(x), atol=1e-5)
    assert ModelConfig().embed_scale == "sqrt_d"
    # the setting reaches every model; complex alone ignores the token embedding (it replaces it)
    assert torch.allclose(hidden["sqrt_d"], hidden["none"], atol=1e-5) == (name == "complex")


def test_embed_scale_validates():
    with pytest.raises(PosbenchError, match=r"^model.embed_scale='sqrt' is not valid; valid choices: sqrt_d, none$"):
        ModelConfig(embed_scale="sqrt")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_runs_at_four_times_train_length(name):
    model = tiny_model(name)
    x = torch.randint(0, 64, (1, 64))  # train_len 16
    if name == "learned":
        with pytest.raises(PositionRangeError, match="do not extrapolate"):
            model(x)
        return
    with torch.no_grad():
        logits = model(x)
    assert logits.shape == (1, 64, 64) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_chunked_kernel_matches_reference(name):
    """Results do not depend on the kernel: chunked attention == full fp32 attention."""
    enc = build_encoding({"name": name}, DIMS)
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, 37, 8) for _ in range(3))
    pos = torch.arange(37)
    out = causal_attention(q, k, v, enc, pos, 0, chunk_size=10)
    ref = reference_attention(q, k, v, enc, pos, 0)
    assert torch.allclose(out, ref, atol=1e-5)
