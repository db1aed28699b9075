"""cable (Context-aware Biases for Length Extrapolation) against its definition, written out token
by token in float64."""

import math

import pytest
import torch

from posbench.config import ModelConfig
from posbench.encodings import build_encoding
from posbench.model.transformer import LanguageModel

VOCAB, TRAIN_LEN = 40, 8


def model(chunk=1024, **options) -> LanguageModel:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, attn_chunk=chunk)
    net = LanguageModel(cfg, VOCAB, build_encoding({"name": "cable", **options},
                                                   LanguageModel.dims(cfg, TRAIN_LEN, VOCAB)))
    with torch.no_grad():  # biases far from ln 2 and different per head, so a wrong sum, sign or index shows
        for proj in net.encoding.biases:
            proj.weight.normal_(0, 0.5)
            proj.bias.uniform_(-3, 1)
    return net.eval()


def softplus(z: torch.Tensor) -> torch.Tensor:
    return torch.log1p(torch.exp(z))


def direct_logits(net: LanguageModel, x: torch.Tensor, scale_qk: bool = True) -> torch.Tensor:
    """The model's forward in float64 with every attention score written out: q_i . k_j (over
    sqrt(head_dim) unless ``scale_qk`` is False) plus sum_{t=j+1..i} -softplus(w_h . x_t + b_h),
    the reference's b_i - b_j, summed term by term."""
    import copy

    net = copy.deepcopy(net).double()
    enc, cfg = net.encoding, net.cfg
    B, T = x.shape
    H, hs = cfg.n_heads, cfg.d_model // cfg.n_heads
    scale = 1 / math.sqrt(hs) if scale_qk else 1.0
    h = net.tok_emb(x) * net.emb_scale
    for layer, block in enumerate(net.blocks):
        a = block.ln1(h)
        q, k, v = block.attn.qkv(a).view(B, T, 3, H, hs).permute(2, 0, 3, 1, 4)  # (B, H, T, hs)
        proj = enc.biases[layer]
        cost = -softplus(a @ proj.weight.t() + proj.bias)  # (B, T, H)
        scores = torch.full((B, H, T, T), float("-inf"), dtype=torch.float64)
        for i in range(T):
            for j in range(i + 1):
                bias = sum((cost[:, t] for t in range(j + 1, i + 1)), torch.zeros(B, H, dtype=torch.float64))
                scores[:, :, i, j] = (q[:, :, i] * k[:, :, j]).sum(-1) * scale + bias
        out = scores.softmax(-1) @ v
        h = h + block.attn.proj(out.transpose(1, 2).reshape(B, T, cfg.d_model))
        h = h + block.mlp(block.ln2(h))
    return net.ln_f(h) @ net.tok_emb.weight.t()


@pytest.mark.parametrize("chunk, grad, scale_qk", [(1024, False, True), (8, False, True), (1024, True, True),
                                                   (8, False, False)])
def test_the_model_computes_the_context_aware_bias_definition(chunk, grad, scale_qk):
    """One chunk, query chunks of 8 (SDPA per chunk), training's explicit path, and the
    reference's unscaled q . k."""
    net, x = model(chunk, scale_qk=scale_qk), torch.randint(0, VOCAB, (2, 3 * TRAIN_LEN))
    with torch.set_grad_enabled(grad):
        got = net(x).double()
    with torch.no_grad():
        want = direct_logits(net, x, scale_qk)
    assert torch.allclose(got, want, atol=5e-5, rtol=1e-4), (got - want).abs().max()


def test_causal_a_later_token_changes_no_earlier_logit():
    net, x = model(8), torch.randint(0, VOCAB, (2, 3 * TRAIN_LEN))
    y = x.clone()
    y[:, 13:] = (y[:, 13:] + 1) % VOCAB
    with torch.no_grad():
        a, b = net(x), net(y)
    torch.testing.assert_close(a[:, :13], b[:, :13], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(a[:, 13:], b[:, 13:])


def test_init_is_the_references_and_each_token_starts_at_minus_ln_2():
    enc = build_encoding({"name": "cable"}, LanguageModel.dims(ModelConfig(), 128, VOCAB))
    assert len(enc.biases) == 4 and all((p.bias == 0).all() for p in enc.biases)
    weights = torch.cat([p.weight.flatten() for p in enc.biases])
    assert weights.std().item() == pytest.approx(0.02, rel=0.05)
    x = torch.randn(1, 10, 256) * 0.01  # a small input: every term near -softplus(0) = -ln 2
    assert torch.allclose(enc.decay(x, 0), torch.full((1, 8, 10), -math.log(2)), atol=0.01)
    assert enc.hook_kind() == "decay" and not enc.reads_positions
    assert enc.logit_scale() == 32 ** -0.5
    assert build_encoding({"name": "cable", "scale_qk": False}, enc.dims).logit_scale() == 1.0


def test_the_biases_learn():
    net = model().train()
    x = torch.randint(0, VOCAB, (4, TRAIN_LEN + 1))
    net(x[:, :-1], targets=x[:, 1:]).backward()
    assert all(p.weight.grad.abs().sum() > 0 and p.bias.grad.abs().sum() > 0 for p in net.encoding.biases)
