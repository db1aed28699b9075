"""fox (the Forgetting Transformer) against its definition, written out pair by pair."""

import math

import pytest
import torch

from posbench.config import ModelConfig
from posbench.encodings import build_encoding
from posbench.model.transformer import LanguageModel
from posbench.model.preflight import train_memory

VOCAB, TRAIN_LEN = 40, 8


def model(chunk=1024, **options) -> LanguageModel:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, attn_chunk=chunk)
    net = LanguageModel(cfg, VOCAB, build_encoding({"name": "fox", **options}, LanguageModel.dims(cfg, TRAIN_LEN, VOCAB)))
    with torch.no_grad():  # gates far from 1/2 and different per head, so a wrong sum or index shows
        for gate in net.encoding.gates:
            gate.weight.normal_(0, 0.5)
            gate.bias.uniform_(-1, 3)
    return net.eval()


def direct_logits(net: LanguageModel, x: torch.Tensor) -> torch.Tensor:
    """The model's forward with every attention logit written out: q_i . k_j / sqrt(hs) plus
    sum_{t=j+1..i} log sigmoid(w_h . x_t + b_h), the paper's D_ij, summed term by term."""
    enc, cfg = net.encoding, net.cfg
    B, T = x.shape
    pos = torch.arange(T)
    H, hs = cfg.n_heads, cfg.d_model // cfg.n_heads
    h = net.tok_emb(x) * net.emb_scale
    for layer, block in enumerate(net.blocks):
        a = block.ln1(h)
        q, k, v = block.attn.qkv(a).view(B, T, 3, H, hs).permute(2, 0, 3, 1, 4)
        q, k = enc.rotate(q, k, pos, layer)
        gate = enc.gates[layer]
        logits = torch.full((B, H, T, T), float("-inf"))
        for i in range(T):
            for j in range(i + 1):
                d = sum(torch.log(torch.sigmoid(a[:, t] @ gate.weight.t() + gate.bias)) for t in range(j + 1, i + 1))
                logits[:, :, i, j] = (q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(hs) + d
        out = logits.softmax(-1) @ v
        h = h + block.attn.proj(out.transpose(1, 2).reshape(B, T, cfg.d_model))
        h = h + block.mlp(block.ln2(h))
    return net.ln_f(h) @ net.tok_emb.weight.t()


@pytest.mark.parametrize("chunk, grad, rope", [(1024, False, False), (8, False, False), (1024, True, False),
                                               (8, False, True)])
def test_the_model_computes_the_forget_gate_definition(chunk, grad, rope):
    """One chunk, query chunks of 8 (SDPA per chunk), training's explicit path, and with RoPE."""
    net, x = model(chunk, rope=rope), torch.randint(0, VOCAB, (2, 3 * TRAIN_LEN))
    with torch.set_grad_enabled(grad):
        got = net(x)
    with torch.no_grad():
        want = direct_logits(net, x)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()


def test_init_is_the_references_and_gates_start_at_one_half():
    enc = build_encoding({"name": "fox"}, LanguageModel.dims(ModelConfig(), 128, VOCAB))
    assert len(enc.gates) == 4 and all((g.bias == 0).all() for g in enc.gates)
    weights = torch.cat([g.weight.flatten() for g in enc.gates])
    assert weights.std().item() == pytest.approx(0.02, rel=0.05)
    x = torch.randn(1, 10, 256) * 0.01  # a small input: every gate near sigmoid(0) = 1/2
    assert torch.allclose(enc.decay(x, 0), torch.full((1, 8, 10), math.log(0.5)), atol=0.01)
    assert enc.hook_kind() == "decay" and not enc.reads_positions
    assert build_encoding({"name": "fox", "rope": True}, enc.dims).reads_positions


def test_the_gates_learn_and_the_preflight_counts_the_decay_mask():
    net = model().train()
    before = [g.weight.detach().clone() for g in net.encoding.gates]
    x = torch.randint(0, VOCAB, (4, TRAIN_LEN + 1))
    net(x[:, :-1], targets=x[:, 1:]).backward()
    assert all(g.weight.grad.abs().sum() > 0 and g.bias.grad.abs().sum() > 0 for g in net.encoding.gates)
    assert all(torch.equal(b, g.weight) for b, g in zip(before, net.encoding.gates))  # no step taken
    plain = LanguageModel(net.cfg, VOCAB, build_encoding({"name": "nope"}, net.encoding.dims))
    fox_mb = train_memory(net, 8, 128, torch.device("cpu"), torch.float32).parts["attention"]
    nope_mb = train_memory(plain, 8, 128, torch.device("cpu"), torch.float32).parts["attention"]
    assert fox_mb == 2 * 8 * 4 * 128 * 128 * 12 and fox_mb > nope_mb  # weights and mask per layer
