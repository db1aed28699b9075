"""posbench bench: a real (tiny) run of the benchmark, its tables and its errors."""

import importlib.util
import json
import os
import subprocess
import sys

import pandas as pd
import torch
import pytest

from conftest import posbench
from posbench.bench import error_line, flops_per_token, measured, run_child, targets
from posbench.model.build import keep_freed_memory


def test_bench_measures_training_and_evaluation_and_writes_its_tables(tmp_path):
    out = tmp_path / "bench"  # every figure is a process of its own: few of them
    few = ["--train-tokens", "512", "--eval-tokens", "2048"]  # a quick look: 32 windows a step, 16 a pass
    done = posbench("bench", "--encodings", "alibi", "nope+model.length_scaling=ssmax", "--train-lens", "16",
                    "--eval-lens", "128", "--steps", "1", "--no-peer", "--malloc", "posbench", *few, "--out", str(out))
    rows = pd.read_csv(out / "bench.csv")
    assert len(rows) == 2 * (1 + 1) and set(rows.kind) == {"train", "eval"} and set(rows.malloc) == {"posbench"}
    assert (rows.tokens_per_s > 0).all() and (rows.peak_mb > 100).all()  # torch alone is > 100 MB resident
    assert rows.error.isna().all()  # the column is there when no figure failed
    assert (rows.params > 5e6).all()  # the tiny model: 5.25M parameters
    text = (out / "bench.md").read_text()
    assert "| alibi | posbench | 5.25M |" in text
    assert "| nope+model.length_scaling=ssmax | posbench | 5.25M |" in text  # a model option, with an encoding
    assert "every encoding evaluates at 128 tokens under 2 GB peak" in text
    assert "alibi evaluation" not in text  # the 2x-of-rope target is judged at 8,192 tokens only
    assert "512 tokens a step." in text and "2,048 tokens a pass." in text and set(rows.tokens) == {512, 2048}
    assert "wrote" in done.stdout
    # --update re-measures the named encodings and keeps the others' rows; another allocator
    # setting adds rows beside the first setting's
    machine = json.loads((out / "bench.json").read_text())["machine"]
    again = posbench("bench", "--encodings", "alibi", "--train-lens", "--eval-lens", "128", "--no-peer", "--update",
                     "--malloc", "posbench", "system", *few, "--out", str(out))
    assert "matmul 2048^3: not measured" in again.stdout  # the earlier run's machine figures are kept
    assert json.loads((out / "bench.json").read_text())["machine"] == machine
    updated = pd.read_csv(out / "bench.csv")
    assert len(updated) == len(rows) + 1
    merged = updated.set_index(["encoding", "malloc", "kind", "length"]).tokens_per_s
    before = rows.set_index(["encoding", "malloc", "kind", "length"]).tokens_per_s
    ssmax = "nope+model.length_scaling=ssmax"
    assert merged[(ssmax, "posbench", "eval", 128)] == before[(ssmax, "posbench", "eval", 128)]  # kept
    assert merged[("alibi", "posbench", "train", 16)] == before[("alibi", "posbench", "train", 16)]
    assert merged[("alibi", "posbench", "eval", 128)] != before[("alibi", "posbench", "eval", 128)]  # measured again
    assert merged[("alibi", "system", "eval", 128)] > 0
    assert "| alibi | system |" in (out / "bench.md").read_text()


