"""GPU paths: run where a CUDA GPU is visible, skipped (not failed) elsewhere."""

import pandas as pd
import pytest
import torch

from conftest import SMOKE, posbench
from posbench.model.attention import causal_attention, reference_attention
from posbench.model.build import autocast_dtype, resolve_device
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


def test_bench_measures_on_the_gpu(tmp_path):
    out = tmp_path / "bench"
    posbench("bench", "--device", "cuda", "--encodings", "alibi", "rope", "--train-lens", "64", "--eval-lens", "1024",
             "--steps", "2", "--no-peer", "--out", str(out))
    rows = pd.read_csv(out / "bench.csv")
    assert len(rows) == 4 and (rows.device == "cuda").all() and set(rows.malloc) == {"system"}
    assert (rows.tokens_per_s > 0).all() and (rows.peak_mb > 0).all() and rows.error.isna().all()
    assert "Machine: GPU " in (out / "bench.md").read_text()
