"""tape (Zhu et al. 2025, TAPE) against its reference's computation: the whole model recomputed token by
token in float64 in the reference's layout (VITA-Group/TAPE ``adape.py``: per-head cos and sin
tensors of width hs, ``rotate_half``, its einsums), compared with posbench's model through the fused
and the explicit attention kernels; causality; invariance to a shift of every position (the
features' O(2)-equivariance); the reference's initialisation."""

import math

import pytest
import torch
import torch.nn.functional as F

from posbench.config import ModelConfig
from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.model.transformer import LanguageModel

VOCAB, BASE = 32, 10000.0
CFG = ModelConfig(d_model=16, n_layers=3, n_heads=2, d_ff=32)


def tape_model(perturb=True, seed=0, **options):
    torch.manual_seed(seed)
    net = LanguageModel(CFG, VOCAB, build_encoding({"name": "tape", **options}, LanguageModel.dims(CFG, 16, VOCAB)))
    if perturb:  # off the init (W_up = 0 hides the MLP term), and sharper attention, so every term counts
        with torch.no_grad():
            for p in net.encoding.parameters():
                p.add_(0.3 * torch.randn(p.shape))
            for block in net.blocks:
                block.attn.qkv.weight.mul_(8)
    return net.eval()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def reference_forward(net, idx):
    """The model's logits recomputed in float64 as the reference computes TAPE, attention one query
    at a time: position states (cos, sin), each (B, H, T, hs) with cat(freqs, freqs); q' = q cos +
    rotate_half(q) sin; the states attended with the weights of v, scaled by
    ``einsum('bqnd,qe->bqnd', ., W_o)`` and added; after the MLP, the PELayer's
    ``einsum('bqnd,eq->bend')`` (W_up), silu(W_x h) gate and ``einsum('bend,qe->bqnd')`` (W_down)."""
    d = lambda t: t.detach().double()  # noqa: E731
    B, T = idx.shape
    H, D = CFG.n_heads, CFG.d_model
    hs = D // H
    inv_freq = 1.0 / (BASE ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    pos = (emb.cos()[None, None].repeat(B, H, 1, 1), emb.sin()[None, None].repeat(B, H, 1, 1))
    x = d(net.tok_emb.weight)[idx] * net.emb_scale
    for layer, block in enumerate(net.blocks):
        a = F.layer_norm(x, (D,), d(block.ln1.weight), d(block.ln1.bias))
        q, k, v = (a @ d(block.attn.qkv.weight).t()).view(B, T, 3, H, hs).permute(2, 0, 3, 1, 4)
        q, k = q * pos[0] + rotate_half(q) * pos[1], k * pos[0] + rotate_half(k) * pos[1]
        out, att = torch.zeros(B, H, T, hs, dtype=torch.float64), [torch.zeros(B, H, T, hs, dtype=torch.float64)
                                                                    for _ in range(2)]
        for i in range(T):
            w = ((q[:, :, i:i + 1] @ k[:, :, :i + 1].transpose(-2, -1)) / math.sqrt(hs)).softmax(-1)  # (B, H, 1, i+1)
            out[:, :, i] = (w @ v[:, :, :i + 1])[:, :, 0]
            for c in range(2):
                att[c][:, :, i] = (w @ pos[c][:, :, :i + 1])[:, :, 0]
        x = x + out.transpose(1, 2).reshape(B, T, D) @ d(block.attn.proj.weight).t()
        h = F.layer_norm(x, (D,), d(block.ln2.weight), d(block.ln2.bias))
        h = F.gelu(h @ d(block.mlp[0].weight).t() + d(block.mlp[0].bias)) @ d(block.mlp[2].weight).t() \
            + d(block.mlp[2].bias)
        x = x + h
        if layer == len(net.blocks) - 1:
            break
        upd = net.encoding.updates[layer]
        W_o, W_x, W_up, W_down = d(upd.head_mix), d(upd.x_proj), d(upd.up_proj), d(upd.down_proj)
        pos = tuple(torch.einsum("bqnd,qe->bqnd", att[c], W_o) + pos[c] for c in range(2))
        gate = F.silu(h @ W_x.t()).transpose(1, 2).unsqueeze(-1)  # (B, P, T, 1)
        pos = tuple(torch.einsum("bend,qe->bqnd", gate * torch.einsum("bqnd,eq->bend", pos[c], W_up), W_down) + pos[c]
                    for c in range(2))
    x = F.layer_norm(x, (D,), d(net.ln_f.weight), d(net.ln_f.bias))
    return x @ d(net.tok_emb.weight).t()


@pytest.mark.parametrize("grad", [False, True], ids=["fused", "explicit"])
def test_model_matches_the_reference_computation_token_by_token(grad):
    net = tape_model()
    idx = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.set_grad_enabled(grad):
        got = net(idx)
    torch.testing.assert_close(got.double().detach(), reference_forward(net, idx), atol=2e-5, rtol=2e-5)


def test_causal():
    net = tape_model()
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    y = x.clone()
    y[:, 9:] = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(net(x)[:, :9], net(y)[:, :9])


def test_a_shift_of_every_position_changes_nothing_and_a_gap_does():
    """Every update is equivariant to a rotation of each pair's plane, and q'.k' invariant to it: the
    reference's random start offset in training is a no-op; positions with gaps are not a shift."""
    net = tape_model()
    x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        base = net(x)
        torch.testing.assert_close(net(x, positions=torch.arange(12) + 777), base, atol=2e-5, rtol=1e-4)
        assert (net(x, positions=torch.arange(12) * 2) - base).abs().max() > 1e-2


def test_one_update_is_equivariant_to_rotating_the_features():
    enc = tape_model().encoding
    torch.manual_seed(5)
    e, att, h = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 7, 16)
    phi = torch.rand(4) * 6.28  # one angle per pair d

    def turn(f):  # (Re, Im) of every pair times exp(i phi_d)
        re, im = f.chunk(2, dim=-1)
        return torch.cat((re * phi.cos() - im * phi.sin(), re * phi.sin() + im * phi.cos()), dim=-1)
    torch.testing.assert_close(enc.update_features(turn(e), turn(att), h, 0), turn(enc.update_features(e, att, h, 0)))


def test_reference_initialisation_and_options():
    enc = tape_model(perturb=False).encoding
    assert len(enc.updates) == CFG.n_layers - 1 and enc.channels == 4 * CFG.n_heads
    big = build_encoding({"name": "tape"}, LanguageModel.dims(ModelConfig(d_model=256, n_layers=3, n_heads=16), 16))
    for upd in big.updates:  # W_up = 0; W_o, W_x, W_down ~ N(0, 0.02)
        assert torch.equal(upd.up_proj, torch.zeros(64, 16))
        for p in (upd.head_mix, upd.x_proj, upd.down_proj):
            assert abs(p.std().item() - 0.02) < 0.003 and abs(p.mean().item()) < 0.005
    assert build_encoding({"name": "tape", "channels": 5}, enc.dims).updates[0].x_proj.shape == (5, 16)
    with pytest.raises(PosbenchError, match="tape channels must be an integer >= 1"):
        build_encoding({"name": "tape", "channels": 0}, enc.dims)
    assert type(enc).hook_kind() == "features" and enc.reads_positions