def test_bench_times_the_real_trainer_beside_its_loop_in_waves_each_figure_alone(tmp_path):
    """``--trainer``: ``posbench train`` at the bench's shape (here on a slice of the packaged
    corpus, the entry's overrides passed to both), its tokens/s from its metrics beside the loop's.
    ``--jobs 2`` over the four figures: waves [0, 1] and [2, 3]; no figure's turn begins before
    every child of its wave was ready, no two turns meet, the second wave starts after the first."""
    out = tmp_path / "bench"
    entries = [f"{name}+data.max_docs=24+data.vocab_size=1024" for name in ("alibi", "nope")]
    posbench("bench", "--encodings", *entries, "--train-lens", "16", "--eval-lens", "--steps", "1", "--no-peer",
             "--malloc", "system", "--train-tokens", "256", "--trainer", "--jobs", "2", "--out", str(out))
    rows = pd.read_csv(out / "bench.csv")
    assert list(zip(rows.encoding, rows.impl)) == [(entries[0], "posbench"), (entries[0], "posbench train"),
                                                   (entries[1], "posbench"), (entries[1], "posbench train")]
    assert rows.error.isna().all() and not {"lock", "barrier", "wave", "id"} & set(rows.columns)
    by_impl = rows[rows.encoding == entries[0]].set_index("impl")
    trainer, loop = by_impl.loc["posbench train"], by_impl.loc["posbench"]
    assert trainer.tokens_per_s > 0 and trainer.tokens == 256 and trainer.kind == "train" and trainer.length == 16
    assert 0 < trainer.params < loop.params  # the corpus slice's vocabulary, not the bench's 8192
    text = (out / "bench.md").read_text()
    assert "### The trainer against the bench's loop" in text and "in waves" in text
    assert f"| tiny | {entries[0]} | system | 16 | " in text
    assert f"| {trainer.tokens_per_s / loop.tokens_per_s:.2f} |" in text
    first, second = rows.iloc[:2], rows.iloc[2:]
    assert first.turn_from.min() >= first.ready_at.max()  # the wave was ready before any figure was timed
    for wave in (first, second):
        a, b = sorted(zip(wave.turn_from, wave.turn_to))
        assert a[1] <= b[0]  # one turn after the other
    assert second.ready_at.min() >= first.turn_to.max()  # the next wave began when the first had ended


def test_bench_rejects_an_unknown_encoding_in_one_line(tmp_path):
    done = posbench("bench", "--encodings", "alibi", "nonsense", "--no-peer", "--out", str(tmp_path / "b"), check=False)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "nonsense" in done.stderr and "valid choices" in done.stderr
    assert not (tmp_path / "b").exists()


def test_bench_rejects_fewer_tokens_than_one_window_in_one_line(tmp_path):
    done = posbench("bench", "--encodings", "alibi", "--eval-lens", "128", "4096", "--eval-tokens", "2048", "--no-peer",
                    "--out", str(tmp_path / "b"), check=False)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "--eval-tokens 2048" in done.stderr and "valid: an integer >= 4096" in done.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible (tests/test_gpu.py benches on it)")
def test_bench_on_a_gpu_where_none_is_visible_is_one_line(tmp_path):
    done = posbench("bench", "--device", "cuda", "--no-peer", "--out", str(tmp_path / "b"), check=False)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "no CUDA GPU is visible" in done.stderr and "--device cpu" in done.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.skipif(importlib.util.find_spec("x_transformers") is not None, reason="x-transformers is installed")
def test_bench_without_the_peer_library_says_how_to_get_it(tmp_path):
    done = posbench("bench", "--encodings", "alibi", "--out", str(tmp_path / "b"), check=False)
    assert done.returncode == 2 and '.[bench]' in done.stderr and "--no-peer" in done.stderr


# A child that fails in torch.compile twice: dynamo's backend error, then, while handling it, a
# graph break under fullgraph. Both messages end with dynamo's advice to set TORCHDYNAMO_VERBOSE=1.
DYNAMO_FAILURE = """
import torch

def broken_backend(gm, inputs):
    raise RuntimeError("no kernel for this block mask")

def add_one(x):
    return x + 1

def breaks(x):
    torch._dynamo.graph_break()
    return x + 1

try:
    torch.compile(add_one, backend=broken_backend)(torch.ones(2))
except Exception:
    torch.compile(breaks, fullgraph=True, backend="eager")(torch.ones(2))
"""


