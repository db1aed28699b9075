"""model.sinks (learned per-head attention sinks, as gpt-oss) against its definition written out
independently, in float64, one query token at a time: exp(s_h) one more term of each softmax's
denominator, with no value."""

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


def model(encoding: str, sinks: bool = True, chunk: int = 1024, window: int = 0, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, attn_chunk=chunk, sinks=sinks, window=window)
    net = LanguageModel(cfg, VOCAB, build_encoding({"name": encoding}, LanguageModel.dims(cfg, TRAIN_LEN, VOCAB)))
    if sinks:  # sinks from far below to far above the logits, so one on the wrong head shows
        with torch.no_grad():
            for block in net.blocks:
                block.attn.sinks.copy_(torch.tensor([-3.0, 0.0, 1.5, 4.0]))
    return net.double().eval()


def oracle(net: LanguageModel, x: torch.Tensor, window: int = 0) -> torch.Tensor:
    """The model's logits, every query on its own: weights exp(l_j) / (sum_j exp(l_j) + exp(s_h))
    over the keys it sees, l_j the scaled logit plus the encoding's bias."""
    enc, cfg = net.encoding, net.cfg
    B, T = x.shape
    H, hs = cfg.n_heads, cfg.d_model // cfg.n_heads
    pos = torch.arange(T)
    h = enc.embed(net.tok_emb(x) * net.emb_scale, pos, x)
    for layer, block in enumerate(net.blocks):
        a = block.ln1(h)
        q, k, v = (a @ block.attn.qkv.weight.t()).view(B, T, 3, H, hs).permute(2, 0, 3, 1, 4)
        q, k = enc.rotate(q, k, pos, layer)
        bias = enc.bias(pos, pos, layer) if "bias" in enc.hooks() else torch.zeros(H, T, T, dtype=q.dtype)
        out = torch.zeros(B, T, H, hs, dtype=q.dtype)
        for b in range(B):
            for i in range(T):
                for head in range(H):
                    seen = [j for j in range(i + 1) if not window or i - j < window]
                    logits = {j: float(q[b, head, i] @ k[b, head, j]) * enc.logit_scale() + float(bias[head, i, j])
                              for j in seen}
                    sink = float(block.attn.sinks[head])
                    top = max([*logits.values(), sink])
                    total = sum(math.exp(s - top) for s in logits.values()) + math.exp(sink - top)
                    out[b, i, head] = sum(math.exp(s - top) / total * v[b, head, j] for j, s in logits.items())
        h = h + out.reshape(B, T, cfg.d_model) @ block.attn.proj.weight.t()
        h = h + block.mlp(block.ln2(h))
    return net.ln_f(h) @ net.tok_emb.weight.t()


@pytest.mark.parametrize("encoding, chunk, window", [("nope", 1024, 0), ("alibi", 4, 0), ("rope", 5, 3),
                                                     ("t5", 1024, 0)])
def test_the_model_with_sinks_computes_the_definition(encoding, chunk, window):
    """Query chunks of 4 and 5 (T = 12) and one chunk of all; a window of 3."""
    net, x = model(encoding, chunk=chunk, window=window), torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        got, want = net(x), oracle(net, x, window)
    assert torch.allclose(got, want, atol=1e-8, rtol=1e-8), (got - want).abs().max()
    plain = model(encoding, sinks=False, chunk=chunk, window=window)
    with torch.no_grad():
        assert not torch.allclose(got, plain(x), atol=1e-3)  # the sinks change the model


def test_a_sink_far_below_the_logits_is_plain_softmax():
    net, plain = model("rope"), model("rope", sinks=False)
    net.load_state_dict(plain.state_dict(), strict=False)  # the same weights; only the sinks differ
    with torch.no_grad():
        for block in net.blocks:
            block.attn.sinks.fill_(-1e4)
    x = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        assert torch.allclose(net(x), plain(x), atol=1e-10)


def test_sink_shape_init_and_no_parameter_in_plain_models():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, sinks=True, differential=True)
    net = LanguageModel(cfg, VOCAB, build_encoding({"name": "rope"}, LanguageModel.dims(cfg, TRAIN_LEN, VOCAB)))
    sinks = net.blocks[0].attn.sinks
    assert sinks.shape == (8,)  # one per softmax map: differential attention's sub-heads
    assert 0 < sinks.abs().max() < 0.1  # N(0, 0.02), left as drawn by the GPT-2 init
    assert not any("sinks" in name for name in model("rope", sinks=False).state_dict())


def test_conformance_with_sinks():
    assert check_encoding("rope", model={"sinks": True}, checks=["causality", "kernels", "bf16", "long"])
    assert check_encoding("fox", model={"sinks": True}, checks=["causality", "kernels"])  # a decay beside the sink


def test_config_hash_and_refusals():
    assert config_hash(compose("model.sinks=false")) == "5905295095c6"  # the default job's hash from before
    assert config_hash(compose("model.sinks=true")) != "5905295095c6"
    with pytest.raises(PosbenchError, match=r"model.sinks=true takes no 'normalize' hook \(encoding 'stickbreaking'\)"):
        model("stickbreaking")
