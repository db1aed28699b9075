"""model.differential (Ye et al. 2025, Differential Transformer) against its definition written out
independently in float64, one query token at a time, as the reference code
(microsoft/unilm Diff-Transformer/multihead_diffattn.py) computes it."""

import math

import pytest
import torch
from conftest import compose

from posbench.config import ModelConfig, config_hash
from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.model.transformer import LanguageModel
from posbench.testing import check_encoding

VOCAB, TRAIN_LEN = 40, 8


def model(encoding: str, chunk: int = 1024, differential: bool = True, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, attn_chunk=chunk, differential=differential)
    net = LanguageModel(cfg, VOCAB, build_encoding({"name": encoding}, LanguageModel.dims(cfg, TRAIN_LEN, VOCAB)))
    if differential:  # gains off their init of ones, so a norm over the wrong dims shows
        with torch.no_grad():
            for block in net.blocks:
                block.attn.subln.weight.uniform_(0.5, 2.0)
    return net.double().eval()


def oracle(net: LanguageModel, x: torch.Tensor) -> torch.Tensor:
    """Head h of layer l, query i: sub-heads 2h and 2h + 1 take the first and second half of the
    head's q and k (their own rotation and bias, the encoding built for twice the heads), each a
    softmax over the keys j <= i of the head's whole value; A1 v - lambda A2 v, RMS-normed over the
    head's dims (eps 1e-5, gain), times 1 - lambda_init, lambda_init = 0.8 - 0.6 exp(-0.3 l)."""
    enc, cfg = net.encoding, net.cfg
    B, T = x.shape
    H, hs = cfg.n_heads, cfg.d_model // cfg.n_heads
    pos = torch.arange(T)
    h = enc.embed(net.tok_emb(x) * net.emb_scale, pos, x)
    for layer, block in enumerate(net.blocks):
        attn = block.attn
        q, k, v = (block.ln1(h) @ attn.qkv.weight.t()).view(B, T, 3, H, hs).unbind(2)  # (B, T, H, hs)
        sub_q = q.reshape(B, T, 2 * H, hs // 2).transpose(1, 2)  # the reference code's view(.., 2 * heads, ..)
        sub_k = k.reshape(B, T, 2 * H, hs // 2).transpose(1, 2)
        sub_q, sub_k = enc.rotate(sub_q, sub_k, pos, layer)
        bias = enc.bias(pos, pos, layer) if "bias" in enc.hooks() else torch.zeros(2 * H, T, T, dtype=q.dtype)
        p = {n: attn.diff[n].detach() for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}
        init = 0.8 - 0.6 * math.exp(-0.3 * layer)
        lam = math.exp(float(p["lambda_q1"] @ p["lambda_k1"])) - math.exp(float(p["lambda_q2"] @ p["lambda_k2"])) + init
        out = torch.zeros(B, T, H, hs, dtype=q.dtype)
        for b in range(B):
            for i in range(T):
                for head in range(H):
                    maps = []
                    for s in (2 * head, 2 * head + 1):
                        logits = [float(sub_q[b, s, i] @ sub_k[b, s, j]) * enc.logit_scale() + float(bias[s, i, j])
                                  for j in range(i + 1)]
                        top = max(logits)
                        w = [math.exp(a - top) for a in logits]
                        maps.append(sum(wj / sum(w) * v[b, j, head] for j, wj in enumerate(w)))
                    o = maps[0] - lam * maps[1]
                    o = o / torch.sqrt((o * o).mean() + 1e-5) * attn.subln.weight
                    out[b, i, head] = o * (1 - init)
        h = h + out.reshape(B, T, cfg.d_model) @ attn.proj.weight.t()
        h = h + block.mlp(block.ln2(h))
    return net.ln_f(h) @ net.tok_emb.weight.t()


@pytest.mark.parametrize("encoding, chunk", [("nope", 1024), ("rope", 1024), ("alibi", 4), ("t5", 1024)])
def test_the_differential_model_computes_the_definition(encoding, chunk):
    """Through the fused kernel (wider values than q and k), ALiBi's Toeplitz slices (chunk 4 <
    T = 12) and T5's single mask."""
    net, x = model(encoding, chunk), torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        got, want = net(x), oracle(net, x)
    assert torch.allclose(got, want, atol=1e-8, rtol=1e-8), (got - want).abs().max()  # fp32 would miss by 1e-6


def test_the_encoding_sees_twice_the_heads_and_lambda_is_learned():
    net = model("alibi")
    assert net.encoding.dims.n_heads == 4 and net.encoding.dims.head_dim == 8  # 2 heads of 16: 4 sub-heads of 8
    assert net.encoding.slopes.numel() == 4  # ALiBi: one slope a sub-head
    x = torch.randint(0, VOCAB, (2, 12))
    net.float().train()
    net(x, x).backward()
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        grad = net.blocks[0].attn.diff[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert not any("diff" in n or "subln" in n for n in model("alibi", differential=False).state_dict())


def test_conformance_and_refusals():
    assert check_encoding("rope", model={"differential": True}, checks=["causality", "kernels", "bf16"])
    assert check_encoding("fox", model={"differential": True}, checks=["causality"])
    with pytest.raises(PosbenchError, match="model.differential=true takes no 'value' hook"):
        model("shaw")
    with pytest.raises(PosbenchError, match=r"an even head dim \(d_model / n_heads = 3 here\)"):
        ModelConfig(d_model=12, n_heads=4, differential=True)
    assert config_hash(compose("model.differential=false")) == "5905295095c6"  # the default job's hash
    assert config_hash(compose("model.differential=true")) != "5905295095c6"