def test_a_failed_child_is_recorded_by_its_exceptions_first_line(monkeypatch):
    """Not by stderr's last line, which for a dynamo error is "Set TORCHDYNAMO_VERBOSE=1 ...": the
    child's real stderr, handed to run_child as a child's."""
    failed = subprocess.run([sys.executable, "-c", DYNAMO_FAILURE], capture_output=True, text=True)
    assert failed.returncode == 1 and failed.stderr.strip().splitlines()[-1].startswith("Set TORCHDYNAMO_VERBOSE=1")
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: failed)
    error = run_child({"what": "model"})["error"]  # the last exception, raised while handling the first
    assert error.startswith("torch._dynamo.exc.Unsupported: ") and "graph_break()" in error and "\n" not in error


def test_error_line_joins_a_cause_and_falls_back_without_a_traceback():
    backend = ("Traceback (most recent call last):\n  File \"bench.py\", line 3, in step\n    loss = step(x)\n"
               "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\n"
               "RuntimeError: no kernel for this block mask\nsecond line\n\n"
               "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace\n")
    assert error_line(backend, 1) == ("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised: "
                                      "RuntimeError: no kernel for this block mask")
    plain = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: bad\n'
    assert error_line(plain, 1) == "ValueError: bad"
    assert error_line("loading\nSegmentation fault\n", -11) == "Segmentation fault"
    assert error_line("", -11) == "exit -11"


def test_targets_are_judged_on_the_figures():
    rows = pd.DataFrame([
        {"encoding": "rope", "impl": "posbench", "kind": "eval", "length": 8192, "tokens_per_s": 2000, "seconds": 4.0, "peak_mb": 900},
        {"encoding": "alibi", "impl": "posbench", "kind": "eval", "length": 8192, "tokens_per_s": 1000, "seconds": 8.5, "peak_mb": 2100},
        {"encoding": "t5", "impl": "posbench", "kind": "eval", "length": 8192, "tokens_per_s": 1500, "seconds": 6.0, "peak_mb": 1000},
        {"encoding": "rope", "impl": "posbench", "kind": "train", "length": 128, "tokens_per_s": 7000, "seconds": 1, "peak_mb": 1},
        {"encoding": "rope", "impl": "x-transformers", "kind": "train", "length": 128, "tokens_per_s": 5000, "seconds": 1, "peak_mb": 1},
        {"encoding": "rope", "impl": "x-transformers flash", "kind": "train", "length": 128, "tokens_per_s": 5500, "seconds": 1, "peak_mb": 1},
    ])
    lines = targets(rows.assign(malloc="posbench"))
    assert lines[0].startswith("NOT met: every encoding evaluates at 8,192 tokens under 2 GB") and "alibi 2,100 MB" in lines[0]
    assert any(line.startswith("NOT met: alibi evaluation") and "2.12x" in line for line in lines)
    assert any(line.startswith("met: t5 evaluation") and "1.50x" in line for line in lines)
    # against the faster x-transformers setting: 7000 / 5500 = 1.27 < 1.3
    assert any(line.startswith("NOT met: rope training at T=128") and "1.27x" in line for line in lines)


def test_training_ratios_compare_both_libraries_under_one_allocator_setting():
    def row(impl, malloc, tps):
        return {"encoding": "rope", "impl": impl, "malloc": malloc, "kind": "train", "length": 128,
                "tokens_per_s": tps, "seconds": 1, "peak_mb": 1}
    rows = pd.DataFrame([row("posbench", "posbench", 9000), row("x-transformers", "posbench", 6000),
                         row("posbench", "system", 6600), row("x-transformers", "system", 6000)])
    lines = [line for line in targets(rows) if "training" in line]
    assert lines == ["NOT met: rope training at T=128 >= 1.3x x-transformers, both under malloc=system "
                     "(6,600 vs 6,000 tok/s, 1.10x)",
                     "met: rope training at T=128 >= 1.3x x-transformers, both under malloc=posbench "
                     "(9,000 vs 6,000 tok/s, 1.50x)"]


def test_an_older_bench_json_reads_with_the_allocator_each_row_ran_under():
    old = {"machine": {"peer_malloc": "system"}, "rows": [
        {"encoding": "rope", "impl": "posbench", "kind": "train", "length": 128, "tokens_per_s": 1.0},
        {"encoding": "rope", "impl": "x-transformers", "kind": "train", "length": 128, "tokens_per_s": 1.0}]}
    assert measured(old).malloc.tolist() == ["posbench", "system"]


