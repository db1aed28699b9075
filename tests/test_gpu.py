"""GPU paths: run where a CUDA GPU is visible, skipped (not failed) elsewhere."""

import pandas as pd
import pytest
import torch

from conftest import SMOKE, compose, posbench
from posbench.model import attention
from posbench.model.attention import causal_attention, reference_attention
from posbench.model.build import autocast_dtype, build_model, resolve_device
from posbench.encodings import REGISTRY, ModelDims, build_encoding

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_auto_picks_the_gpu_and_bf16():
    device = resolve_device("auto")
    assert device.type == "cuda"
    assert autocast_dtype(device, "auto") == (torch.bfloat16 if torch.cuda.is_bf16_supported() else None)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_kernels_on_gpu_match_the_reference(name):
    dims = ModelDims(d_model=64, n_heads=4, n_layers=1, train_len=64)
    enc = build_encoding({"name": name}, dims).cuda()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 96, 16, device="cuda") for _ in range(3))
    positions = torch.arange(96, device="cuda")
    q, k = enc.rotate(q, k, positions, 0)
    out = causal_attention(q, k, v, enc, positions, 0, chunk_size=32)
    torch.testing.assert_close(out.float(), reference_attention(q, k, v, enc, positions), rtol=2e-3, atol=2e-3)


def test_train_and_evaluate_on_gpu(tmp_path):
    posbench("train", *[a for a in SMOKE if not a.startswith("device")], "device=cuda", f"hydra.run.dir={tmp_path}")
    rows = pd.read_csv(tmp_path / "results.csv")
    assert (rows.status == "ok").all() and rows.ppl.between(1, 1024).all()


@pytest.mark.parametrize("backends", ["cudnn", "efficient"])
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple_log"])
def test_a_bias_through_each_sdpa_backend_order_matches_torchs_own(name, backends, monkeypatch):
    """POSBENCH_SDPA_BIAS=cudnn or efficient (posbench.runs.kernels): the same attention output and
    gradients as torch's own backend order, for static biases in one chunk and in query chunks."""
    from posbench.runs.kernels import sdpa_bias_backends

    dims = ModelDims(d_model=128, n_heads=4, n_layers=1, train_len=256)
    enc = build_encoding({"name": name}, dims).cuda()
    positions = torch.arange(256, device="cuda")
    outs = []
    for order in ((), sdpa_bias_backends(backends)):
        monkeypatch.setattr(attention, "SDPA_BIAS", order)
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 4, 256, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        for chunk in (1024, 64):
            out = causal_attention(q, k, v, enc, positions, 0, chunk_size=chunk)
            out.float().square().sum().backward()
            outs.append((out.detach().float(), q.grad.float().clone()))
            q.grad = None
    for (a, ga), (b, gb) in zip(outs[:2], outs[2:]):
        torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(gb, ga, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_steps_replayed_as_cuda_graphs_train_as_eager_and_say_so(encoding, tmp_path):
    """train.compile=graphs (reduce-overhead): the same run's logged losses as eager steps, within
    bf16 kernels' rounding, and its rows name the mode (outside the config hash)."""
    from posbench.report.collect import read_metrics

    base = [a for a in SMOKE if not a.startswith("device")] + ["device=cuda", f"encoding={encoding}",
                                                               "train.log_every=1"]
    losses = {}
    for mode in ("false", "graphs"):
        run = tmp_path / mode
        posbench("train", *base, f"train.compile={mode}", f"hydra.run.dir={run}")
        losses[mode] = read_metrics(run).loss.tolist()
        rows = pd.read_csv(run / "results.csv")
        assert set(rows.execution) == {"cuda bf16 " + ("graphs" if mode == "graphs" else "eager")}
    assert len(losses["graphs"]) == len(losses["false"]) > 1
    for eager, graphed in zip(losses["false"][:5], losses["graphs"][:5]):  # early steps, before chaos compounds
        assert graphed == pytest.approx(eager, rel=2e-2)


@pytest.mark.parametrize("method", ["self_extend", "rerope", "logn"])
@pytest.mark.parametrize("fused", [True, False], ids=["two fused attentions", "query chunks"])
def test_training_free_extensions_on_gpu_match_the_cpu(method, fused):
    from posbench.encodings.extension import Extension, extended_attention

    ext = Extension(method, None if method == "logn" else 16, 4 if method == "self_extend" else None, 32)
    inv_freq = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 100, 16) for _ in range(3))
    cpu = extended_attention(q, k, v, inv_freq, ext, scaling=0.25, chunk=32, fused=fused)
    gpu = extended_attention(q.cuda(), k.cuda(), v.cuda(), inv_freq.cuda(), ext, scaling=0.25, chunk=32, fused=fused)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-4)


