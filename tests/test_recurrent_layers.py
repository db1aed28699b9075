"""model.layers: Gated DeltaNet, Kimi Delta Attention and Mamba-2 layers. The chunked scan against the token-by-token
recurrence, each layer against its definition written out here in float64 one token at a time
(flash-linear-attention's naive gated delta rule; Mamba-2's selective state update), causality,
parameter matching, and the hybrid models' conformance with encodings."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import compose

from posbench.config import ModelConfig, config_hash
from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.model.recurrent import GatedDeltaNet, KimiDeltaAttention, Mamba2, chunk_scan, recurrent_scan
from posbench.model.transformer import LanguageModel
from posbench.testing import check_encoding

VOCAB = 40


def inputs(T, K=6, V=5, seed=0, delta=True):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 3, T, K, generator=g, dtype=torch.float64), torch.randn(2, 3, T, K, generator=g,
                                                                                   dtype=torch.float64)
    k = F.normalize(k, dim=-1)
    v = torch.randn(2, 3, T, V, generator=g, dtype=torch.float64)
    gates = -torch.rand(2, 3, T, generator=g, dtype=torch.float64) * 2  # log gates in [-2, 0]
    beta = torch.rand(2, 3, T, generator=g, dtype=torch.float64) if delta else None
    return q, k, v, gates, beta


@pytest.mark.parametrize("T, chunk, delta", [(37, 8, True), (37, 64, True), (64, 16, True), (37, 8, False),
                                             (5, 4, False)])
def test_chunk_scan_equals_the_recurrence(T, chunk, delta):
    """Ragged last chunks, one chunk longer than T, the delta rule and the plain gated scan."""
    q, k, v, g, beta = inputs(T, delta=delta)
    want, state = recurrent_scan(q, k, v, g, beta)
    got, got_state = chunk_scan(q.float(), k.float(), v.float(), g.float(), None if beta is None else beta.float(),
                                chunk=chunk)
    assert torch.allclose(got.double(), want, atol=2e-5), (got.double() - want).abs().max()
    if T % chunk == 0:  # the state after the last real token (padding keeps it only where none was added)
        assert torch.allclose(got_state.double(), state, atol=2e-5)


def channel_gates(T, K=6, seed=1):
    """Log gates per key channel in [-2, 0] (KDA's), (2, 3, T, K)."""
    return -torch.rand(2, 3, T, K, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2


@pytest.mark.parametrize("T, chunk", [(37, 8), (37, 64), (64, 16), (5, 4), (70, 20), (130, 64)])
def test_chunk_scan_with_a_gate_per_channel_equals_the_recurrence(T, chunk):
    """Kimi Delta Attention's fine-grained decay: the chunk form (sub-blocks of 8: matrix products
    across them, the decays written out within one; a chunk of 20 ends in a sub-block of 4)
    against the recurrence, ragged chunks and a chunk longer than T."""
    q, k, v, _, beta = inputs(T)
    g = channel_gates(T)
    want, state = recurrent_scan(q, k, v, g, beta)
    got, got_state = chunk_scan(q.float(), k.float(), v.float(), g.float(), beta.float(), chunk=chunk)
    assert torch.allclose(got.double(), want, atol=2e-5), (got.double() - want).abs().max()
    exact, _ = chunk_scan(q, k, v, g, beta, chunk=chunk)  # fp64 inputs: an fp64 scan
    assert torch.allclose(exact, want, atol=1e-12)
    if T % chunk == 0:
        assert torch.allclose(got_state.double(), state, atol=2e-5)


def test_the_per_channel_scan_has_the_recurrences_gradients():
    """Training recomputes each chunk's decays in the backward (a checkpoint): the gradients of
    every input equal those through the token-by-token recurrence."""
    q, k, v, _, beta = inputs(37)
    g = channel_gates(37)
    weight = torch.randn(2, 3, 37, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    grads = []
    for fn in (recurrent_scan, lambda *a: chunk_scan(*a, chunk=8)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta)]
        (fn(*leaves)[0] * weight).sum().backward()
        grads.append([t.grad for t in leaves])
    for want, got in zip(*grads):
        assert torch.allclose(got, want, atol=1e-10)


def test_recurrence_with_a_gate_per_channel_against_kdas_rule_written_out():
    """S_t = (I - b_t k_t k_t^T) Diag(a_t) S_{t-1} + b_t k_t v_t^T, o_t = S_t^T q_t (Kimi Linear, eq. 1)."""
    q, k, v, _, beta = inputs(9)
    g = channel_gates(9)
    got, _ = recurrent_scan(q, k, v, g, beta)
    for b in range(2):
        for h in range(3):
            S = torch.zeros(6, 5, dtype=torch.float64)
            for t in range(9):
                kt = k[b, h, t][:, None]
                S = (torch.eye(6, dtype=torch.float64) - beta[b, h, t] * kt @ kt.T) @ torch.diag(g[b, h, t].exp()) @ S \
                    + beta[b, h, t] * kt @ v[b, h, t][None]
                assert torch.allclose(got[b, h, t], S.T @ q[b, h, t], atol=1e-12)


def test_recurrence_against_the_delta_rule_written_out():
    """S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = S_t^T q_t: the paper's form."""
    q, k, v, g, beta = inputs(9)
    got, _ = recurrent_scan(q, k, v, g, beta)
    for b in range(2):
        for h in range(3):
            S = torch.zeros(6, 5, dtype=torch.float64)
            for t in range(9):
                kt = k[b, h, t][:, None]
                S = math.exp(g[b, h, t]) * (torch.eye(6, dtype=torch.float64) - beta[b, h, t] * kt @ kt.T) @ S \
                    + beta[b, h, t] * kt @ v[b, h, t][None]
                assert torch.allclose(got[b, h, t], S.T @ q[b, h, t], atol=1e-12)


def oracle_qkv(layer, x: torch.Tensor):
    """q, k, v (B, T, H, d) of a delta-rule layer from its weights: each projection through the causal
    depthwise convolution (kernel 4) written out, then SiLU."""
    B, T, D = x.shape

    def conv(module, seq):
        w = module.conv.weight[:, 0]  # (C, 4)
        padded = torch.cat([seq.new_zeros(B, 3, seq.shape[-1]), seq], dim=1)
        return F.silu(torch.stack([(padded[:, t:t + 4] * w.T).sum(1) for t in range(T)], dim=1))

    return tuple(conv(c, x @ p.weight.T).view(B, T, layer.heads, -1)
                 for c, p in ((layer.q_conv, layer.q_proj), (layer.k_conv, layer.k_proj), (layer.v_conv, layer.v_proj)))


def gdn_oracle(layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
    """The Gated DeltaNet layer, token by token in float64 from its weights."""
    B, T, D = x.shape
    H, dk, dv = layer.heads, layer.dk, layer.dv
    q, k, v = oracle_qkv(layer, x)
    gate = x @ layer.g_proj.weight.T
    out = torch.zeros(B, T, H * dv, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(dk, dv, dtype=x.dtype)
            for t in range(T):
                qt, kt = q[b, t, h] / q[b, t, h].norm() / math.sqrt(dk), k[b, t, h] / k[b, t, h].norm()
                alpha = math.exp(-math.exp(layer.A_log[h]) * math.log1p(math.exp(x[b, t] @ layer.a_proj.weight[h]
                                                                                  + layer.dt_bias[h])))
                beta = 1 / (1 + math.exp(-(x[b, t] @ layer.b_proj.weight[h])))
                S = alpha * S
                S = S + beta * torch.outer(kt, v[b, t, h] - S.T @ kt)
                o = S.T @ qt
                o = o / torch.sqrt((o * o).mean() + 1e-5) * layer.o_norm.weight
                out[b, t, h * dv:(h + 1) * dv] = o * F.silu(gate[b, t, h * dv:(h + 1) * dv])
    return out @ layer.proj.weight.T


def kda_oracle(layer: KimiDeltaAttention, x: torch.Tensor) -> torch.Tensor:
    """Kimi Delta Attention, token by token in float64 from its weights: alpha_t per key channel,
    exp(-exp(A_log_h) softplus(x W_f1 W_f2 + dt_bias)); the output gate sigmoid(x W_g1 W_g2 + b)."""
    B, T, D = x.shape
    H, dk, dv = layer.heads, layer.dk, layer.dv
    q, k, v = oracle_qkv(layer, x)
    f = (x @ layer.f_proj[0].weight.T) @ layer.f_proj[1].weight.T + layer.dt_bias
    gate = (x @ layer.g_proj[0].weight.T) @ layer.g_proj[1].weight.T + layer.g_proj[1].bias
    out = torch.zeros(B, T, H * dv, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(dk, dv, dtype=x.dtype)
            for t in range(T):
                qt, kt = q[b, t, h] / q[b, t, h].norm() / math.sqrt(dk), k[b, t, h] / k[b, t, h].norm()
                alpha = torch.exp(-math.exp(layer.A_log[h]) * torch.log1p(torch.exp(f[b, t, h * dk:(h + 1) * dk])))
                beta = 1 / (1 + math.exp(-(x[b, t] @ layer.b_proj.weight[h])))
                S = alpha[:, None] * S
                S = S + beta * torch.outer(kt, v[b, t, h] - S.T @ kt)
                o = S.T @ qt
                o = o / torch.sqrt((o * o).mean() + 1e-5) * layer.o_norm.weight
                out[b, t, h * dv:(h + 1) * dv] = o * torch.sigmoid(gate[b, t, h * dv:(h + 1) * dv])
    return out @ layer.proj.weight.T


def mamba_oracle(layer: Mamba2, x: torch.Tensor) -> torch.Tensor:
    """Mamba-2, token by token in float64: h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t."""
    B, T, D = x.shape
    H, P, N, E = layer.heads, layer.headdim, layer.d_state, layer.d_inner
    zxbcdt = x @ layer.in_proj.weight.T
    z, xbc, dt = zxbcdt[..., :E], zxbcdt[..., E:2 * E + 2 * N], zxbcdt[..., 2 * E + 2 * N:]
    w, bias = layer.conv.conv.weight[:, 0], layer.conv.conv.bias
    padded = torch.cat([xbc.new_zeros(B, 3, xbc.shape[-1]), xbc], dim=1)
    xbc = F.silu(torch.stack([(padded[:, t:t + 4] * w.T).sum(1) + bias for t in range(T)], dim=1))
    xs, Bm, Cm = xbc[..., :E], xbc[..., E:E + N], xbc[..., E + N:]
    y = torch.zeros(B, T, E, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            state = torch.zeros(P, N, dtype=x.dtype)
            for t in range(T):
                step = math.log1p(math.exp(dt[b, t, h] + layer.dt_bias[h]))
                xt = xs[b, t, h * P:(h + 1) * P]
                state = math.exp(-step * math.exp(layer.A_log[h])) * state + step * torch.outer(xt, Bm[b, t])
                y[b, t, h * P:(h + 1) * P] = state @ Cm[b, t] + layer.D[h] * xt
    y = y * F.silu(z)
    y = y / torch.sqrt((y * y).mean(-1, keepdim=True) + 1e-5) * layer.norm.weight
    return y @ layer.proj.weight.T


@pytest.mark.parametrize("kind", ["d", "k", "m"])
def test_each_layer_computes_its_definition(kind):
    torch.manual_seed(0)
    layer = {"d": lambda: GatedDeltaNet(32, 4), "k": lambda: KimiDeltaAttention(32, 4),
             "m": lambda: Mamba2(32, headdim=16)}[kind]().double()
    with torch.no_grad():
        for p in layer.parameters():  # every weight off its init, so a term left out shows
            if p.dim() >= 2:
                p.normal_(0, 0.3)
        x = torch.randn(2, 70, 32, dtype=torch.float64)  # two chunks of 64, the second ragged
        got = layer(x)
        want = {"d": gdn_oracle, "k": kda_oracle, "m": mamba_oracle}[kind](layer, x)
    assert torch.allclose(got, want, atol=1e-10), (got - want).abs().max()  # fp64 inputs: an fp64 scan


def hybrid(layers: str, encoding: str = "nope", seed: int = 0, **model) -> LanguageModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layers=4, n_heads=4, d_ff=128, layers=layers, **model)
    return LanguageModel(cfg, VOCAB, build_encoding({"name": encoding}, LanguageModel.dims(cfg, 16, VOCAB))).eval()


def test_layout_parameters_matched_and_causal():
    plain = hybrid("a")
    for layers, kinds in [("ddda", "ddda"), ("kkka", "kkka"), ("ma", "mama"), ("d", "dddd")]:
        net = hybrid(layers)
        assert "".join(b.kind for b in net.blocks) == kinds
        assert abs(net.num_params() / plain.num_params() - 1) < 0.01  # one MLP unit a block at most
        x = torch.randint(0, VOCAB, (2, 80))
        y = x.clone()
        y[:, 50:] = torch.randint(0, VOCAB, (2, 30))
        with torch.no_grad():
            assert torch.allclose(net(x)[:, :50], net(y)[:, :50], atol=1e-5)  # causal across chunks
            assert not torch.allclose(net(x)[:, 50:], net(y)[:, 50:], atol=1e-3)


def test_hybrids_conform_with_encodings():
    for layers, encoding, model in [("ddda", "nope", {}), ("ddda", "rope", {}), ("kkka", "nope", {}),
                                    ("ma", "alibi", {"window": 8})]:
        assert check_encoding(encoding, model={"layers": layers, **model},
                              checks=["causality", "kernels", "bf16", "long"])


def test_config_hash_and_refusals():
    assert config_hash(compose("model.layers=a")) == "5905295095c6"  # the default job's hash from before
    assert config_hash(compose("model.layers=ddda")) != "5905295095c6"
    with pytest.raises(PosbenchError, match=r"model.layers='dxa' is not valid; valid: a pattern of the letters "
                                            r"a \(softmax attention\), d \(Gated DeltaNet\), k \(Kimi Delta "
                                            r"Attention\), m \(Mamba-2\)"):
        ModelConfig(layers="dxa")
    with pytest.raises(PosbenchError, match=r"model.layers='ddda' takes no 'features' hook \(encoding 'tape'\)"):
        hybrid("ddda", "tape")


def test_posbench_check_takes_model_options_alone():
    """`posbench check model.KEY=VALUE`: each check with nope, rope, alibi and fox; a bad option is one line."""
    from conftest import posbench

    out = posbench("check", "model.layers=ma", "model.window=8", "--only", "causality,reads_positions").stdout
    lines = out.splitlines()
    assert [line.split()[:3] for line in lines[:8]] == [["ok", e, c] for e in ("nope", "rope", "alibi", "fox")
                                                        for c in ("causality", "reads_positions")]
    assert lines[-1] == "model.layers=ma model.window=8: 8 of 8 checks passed, with nope, rope, alibi, fox"
    bad = posbench("check", "model.layers=dxa", check=False)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith(
        "posbench: error: model.layers='dxa' is not valid; valid: a pattern of the letters")


def test_inference_time_methods_need_an_attention_layer():
    from posbench.encodings.extension import Extension

    only_deltanet, hybrid_net = hybrid("d", "rope"), hybrid("ddda", "rope")
    with pytest.raises(PosbenchError, match=r"eval.rope_scaling=yarn acts in attention layers; this run's "
                                            r"model.layers=d has none; valid here: eval.rope_scaling=none"):
        only_deltanet.check_method(Extension("none"), "yarn")
    with pytest.raises(PosbenchError, match=r"eval.extension=logn acts in attention layers"):
        only_deltanet.check_method(Extension("logn", train_len=16))
    hybrid_net.check_method(Extension("self_extend", 8, 2, 16), "yarn")  # its attention layer takes both
    with pytest.raises(PosbenchError, match=r"eval.extension=self_extend computes plain softmax attention without "
                                            r"model.sinks; this run has model.sinks=true"):
        hybrid("a", "rope", sinks=True).check_method(Extension("self_extend", 8, 2, 16))


def test_a_plan_times_a_hybrid_by_hybrid_runs_only(tmp_path):
    """Throughput records carry model.layers: a hybrid's plan is never timed by transformers of its name."""
    import json

    from posbench.runs import throughput

    here = throughput.machine("cpu")
    rows = [{"machine": here, "device": "cpu", "model": "tiny", "params": 1, "encoding": "rope", "train_len": 128,
             "precision": "bf16", "tokens_per_s": 100.0},  # a record from before the key: attention only
            {"machine": here, "device": "cpu", "model": "tiny", "params": 1, "layers": "ddda", "encoding": "rope",
             "train_len": 128, "precision": "bf16", "tokens_per_s": 50.0}]
    (tmp_path / throughput.FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert throughput.measured("tiny", "rope", 128, cache_dir=tmp_path) == (100.0, "1 rope run(s)")
    assert throughput.measured("tiny", "rope", 128, cache_dir=tmp_path, layers="ddda") == (
        50.0, "1 rope run(s) of model.layers=ddda")
    assert throughput.measured("tiny", "nope", 128, cache_dir=tmp_path, layers="ddda") == (
        50.0, "1 run(s) of other encodings")
    assert throughput.measured("tiny", "rope", 128, cache_dir=tmp_path, layers="ma") is None  # unknown, not guessed