@pytest.mark.skipif(importlib.util.find_spec("x_transformers") is None, reason="needs the bench extra")
@pytest.mark.parametrize("encoding", ["nope", "rope", "alibi"])
def test_the_peer_has_posbenchs_shape_and_parameter_count(encoding):
    from posbench.bench import _peer_model, _posbench_model

    peer, ours = _peer_model(encoding, flash=False), _posbench_model(encoding, 128, 1024)
    assert abs(sum(p.numel() for p in peer.parameters()) - ours.num_params()) / ours.num_params() < 0.01
    assert peer.attn_layers.attn_dim_head == ours.cfg.d_model // ours.cfg.n_heads


def test_flops_per_token_counts_matmuls_and_causal_attention():
    """Against torch's own count of one training step of the benchmark model (forward and
    backward, the fused output layer included), which computes attention over every (query,
    key) pair: the causal half of that attention term is what flops_per_token charges."""
    from torch.utils.flop_counter import FlopCounterMode

    from posbench.bench import _posbench_model

    T = 128
    model = _posbench_model("nope", T, T)
    x = torch.randint(0, model.vocab_size, (2, T))
    with FlopCounterMode(display=False) as counter:
        model(x, targets=x).backward()
    per_token = counter.get_total_flops() / x.numel()
    full_attention = 12 * model.cfg.n_layers * model.cfg.d_model * T  # QK^T and AV, forward and backward
    assert per_token - full_attention / 2 == flops_per_token(T)


def test_malloc_tuning_applies_on_glibc_and_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("POSBENCH_SYSTEM_MALLOC", "1")
    assert keep_freed_memory() is False
    monkeypatch.delenv("POSBENCH_SYSTEM_MALLOC")
    assert keep_freed_memory() is (os.uname().sysname == "Linux")


def test_bench_measures_another_model_preset(tmp_path):
    """--model reads conf/model/NAME.yaml: model=small's 6 layers of width 512 (23.10M parameters
    with the bench's vocabulary), few tokens so the test is quick."""
    out = tmp_path / "bench"
    posbench("bench", "--model", "small", "--encodings", "alibi", "--train-lens", "16", "--eval-lens",
             "--train-tokens", "32", "--steps", "1", "--no-peer", "--malloc", "system", "--out", str(out))
    rows = pd.read_csv(out / "bench.csv")
    assert len(rows) == 1 and rows.model.tolist() == ["small"] and rows.kind.tolist() == ["train"]
    assert rows.tokens_per_s.iloc[0] > 0 and rows.error.isna().all() and rows.params.iloc[0] == 23_097_344
    text = (out / "bench.md").read_text()
    assert text.startswith("Command: `posbench bench --model small --encodings alibi")
    assert "Model: 6 layers, d_model 512, 8 heads, FFN 2048, vocabulary 8192" in text


def test_mfu_against_hand_computed_figures():
    """model=base at T=512: N = 12 (4 768^2 + 2 768 3072) + 8192 768 = 91,226,112 matmul
    parameters; 6 N + 6 12 768 512 = 575,668,224 FLOPs a token. At a million tokens/s an H100 SXM
    (989.4 TFLOP/s dense bf16) runs at 58.18%; 200,000 tokens/s on an A100 (312) at 36.90%."""
    from posbench.bench import datasheet_tflops, mfu, model_shape

    base = model_shape("base")
    assert flops_per_token(512, base) == 575_668_224
    assert datasheet_tflops("NVIDIA H100 80GB HBM3") == 989.4 and datasheet_tflops("NVIDIA H200") == 989.4
    assert datasheet_tflops("NVIDIA H100 PCIe") == 756.5 and datasheet_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert datasheet_tflops("Tesla T4") is None
    assert mfu(1e6, 512, base, 989.4) == pytest.approx(0.5818357, rel=1e-6)
    assert mfu(2e5, 512, base, 312.0) == pytest.approx(0.3690181, rel=1e-6)
    assert mfu(1e6, 512, base, None) is None and mfu(None, 512, base, 989.4) is None