def count_flex_calls(monkeypatch) -> list:
    """A list that gains an item at each call of ``attention.flex_causal`` (also inside a compiled
    model, where dynamo replays the append)."""
    calls, flex_causal = [], attention.flex_causal
    monkeypatch.setattr(attention, "flex_causal", lambda *a, **k: calls.append(1) or flex_causal(*a, **k))
    return calls


FLEX_CASES = [("t5", {}), ("kerple_log", {}), ("alibi", {}), ("t5", {"per_layer": True})]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name, params", FLEX_CASES, ids=["t5", "kerple_log", "alibi", "t5-per_layer"])
def test_flex_on_gpu_matches_todays_path_forward_and_gradients(name, params, dtype, monkeypatch):
    """Compiled flex attention (relative biases on CUDA with ``POSBENCH_FLEX=1``) against the SDPA
    paths (Toeplitz slices past one chunk, per-chunk biases per layer), at a length that is no
    multiple of flex's 128-token blocks: outputs and the gradients of q, k, v and of the
    encoding's parameters, which reach T5's and KERPLE's tables through flex's captured-tensor
    gradients."""
    calls = count_flex_calls(monkeypatch)
    dims = ModelDims(d_model=64, n_heads=4, n_layers=2, train_len=64)
    results = []
    for flex in (True, False):  # True: POSBENCH_FLEX=1; False: the SDPA paths
        monkeypatch.setattr(attention, "FLEX", flex)
        torch.manual_seed(0)
        enc = build_encoding({"name": name, **params}, dims).cuda()
        with torch.no_grad():
            for p in enc.parameters():
                p.add_(0.1 * torch.randn_like(p))
        q, k, v = (torch.randn(2, 4, 300, 16, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        out = causal_attention(q, k, v, enc, torch.arange(300, device="cuda"), 1, chunk_size=128,
                               cache={"contiguous": True})
        (out.float() * torch.linspace(-1, 1, 16, device="cuda")).sum().backward()
        grads = {"q": q.grad, "k": k.grad, "v": v.grad} | {n: p.grad for n, p in enc.named_parameters()
                                                           if p.grad is not None}
        results.append((out.float(), grads))
    assert len(calls) == 1  # the first pass only
    (out, grads), (ref, ref_grads) = results
    assert grads.keys() == ref_grads.keys()
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        for key in grads:
            torch.testing.assert_close(grads[key].float(), ref_grads[key].float(), rtol=1e-3, atol=1e-3,
                                       msg=lambda m, key=key: f"{key}: {m}")
    else:  # bf16 inputs; the SDPA path adds a bf16 bias, flex an fp32 one: compare by norms
        assert (out - ref).norm() <= 0.02 * ref.norm()
        for key in grads:
            a, b = grads[key].float(), ref_grads[key].float()
            assert (a - b).norm() <= 0.05 * b.norm(), key


def test_a_compiled_model_trains_through_flex_on_gpu_as_eager_sdpa(monkeypatch):
    """The whole model under torch.compile with flex attention inside (a T5 table per forward
    pass, its gradient through the compiled flex backward) against eager SDPA: loss and every
    gradient, under bf16 autocast; flex attention is asked for (``POSBENCH_FLEX=1``) and seen called
    inside the compiled model."""
    calls = count_flex_calls(monkeypatch)
    torch._dynamo.reset()
    cfg = compose("encoding=t5", "device=cuda", "model.n_layers=2", "model.d_model=64", "model.n_heads=4",
                  "model.d_ff=128")
    x, y = torch.randint(0, 512, (2, 4, 256), device="cuda")
    results = []
    for flex in (True, False):
        monkeypatch.setattr(attention, "FLEX", flex)
        torch.manual_seed(0)
        model = build_model(cfg, 512).cuda()
        net = torch.compile(model) if flex else model
        with torch.autocast("cuda", torch.bfloat16):
            loss = net(x, targets=y)
        loss.backward()
        results.append((loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}))
        if flex:  # the eager pass below runs the SDPA paths only
            assert calls, "flex attention was not called inside the compiled model"
            calls.clear()
    assert not calls
    (loss, grads), (ref_loss, ref_grads) = results
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-2)
    assert grads.keys() == ref_grads.keys() and "encoding.table.weight" in grads
    for name in grads:
        assert (grads[name] - ref_grads[name]).norm() <= 0.05 * ref_grads[name].norm() + 1e-6, name
    torch._dynamo.reset()


