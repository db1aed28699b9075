"""Every attention kernel against plain fp32 attention: results must not depend on the kernel.

Kernels (posbench/model/attention.py): explicit (training at short lengths), fused SDPA with a
causal flag or a masked bias, Toeplitz slices of one bias (relative biases past one chunk),
per-chunk biases, explicit chunks (content-dependent scores). Tolerance: 1e-5 absolute in
fp32, 3e-2 under bf16 autocast (bf16 has 8 mantissa bits).
"""

import pytest
import torch
import torch.nn.functional as F

import posbench.model.attention as attention
from posbench.encodings import REGISTRY, ModelDims, build_encoding
from posbench.model.attention import _toeplitz, _toeplitz_slice, causal_attention, masked_bias, reference_attention
from posbench.model.transformer import LanguageModel, ModelConfig

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, train_len=16, vocab_size=64)


def encoding(name, **params):
    torch.manual_seed(0)
    enc = build_encoding({"name": name, **params}, DIMS)
    with torch.no_grad():  # learned parameters away from their init, so every term matters
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return enc


def qkv(T, B=2, seed=1):
    torch.manual_seed(seed)
    return [torch.randn(B, DIMS.n_heads, T, DIMS.head_dim) for _ in range(3)]


def kernel_output(enc, q, k, v, chunk, grad):
    pos = torch.arange(q.shape[2])
    q, k = enc.rotate(q, k, pos, 1)
    with torch.set_grad_enabled(grad):
        return causal_attention(q, k, v, enc, pos, 1, chunk_size=chunk, cache={}), reference_attention(q, k, v, enc, pos, 1)


@pytest.mark.parametrize("name, params", [("alibi", {}), ("t5", {}), ("fire", {}), ("shaw", {}), ("rope", {}),
                                          ("t5", {"per_layer": True})])
def test_kernels_under_bf16_autocast_stay_close_to_fp32(name, params):
    enc = encoding(name, **params)
    q, k, v = qkv(200, B=1)
    pos = torch.arange(200)
    qr, kr = enc.rotate(q, k, pos, 1)
    ref = reference_attention(qr, kr, v, enc, pos, 1)
    for grad, chunk in [(True, 256), (False, 256), (False, 64)]:
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.set_grad_enabled(grad):
            out = causal_attention(qr.bfloat16(), kr.bfloat16(), v.bfloat16(), enc, pos, 1, chunk_size=chunk, cache={})
        torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


def test_fire_is_not_relative_and_would_fail_that_check():
    enc = encoding("fire")
    assert not enc.relative_bias
    q_pos, k_pos = torch.arange(40, 60), torch.arange(0, 60)
    assert not torch.allclose(enc.bias(q_pos + 333, k_pos + 333, 0), enc.bias(q_pos, k_pos, 0))


@pytest.mark.parametrize("T, chunk", [(50, 16), (64, 16), (17, 16)])
def test_toeplitz_slices_equal_the_bias_of_each_chunk(T, chunk, monkeypatch):
    monkeypatch.setattr(attention, "ATTN_BUDGET", 4 * T * 3)  # the table in row blocks of 3
    enc = encoding("t5")
    pos = torch.arange(T)
    table = _toeplitz(enc, pos, 0, chunk, torch.float32)
    assert table.shape == (1, DIMS.n_heads, chunk, T)
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        torch.testing.assert_close(_toeplitz_slice(table, T, s, e), masked_bias(enc, pos[s:e], pos[:e], 0, torch.float32))