def gpu_result(device_name, datasheet):
    def row(model, encoding, impl, tps):
        return {"model": model, "encoding": encoding, "impl": impl, "malloc": "system", "kind": "train",
                "length": 512, "tokens": 32768, "tokens_per_s": tps, "seconds": 32768 / tps, "peak_mb": 10240,
                "params": 91_310_000, "compile_s": 60.0, "device": "cuda"}
    # base: 1e6 tokens/s is 58.2% MFU on an H100 SXM; 500,000 is 29.1%
    rows = [row("base", "rope", "posbench", 1e6), row("base", "rope", "x-transformers flash", 8e5),
            row("base", "t5", "posbench", 5e5), row("base", "t5", "x-transformers flash", 6e5),
            row("base", "kerple_log", "posbench", 6e5), row("small", "rope", "posbench", 2e6)]
    machine = {"cpu": device_name, "cores": 16, "device": "cuda", "torch": "2.11", "precision": "bf16",
               "matmul_n": 8192, "float32_gflops": 50e3, "bfloat16_gflops": 700e3, "datasheet_bf16_tflops": datasheet}
    return {"machine": machine, "rows": rows, "kernels": [], "command": "posbench bench --device cuda"}


def test_gpu_tables_give_mfu_beside_the_measured_matmul_fraction_and_judge_the_targets():
    from posbench.bench import tables

    text = tables(gpu_result("NVIDIA H100 80GB HBM3", 989.4))
    assert "datasheet dense bf16 peak of this GPU, 989.4 TFLOP/s" in text
    # rope: 58.2% of 989.4, 82.2% of the measured 700 TFLOP/s; x-t 46.5%; 1.25x
    assert "| rope | 91.31M | 1,000,000 | 58.2% | 82.2% | 10.0 | 60 | 800,000 | 46.5% | 65.8% | 10.0 | 60 | 1.25 |" in text
    assert "| kerple_log | 91.31M | 600,000 | 34.9% |" in text and "none in x-t" in text
    assert "### Training, model=small: 6 layers, d_model 512" in text
    targets = text.split("### Targets")[1]
    assert "- met: rope at model=base, T=512: MFU >= 40% (58.2%)" in targets
    assert "- NOT met: t5 at model=base, T=512: MFU >= 30% (29.1%)" in targets
    assert "- met: kerple_log at model=base, T=512: MFU >= 30% (34.9%)" in targets
    assert "- NOT met: t5 at model=base, T=512 ahead of x-transformers (500,000 vs 600,000 tok/s, 0.83x)" in targets
    assert "- met: rope at model=base, T=512 ahead of x-transformers" in targets


def test_a_gpu_without_a_datasheet_peak_gets_mfu_na_and_says_so():
    from posbench.bench import tables

    text = tables(gpu_result("Tesla T4", None))
    assert "which posbench does not know for a Tesla T4: MFU n/a" in text
    assert "| rope | 91.31M | 1,000,000 | n/a | 82.2% |" in text
    assert "- MFU not judged: no datasheet bf16 peak for a Tesla T4" in text


def test_a_bench_command_names_the_kernel_choices_its_environment_made():
    """bench.md's command leads with POSBENCH_FLEX / POSBENCH_SDPA_BIAS where set: the figures of
    the static biases depend on them, so the command repeats them."""
    from posbench.bench.cli import command_line

    argv = ["--device", "cuda", "--encodings", "alibi", "t5"]
    assert command_line(argv, {}) == "posbench bench --device cuda --encodings alibi t5"
    assert command_line(argv, {"POSBENCH_SDPA_BIAS": "cudnn", "POSBENCH_FLEX": "", "HOME": "/root"}) == \
        "POSBENCH_SDPA_BIAS=cudnn posbench bench --device cuda --encodings alibi t5"