@pytest.mark.parametrize("encoding", ["rope", "alibi", "t5", "nope", "fox", "learned"])
def test_a_training_step_on_the_gpu_never_waits_for_it(encoding, tmp_path):
    """CUDA trains with the fused AdamW and reads the step's checks late (loop.DeferredCheck), the
    position ends noted on the host (posbench.encodings.span): torch's sync debug mode makes any
    synchronising call inside the steps an error."""
    from posbench.train import loop
    from posbench.train.configure import train_config

    s = loop.setup(train_config(compose(*[a for a in SMOKE if not a.startswith("device")], "device=cuda",
                                        f"encoding={encoding}")), tmp_path)
    assert s.state.optimizer.defaults["fused"] and isinstance(s.check, loop.DeferredCheck)
    s.state.batches = loop.Prefetcher(s.state.sampler, pin_memory=True)
    try:
        batches = [s.state.batches() for _ in range(3)]
        loop.train_step(s, *batches[0])  # the first step: the kernels' one-time setup
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for batch in batches[1:]:
                loop.train_step(s, *batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        s.check.settle()
    finally:
        s.state.batches.close()


def test_bench_measures_on_the_gpu(tmp_path):
    out = tmp_path / "bench"
    posbench("bench", "--device", "cuda", "--encodings", "alibi", "rope", "--train-lens", "64", "--eval-lens", "1024",
             "--steps", "2", "--no-peer", "--no-compile", "--out", str(out))
    rows = pd.read_csv(out / "bench.csv")
    assert len(rows) == 4 and (rows.device == "cuda").all() and set(rows.malloc) == {"system"}
    assert (rows.tokens_per_s > 0).all() and (rows.peak_mb > 0).all() and rows.error.isna().all()
    assert "Machine: GPU " in (out / "bench.md").read_text()


def test_bench_compiles_side_by_side_and_reports_mfu_on_the_gpu(tmp_path):
    out = tmp_path / "bench"
    posbench("bench", "--device", "cuda", "--encodings", "t5", "nope", "--train-tokens", "4096", "--steps", "3",
             "--jobs", "2", "--no-peer", "--out", str(out))
    rows = pd.read_csv(out / "bench.csv")
    assert len(rows) == 2 and set(rows.kind) == {"train"} and set(rows.length) == {512} and rows.error.isna().all()
    assert (rows.compile_s > 0).all() and (rows.tokens == 4096).all()
    text = (out / "bench.md").read_text()
    assert text.startswith("Command: `posbench bench --device cuda") and "| t5 | 5.25M |" in text


@pytest.mark.parametrize("delta", [True, False, "channels"])
def test_flash_linear_attention_kernels_equal_the_plain_scan(delta):
    """POSBENCH_FLA=1's kernels (Gated DeltaNet's delta rule; Mamba-2's scan as simple GLA; Kimi
    Delta Attention's per-channel gates, ``channels``) against posbench.model.recurrent.chunk_scan,
    on the GPU, in fp32."""
    pytest.importorskip("fla")
    from posbench.model.recurrent import chunk_scan, fla_scan

    g = torch.Generator(device="cuda").manual_seed(0)
    B, H, T, K, V = 2, 3, 200, 64, 128
    q = torch.nn.functional.normalize(torch.randn(B, H, T, K, device="cuda", generator=g), dim=-1) / K ** 0.5
    k = torch.nn.functional.normalize(torch.randn(B, H, T, K, device="cuda", generator=g), dim=-1)
    v = torch.randn(B, H, T, V, device="cuda", generator=g)
    gates = -torch.rand(B, H, T, *([K] if delta == "channels" else []), device="cuda", generator=g)
    beta = torch.rand(B, H, T, device="cuda", generator=g) if delta else None
    want, want_state = chunk_scan(q, k, v, gates, beta)
    got, got_state = fla_scan(q, k, v, gates, beta)
    torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(got_state.float(), want_state, rtol=2e-3, atol=2e-3)