def test_chunks_shrink_to_the_memory_budget(monkeypatch):
    """With a budget of 4 rows of keys, the explicit kernel scores 4 queries at a time."""
    seen = []
    score = REGISTRY["shaw"].score

    def spy(self, q, k, *args):
        seen.append(q.shape[2])
        return score(self, q, k, *args)

    monkeypatch.setattr(REGISTRY["shaw"], "score", spy)
    monkeypatch.setattr(attention, "ATTN_BUDGET", 2 * DIMS.n_heads * 30 * 4)  # shaw: pair_cost = n_heads
    out, ref = kernel_output(encoding("shaw"), *qkv(30), 64, False)
    kernel = seen[:-1]  # the last call is the reference's, all 30 queries at once
    assert max(kernel) == 4 and sum(kernel) == 30 and seen[-1] == 30
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["alibi", "t5", "rope", "kerple_log"])
def test_explicit_and_fused_kernels_give_the_same_gradients(name, monkeypatch):
    """Training uses the explicit kernel at short lengths and SDPA otherwise: same gradients
    for q, k, v and the encoding's own parameters."""
    def grads(explicit_max_len):
        monkeypatch.setattr(attention, "EXPLICIT_MAX_LEN", explicit_max_len)
        enc = encoding(name)
        q, k, v = (t.requires_grad_() for t in qkv(40))
        pos = torch.arange(40)
        qr, kr = enc.rotate(q, k, pos, 0)
        out = causal_attention(qr, kr, v, enc, pos, 0, chunk_size=64, cache={})
        out.square().sum().backward()
        return [q.grad, k.grad, v.grad] + [p.grad for p in enc.parameters()]

    explicit, fused = grads(128), grads(0)
    assert len(explicit) == len(fused) and all(g is not None for g in explicit)
    for a, b in zip(explicit, fused):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_token_nll_equals_cross_entropy_of_the_logits():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64)
    model = LanguageModel(cfg, 64, build_encoding({"name": "alibi"}, LanguageModel.dims(cfg, 16, 64))).eval()
    x, y = torch.randint(0, 64, (3, 50)), torch.randint(0, 64, (3, 50))
    with torch.no_grad():
        want = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none").view(3, 50)
        torch.testing.assert_close(model.token_nll(x, y), want)
        torch.testing.assert_close(model.head_nll(model.hidden(x), y, rows=7), want)


@pytest.mark.parametrize("rows", [7, 4096])
def test_fused_output_layer_loss_equals_cross_entropy_with_its_gradients(rows):
    """linear_cross_entropy (training's loss) against F.cross_entropy of the full logits, fp32."""
    from posbench.model.loss import linear_cross_entropy

    torch.manual_seed(0)
    h = torch.randn(3, 20, 16, requires_grad=True)
    w = (0.3 * torch.randn(50, 16)).requires_grad_()
    y = torch.randint(0, 50, (3, 20))
    plain = F.cross_entropy((h @ w.t()).flatten(0, 1), y.flatten())
    grads = torch.autograd.grad(2.5 * plain, (h, w))
    fused = linear_cross_entropy(h, w, y, rows=rows)
    torch.testing.assert_close(fused, plain)
    for got, want in zip(torch.autograd.grad(2.5 * fused, (h, w)), grads):
        torch.testing.assert_close(got, want)


def test_fused_loss_under_bf16_autocast_stays_close_and_trains_a_tied_model():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64)
    model = LanguageModel(cfg, 64, build_encoding({"name": "alibi"}, LanguageModel.dims(cfg, 16, 64)))
    x, y = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = model(x, targets=y)
    fused_grad = torch.autograd.grad(fused, model.tok_emb.weight)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
    plain_grad = torch.autograd.grad(plain, model.tok_emb.weight)[0]
    torch.testing.assert_close(fused, plain, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(fused_grad, plain_grad, atol=2e-3, rtol=5e-2)


def test_the_sdpa_backend_order_for_a_bias_is_checked_before_any_work(tmp_path, monkeypatch):
    """POSBENCH_SDPA_BIAS (posbench.runs.kernels) orders SDPA's backends for a float mask on CUDA;
    a CPU keeps torch's order, and a bad value stops a command before its run dir exists."""
    from conftest import SMOKE, posbench

    from posbench.runs.kernels import sdpa_bias_backends
    from posbench.errors import PosbenchError

    assert sdpa_bias_backends("cudnn")[0] == "CUDNN_ATTENTION" and sdpa_bias_backends("auto") == ()
    assert sdpa_bias_backends("") == () and sdpa_bias_backends("efficient") == ("EFFICIENT_ATTENTION", "MATH")
    with pytest.raises(PosbenchError, match=r"^POSBENCH_SDPA_BIAS='flash' is not valid; valid choices: auto, cudnn, "
                                            r"efficient$"):
        sdpa_bias_backends("flash")
    monkeypatch.setattr(attention, "SDPA_BIAS", sdpa_bias_backends("cudnn"))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    mask = torch.randn(2, 8, 8)
    assert torch.equal(attention.biased_sdpa(q, k, v, mask, 0.5),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5))
    run = tmp_path / "run"
    proc = posbench("train", *SMOKE, f"hydra.run.dir={run}", check=False, env={"POSBENCH_SDPA_BIAS": "cuDNN"})
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        "posbench: error: POSBENCH_SDPA_BIAS='cuDNN' is not valid; valid choices: auto, cudnn, efficient"]
    assert not run.exists()
