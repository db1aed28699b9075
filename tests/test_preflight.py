"""The preflight's memory estimate against peaks measured in fresh processes, and the refusal of a
job that cannot fit (posbench.model.preflight)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import SMOKE, posbench

# `python -c MEASURE train|eval T n overrides...`: in a fresh process, build the model of the
# composed config (vocabulary 8192), run two training steps of n windows of T tokens (or two
# evaluation passes over n tokens per forward pass at length T) as posbench does, and print the
# peak resident memory above the process's memory before the model, beside the estimate.
MEASURE = r'''
import json, math, os, sys
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from posbench import bench
from posbench.model import preflight
from posbench.model.build import autocast, autocast_dtype, build_model, keep_freed_memory
from posbench.config import conf_dir
from posbench.config import TrainConfig, typed
from posbench.train.optim import make_optimizer

kind, T, n, *overrides = sys.argv[1:]
T, n, V = int(T), int(n), 8192
keep_freed_memory()
OmegaConf.register_new_resolver("run_name", lambda o: o or "default")
with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
    cfg = compose(config_name="app_train", overrides=[f"train.train_len={min(T, 1024)}", *overrides])
device = torch.device("cpu")
dtype = autocast_dtype(device, "auto")
before = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
model = build_model(cfg, V)
if kind == "train":
    x = torch.randint(0, V, (n, T))
    estimate = preflight.train_memory(model, n, T, device, dtype)
    optimizer = make_optimizer(model, typed(TrainConfig, cfg.train, "train"))
    for _ in range(2):
        with autocast(device, dtype):
            loss = model(x, targets=x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
else:
    x = torch.randint(0, V, (max(1, n // T), T))
    estimate = preflight.eval_memory(model, [T], n, n, device, dtype)
    model.eval()
    with torch.no_grad(), autocast(device, dtype):
        for _ in range(2):
            model.head_nll(model.hidden(x), x)
peak = bench.peak_rss_mb() * 2**20  # not ru_maxrss: it holds the parent's size at fork
print(json.dumps({"measured": peak - before, "estimate": estimate.total}))
'''

# (train or eval, length, windows or tokens per pass, encoding): each kernel family once
SHAPES = [("train", 128, 16, "alibi"),  # explicit attention (short CPU training windows), a bias
          ("train", 512, 8, "rope"),  # fused attention
          ("train", 512, 4, "t5"),  # a bias with parameters: SDPA's math path
          ("train", 256, 4, "shaw"),  # content-dependent scores, explicit chunks
          ("eval", 2048, 16384, "alibi"),  # Toeplitz slices
          ("eval", 2048, 16384, "shaw"),  # chunked scores (the ratio measured 1.03-1.5 here, and
          # up to 1.65 at 8,192 tokens a pass; alibi's once 2.02 there: both keep the default pass)
          ("train", 512, 8, "rope model.layers=ddda"),  # Gated DeltaNet's chunked scans, kept for the backward
          ("train", 512, 8, "nope model.layers=kkka"),  # KDA's per-channel decays within sub-blocks
          ("train", 512, 4, "alibi model.sinks=true"),  # learned sinks: explicit chunks
          ("eval", 2048, 16384, "rope model.layers=ma")]  # Mamba-2's scans at 16x


@pytest.mark.parametrize("kind, length, n, encoding", SHAPES)
def test_estimate_is_within_a_factor_of_two_of_the_measured_peak(kind, length, n, encoding):
    """The job's peak is the most it can take, and one process's peak varies from run to run of
    the same job (alibi's evaluation at 2,048: 569, 753 and 1,023 MB in three runs in a row on one
    machine): where a measurement falls short of half the estimate, up to two more are taken and
    the largest peak kept."""
    def measure() -> dict:
        name, *options = encoding.split()
        proc = subprocess.run([sys.executable, "-c", MEASURE, kind, str(length), str(n), f"encoding={name}", *options],
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    result = measure()
    for _ in range(2):
        if result["estimate"] / result["measured"] <= 2:
            break
        result["measured"] = max(result["measured"], measure()["measured"])
    ratio = result["estimate"] / result["measured"]
    assert 0.5 <= ratio <= 2, result


def test_a_job_that_cannot_fit_is_refused_with_its_estimate_and_the_flag_overrides(tmp_path):
    run = tmp_path / "run"
    # a job far past any machine, as `posbench train encoding=learned train.train_len=100000` (the smoke
    # slice has 95k train tokens): 4,096 windows of 90,000 tokens, terabytes even on SMOKE's narrow model
    proc = posbench("train", *SMOKE, "encoding=learned", "train.train_len=90000", "train.batch_size=4096",
                    "train.steps=2", "eval.lengths=[32]", f"hydra.run.dir={run}", cwd=tmp_path, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[-1].startswith("posbench: error: a training step of 4096 windows x train.train_len=90000 "
                                "needs about "), lines[-1]
    assert "GB of available RAM" in lines[-1] or "GB of memory left under" in lines[-1], lines[-1]
    assert lines[-1].endswith("or train.preflight=false to run it anyway")
    assert not run.exists()

    # a small job under a limit it exceeds is refused; train.preflight=false runs it anyway
    small = ["train", *SMOKE, "train.steps=2", "eval.lengths=[32]", f"hydra.run.dir={run}"]
    limited = {"POSBENCH_MEMORY_LIMIT": "0.001"}
    proc = posbench(*small, env=limited, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "than the 0.00 GB of memory set by POSBENCH_MEMORY_LIMIT" in proc.stderr
    assert not run.exists()
    proc = posbench(*small, "train.preflight=false", "eval.preflight=false", env=limited, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "results.csv").exists()
