"""model.gate (gated attention, Qiu et al. 2025) against its definition written out independently,
in float64, one query token at a time: each head's attention output times sigmoid(x W_g)."""

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


def model(encoding: str, gate: str, chunk: int = 1024, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, attn_chunk=chunk, gate=gate)
    net = LanguageModel(cfg, VOCAB, build_encoding({"name": encoding}, LanguageModel.dims(cfg, TRAIN_LEN, VOCAB)))
    if gate != "none":  # gates far from 1/2, so a gate on the wrong head or dim shows
        with torch.no_grad():
            for block in net.blocks:
                block.attn.gate.weight.normal_(0, 0.5)
    return net.double().eval()


def oracle(net: LanguageModel, x: torch.Tensor) -> torch.Tensor:
    """The gated model's logits, every query token on its own: its softmax over the keys at or
    before it (the encoding's rotation and bias as its own functions give them), the head's output
    times sigmoid of the gate's weights applied to the same token's normed input."""
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
                gate = torch.sigmoid(a[b, i] @ block.attn.gate.weight.t())  # (D,) or (H,)
                for head in range(H):
                    logits = [float(q[b, head, i] @ k[b, head, j]) * enc.logit_scale() + float(bias[head, i, j])
                              for j in range(i + 1)]
                    top = max(logits)
                    weights = [math.exp(s - top) for s in logits]
                    total = sum(weights)
                    o = sum(w / total * v[b, head, j] for j, w in enumerate(weights))
                    g = gate[head * hs:(head + 1) * hs] if gate.numel() == cfg.d_model else gate[head]
                    out[b, i, head] = o * g
        h = h + out.reshape(B, T, cfg.d_model) @ block.attn.proj.weight.t()
        h = h + block.mlp(block.ln2(h))
    return net.ln_f(h) @ net.tok_emb.weight.t()


@pytest.mark.parametrize("encoding, chunk, gate", [("nope", 1024, "elementwise"), ("alibi", 4, "elementwise"),
                                                   ("rope", 1024, "headwise"), ("t5", 4, "headwise")])
def test_the_gated_model_computes_the_definition(encoding, chunk, gate):
    """Through the fused, Toeplitz-slice and single-mask kernels (chunk 4 < T = 12)."""
    net, x = model(encoding, gate, chunk), torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        got, want = net(x), oracle(net, x)
    assert torch.allclose(got, want, atol=1e-8, rtol=1e-8), (got - want).abs().max()  # fp32 would miss by 1e-6
    ungated = model(encoding, "none", chunk)
    with torch.no_grad():
        assert not torch.allclose(got, ungated(x), atol=1e-3)  # the gate changes the model


def test_gate_shapes_and_no_gate_module_in_ungated_models():
    elementwise, headwise, plain = model("alibi", "elementwise"), model("alibi", "headwise"), model("alibi", "none")
    assert elementwise.blocks[0].attn.gate.weight.shape == (32, 32)
    assert headwise.blocks[0].attn.gate.weight.shape == (4, 32)
    assert not any("gate" in name for name in plain.state_dict())  # no module: checkpoints and inits as before


def test_conformance_and_causality_with_a_gate():
    assert check_encoding("rope", model={"gate": "elementwise"}, checks=["causality", "kernels", "bf16"])
    assert check_encoding("alibi", model={"gate": "headwise"}, checks=["causality", "kernels"])


def test_config_hash_and_errors():
    assert config_hash(compose()) == "5905295095c6"  # the default job's hash from before the option
    assert config_hash(compose("model.gate=none")) == "5905295095c6"
    hashes = {config_hash(compose(f"model.gate={g}")) for g in ("headwise", "elementwise")}
    assert len(hashes) == 2 and "5905295095c6" not in hashes
    with pytest.raises(PosbenchError, match=r"model.gate='sigmoid' is not valid; valid choices: none, headwise, "
                                            r"elementwise"):
        ModelConfig(gate="sigmoid")
