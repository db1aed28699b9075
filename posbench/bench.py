"""`posbench bench`: training and evaluation speed and memory of every encoding, beside a peer.

Every figure comes from one run on one machine, each measurement in its own child process
so that its peak resident memory (:func:`peak_rss_mb`: Python, torch, model and activations) is
its own. The model is a preset of conf/model/ (``--model``, one or several): by default
``model=tiny``, the benchmark shape of the performance issue (4 layers, d_model 256, 8 heads,
FFN 1024), so the shipped CPU tables keep their meaning; vocabulary 8192 and no dropout for
every preset (the peer has none in the same places); bf16 autocast where the device has it.

* **train**: tokens/s of full training steps (forward, backward, gradient clipping, AdamW)
  at each train length, 4,096 tokens a step (batch = 4096 / train_len; ``--train-tokens``),
  after warm-up steps;
* **eval**: tokens/s and peak memory of one no-grad forward pass scoring 16,384 tokens
  (batch = 16384 / length windows; ``--eval-tokens``), the way ``posbench eval`` runs, after a
  warm-up pass at 1,024 tokens. Fewer tokens make a quick look on a slow machine (and the
  tests); bench.md states the counts each table ran with;
* **peer**: the same figures for x-transformers (``pip install -e ".[bench]"``) where it has
  the encoding, at whichever of its two attention settings (``attn_flash`` on or off) is
  faster, and the ratio posbench / x-transformers. The peer has posbench's shape and
  parameter count: head dimension d_model / heads (``attn_dim_head``; its default is 64),
  rotary over the whole head (``rotary_emb_dim``; its default is half) and tied input and
  output embeddings (``tie_embedding``); both counts are in every row and table;
* **allocator**: every implementation is measured under each setting of ``--malloc``: glibc's
  default (``system``) and posbench's (``posbench``, :func:`posbench.model.build.keep_freed_memory`),
  so each ratio compares the two libraries in the same environment;
* **FLOP/s** (:func:`flops_per_token`): training FLOPs per token

      6 N + 6 n_layers d_model T,    N = n_layers (4 d_model^2 + 2 d_model d_ff) + vocab d_model,

  N the matmul parameters (q, k, v, output projection, the two FFN layers, and the tied output
  layer; the embedding lookup is no matmul), 2 FLOPs a multiply-add, forward and backward
  3x the forward; the second term is attention's QK^T and AV over the keys a causal query
  sees, T / 2 on average (2 products x 2 d_model T / 2 x 3). PaLM's MFU (Chowdhery et al.
  2022, app. B) counts all T keys, 12 n_layers d_model T: its figures read higher by
  6 n_layers d_model T over this total (5% at model=base, T=512). Times tokens/s, as a fraction of
  the matmul peak in the precision the run uses (bf16 autocast where the device has it, else
  fp32), measured on n^3 products in the same run (n = 2048 on a CPU, 8192 on a GPU; the best
  round of several, at the start and at the end);
* **MFU** (GPU): the same FLOP/s as a fraction of the GPU's datasheet dense bf16 peak
  (:data:`DENSE_BF16_TFLOPS`: 989.4 TFLOP/s for an H100 SXM and an H200, 312 for an A100), beside
  the fraction of the measured matmul peak; a GPU not in the table gets "n/a" and a line
  saying so;
* **kernels** (``--kernels``): one attention layer at 8,192 tokens with an ALiBi bias, by
  kernel: SDPA without bias (the floor), the bias built per query chunk, Toeplitz slices of
  one bias, and flex attention with the bias as ``score_mod`` (compiled; compile time apart).

Children run under a 16 GiB address-space cap, so a kernel that materialises a
(heads, T, T) matrix fails with "out of memory" instead of swapping the machine.

``--device cuda`` measures the same on a GPU, with the defaults of a GPU training bench:
training only (``--eval-lens`` adds evaluation), at T=512, 32,768 tokens a step (64 windows:
enough that the GPU is not waiting on kernel launches), bf16 autocast, fused AdamW, and each
implementation's loss (model and cross-entropy) under ``torch.compile`` (``--no-compile``:
eager); posbench's relative biases run through flex attention there
(:func:`posbench.model.attention.flex_causal`). x-transformers runs with ``attn_flash`` on, its
fast setting on a GPU (but with T5's bias, which it refuses there), compiled the same way. Peak
memory is the GPU's high-water mark of allocated memory (``torch.cuda.max_memory_allocated``)
instead of resident memory; there is no address-space cap (CUDA reserves more than 16 GiB of
it) and only glibc's malloc (``system``) unless ``--malloc`` says otherwise. A figure is the
median of the timed steps, each timed by CUDA events around it, after the compiling steps
(their time is the ``compile s`` column) and the warm-up steps. Compiling is CPU work and most
of a GPU child's time, so ``--jobs N`` runs N children side by side: they compile at once, and
take turns on the GPU (a lock file) for their warm-up and timed steps, so no two are timed
together. ``--deadline`` starts no child past a time, and bench.csv, bench.json and bench.md
are rewritten as each row finishes, so a run cut short keeps what it measured. The run the GPU
figures come from is in results/bench/gpu/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from .runs.throughput import cpu_model

PEER_ENCODINGS = ("sinusoidal", "learned", "rope", "alibi", "t5", "xpos", "nope")
PEER_NO_FLASH = ("t5",)  # x-transformers asserts that attn_flash does not take T5's bias
VOCAB = 8192  # every preset's, in the bench
TRAIN_TOKENS = 4096  # per training step
EVAL_TOKENS = 16384  # per evaluation pass
GPU_TRAIN_TOKENS = 32768  # per training step on a GPU: 64 windows of 512
DEFAULT_TOKENS = {"train": TRAIN_TOKENS, "eval": EVAL_TOKENS}
MEMORY_CAP = 16 << 30  # bytes of address space per child
MATMUL_N = {"cpu": 2048, "cuda": 8192}  # the matmul peak's product size: n^3
# Datasheet dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, by a part of the name
# torch.cuda.get_device_name() gives; the first match counts (PCIe and NVL parts before the SXM).
DENSE_BF16_TFLOPS = (("H100 PCIe", 756.5), ("H100 NVL", 835.5), ("H200 NVL", 835.5), ("H100", 989.4),
                     ("H200", 989.4), ("A100", 312.0))


def datasheet_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name, None for one not in :data:`DENSE_BF16_TFLOPS`."""
    return next((tflops for part, tflops in DENSE_BF16_TFLOPS if part in device_name), None)


def model_names() -> list[str]:
    """The model presets ``--model`` takes: conf/model/*.yaml."""
    from .config import conf_dir

    return sorted(path.stem for path in (conf_dir() / "model").glob("*.yaml"))


def model_shape(name: str = "tiny") -> dict:
    """The shape of preset ``name`` (conf/model/NAME.yaml) with the bench's vocabulary."""
    import yaml

    from .config import conf_dir

    cfg = yaml.safe_load((conf_dir() / "model" / f"{name}.yaml").read_text())
    return {key: int(cfg[key]) for key in ("d_model", "n_layers", "n_heads", "d_ff")} | {"vocab": VOCAB}


# ---- inside a child process --------------------------------------------------------------

def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: VmHWM, the high-water mark of its own address
    space. Not ``ru_maxrss``: on Linux a process started by fork and exec inherits there the
    resident size its parent had when it forked, so a child of a large parent would report the
    parent's size."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: kB on most systems


def _device(spec: dict):
    """-> (the spec's torch device, a function that waits for it, peak memory in MB so far)."""
    import torch

    dev = torch.device(spec.get("device", "cpu"))
    if dev.type == "cuda":
        return dev, torch.cuda.synchronize, lambda: torch.cuda.max_memory_allocated(dev) / 2 ** 20
    return dev, lambda: None, peak_rss_mb


def split_entry(entry: str) -> tuple[str, list[str]]:
    """'nope+model.length_scaling=ssmax' -> ('nope', ['model.length_scaling=ssmax']): a bench
    entry is an encoding, optionally with config overrides (a model option, an encoding option)."""
    name, *overrides = entry.split("+")
    return name, overrides


# the model options of `posbench encodings`, each measured with one encoding in the default bench
MODEL_OPTION_ENTRIES = ("nope+model.length_scaling=ssmax", "rope+model.length_scaling=logn",
                        "rope+model.qk_norm=true", "rope+model.window=64", "rope+model.gate=elementwise",
                        "rope+model.differential=true", "rope+model.sinks=true", "nope+model.layers=ddda",
                        "rope+model.layers=ddda", "rope+model.layers=ma+model.window=64")


def _posbench_model(encoding: str, train_len: int, max_len: int, model: str = "tiny"):
    """The benchmark model: preset ``model``, no dropout; a position table (``encoding.max_len``)
    gets ``max_len`` entries so it can run at every measured length, as x-transformers'
    ``max_seq_len``. ``encoding``: a bench entry (:func:`split_entry`)."""
    from hydra import compose, initialize_config_dir

    from .config import conf_dir
    from .model.build import build_model

    name, overrides = split_entry(encoding)
    base = [f"encoding={name}", f"model={model}", "model.dropout=0", f"train.train_len={train_len}", *overrides]
    with initialize_config_dir(str(conf_dir()), version_base=None):
        cfg = compose("app_train", base)
        if "max_len" in cfg.encoding:
            cfg = compose("app_train", [*base, f"encoding.max_len={max_len}"])
    return build_model(cfg, VOCAB)


def _peer_model(encoding: str, flash: bool, model: str = "tiny"):
    """x-transformers at posbench's shape (preset ``model``): head dimension d_model / heads,
    rotary over the whole head, tied embeddings (5.25M parameters for both at ``model=tiny``)."""
    from x_transformers import Decoder, TransformerWrapper

    shape = model_shape(model)
    head_dim = shape["d_model"] // shape["n_heads"]
    rotary = {"rotary_emb_dim": head_dim}
    layers = {"rope": {"rotary_pos_emb": True, **rotary}, "alibi": {"alibi_pos_bias": True},
              "t5": {"rel_pos_bias": True}, "xpos": {"rotary_xpos": True, **rotary}}.get(encoding, {})
    wrapper = {"sinusoidal": {"scaled_sinu_pos_emb": True}, "learned": {}}.get(encoding, {"use_abs_pos_emb": False})
    return TransformerWrapper(num_tokens=shape["vocab"], max_seq_len=16384, tie_embedding=True, **wrapper,
                              attn_layers=Decoder(dim=shape["d_model"], depth=shape["n_layers"], heads=shape["n_heads"],
                                                  attn_dim_head=head_dim, ff_mult=shape["d_ff"] // shape["d_model"],
                                                  attn_flash=flash, **layers))


@contextmanager
def _gpu_turn(lock: str | None):
    """Hold the run's lock file while inside (``--jobs``: one child at a time times its steps)."""
    if not lock:
        yield
        return
    import fcntl

    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _step_seconds(step, steps: int, dev, sync) -> float:
    """Seconds a step: on a GPU the median of ``steps`` steps, each between two CUDA events (no
    host wait between steps); on a CPU their mean, timed together."""
    import torch

    if dev.type != "cuda":
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        return (time.perf_counter() - start) / steps
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    marks[0].record()
    for mark in marks[1:]:
        step()
        mark.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:]))


def _child(spec: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from .model.build import autocast_dtype, keep_freed_memory

    peer = spec["impl"] != "posbench"
    if spec["malloc"] == "posbench":
        keep_freed_memory()
    dev, sync, peak_mb = _device(spec)
    torch.manual_seed(0)
    length, preset = spec["length"], spec.get("model", "tiny")
    if peer:
        model = _peer_model(spec["encoding"], spec["impl"] == "x-transformers flash", preset)
    else:
        train_len = length if spec["kind"] == "train" else 128
        model = _posbench_model(spec["encoding"], train_len, max(length, 16384), preset)
    model = model.to(dev)
    dtype = autocast_dtype(dev, "auto")
    amp = torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None)
    compile_s = None

    def batch(tokens, n):
        return torch.randint(0, VOCAB, (max(1, tokens // n), n), device=dev)

    if spec["kind"] == "train":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
        x, y = batch(spec["tokens"], length), batch(spec["tokens"], length)

        def loss_of(x, y):  # what compiles: the model and its loss
            return F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) if peer else model(x, targets=y)

        loss_fn = torch.compile(loss_of) if spec.get("compile") else loss_of

        def step():
            with amp:
                loss = loss_fn(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        if spec.get("compile"):  # the first steps compile (forward, backward; a guard may ask once more)
            start = time.perf_counter()
            for _ in range(2):
                step()
            sync()
            compile_s = time.perf_counter() - start
        with _gpu_turn(spec.get("lock")):
            for _ in range(spec["warmup"]):
                step()
            seconds = _step_seconds(step, spec["steps"], dev, sync)
        tokens = x.numel()
    else:
        model.eval()

        def forward(n):
            x = batch(spec["tokens"], n)
            with torch.no_grad(), amp:
                if peer:
                    model(x)
                else:  # as posbench eval: hidden states, then the NLL in slices
                    model.token_nll(x, x)
            return x.numel()

        with _gpu_turn(spec.get("lock")):
            forward(1024)  # warm-up: threads, allocator, one-time initialisation
            sync()
            start = time.perf_counter()
            tokens = forward(length)
            sync()
            seconds = time.perf_counter() - start
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "params": sum(p.numel() for p in model.parameters()),
            "peak_mb": peak_mb(), "compile_s": compile_s}


def _kernel_child(spec: dict) -> dict:
    """One attention layer at spec['length'] tokens with an ALiBi bias, by kernel."""
    import torch
    import torch.nn.functional as F

    from .encodings import ModelDims, build_encoding
    from .model import attention
    from .model.build import autocast_dtype, keep_freed_memory

    keep_freed_memory()
    dev, sync, peak_mb = _device(spec)
    dtype = autocast_dtype(dev, "auto") or torch.float32  # the precision evaluation runs in
    shape = model_shape(spec.get("model", "tiny"))
    T, H = spec["length"], shape["n_heads"]
    hs = shape["d_model"] // H
    enc = build_encoding({"name": "alibi"}, ModelDims(shape["d_model"], H, 1, 128)).to(dev)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, T, hs, dtype=dtype, device=dev) for _ in range(3))
    pos = torch.arange(T, device=dev)
    kernel, compile_s = spec["kernel"], None
    if kernel == "sdpa, no bias":
        def run():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif kernel == "bias per query chunk":
        def run():
            return attention.sdpa_chunks(q, k, v, 1024, enc.logit_scale(), lambda s, e: attention.masked_bias(
                enc, pos[s:e], pos[:e], 0, q.dtype))
    elif kernel == "Toeplitz slices (posbench)":
        def run():
            return attention.causal_attention(q, k, v, enc, pos, 0, 1024, cache={})
    else:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        slopes = enc.slopes.float()

        def alibi(score, b, h, i, j):
            return score - slopes[h] * (i - j)

        start = time.perf_counter()
        block_mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, T, T, device=dev)
        flex = torch.compile(flex_attention)
        flex(q, k, v, score_mod=alibi, block_mask=block_mask)
        sync()
        compile_s = time.perf_counter() - start

        def run():
            return flex(q, k, v, score_mod=alibi, block_mask=block_mask)
    with torch.no_grad():
        run()
        sync()
        start = time.perf_counter()
        for _ in range(2):
            run()
        sync()
    return {"seconds": (time.perf_counter() - start) / 2, "compile_s": compile_s, "peak_mb": peak_mb()}


def _matmul_child(spec: dict) -> dict:
    """The peak of an n^3 matrix product (n = ``spec["n"]``, :data:`MATMUL_N`) in each of
    ``spec["dtypes"]``, one process for all."""
    import torch

    dev, sync, _ = _device(spec)
    n = spec.get("n", MATMUL_N["cpu"])
    peaks = {}
    for name in spec["dtypes"]:
        a, b = (torch.randn(n, n, dtype=getattr(torch, name), device=dev) for _ in range(2))
        a @ b  # warm-up: on a GPU, the library's first call
        sync()
        best, begun = math.inf, time.perf_counter()
        for round_ in range(8):  # the best of up to 8 rounds of 4 products: a peak, not an average over noise
            start = time.perf_counter()
            for _ in range(4):
                a @ b
            sync()
            best = min(best, time.perf_counter() - start)
            if round_ >= 2 and time.perf_counter() - begun > 2.0:  # a slow CPU on one thread: 3 rounds or 2 s
                break
        peaks[f"{name}_gflops"] = 4 * 2 * n ** 3 / best / 1e9
    return peaks


# ---- the parent ----------------------------------------------------------------------------

def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_child(spec: dict, timeout: float = 900) -> dict:
    """``spec`` measured in a fresh process -> its figures, or {"error": one line}. On the CPU
    under the address-space cap; on a GPU without it (CUDA reserves more address space).
    ``spec["compile_threads"]``: inductor's compile workers (children compiling side by side
    share the cores)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if spec.get("compile_threads"):
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(spec["compile_threads"]))
    gpu = spec.get("device", "cpu") != "cpu"
    try:
        done = subprocess.run([sys.executable, "-m", "posbench.bench", "--child", json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout,
                              preexec_fn=None if gpu else _limit_memory,
                              env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    error = error_line(done.stderr, done.returncode)
    if "memory" in error.lower() or done.returncode == -9:
        return {"error": "out of GPU memory" if gpu and done.returncode != -9 else
                f"out of memory ({MEMORY_CAP >> 30} GiB cap)"}
    return {"error": error[:200]}


def error_line(stderr: str, returncode: int) -> str:
    """A failed child's error in one line: the first line of the exception that ended it (its
    type and message), read after the last ``Traceback`` header of ``stderr``. Not the last
    line: torch dynamo's messages end with advice ("Set TORCHDYNAMO_VERBOSE=1 ..."). A first
    line that ends in ":" introduces its cause (dynamo's "backend='inductor' raised:"), so the
    next line is joined to it. Without a traceback (a signal, a crash in C): stderr's last line,
    or the exit status."""
    lines = stderr.strip().splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    # the frames are indented; the exception's first line is the first one after them that is not
    start = headers[-1] + 1 if headers else len(lines)
    for i, line in enumerate(lines[start:], start):
        if line and not line[0].isspace():
            after = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{line.rstrip()} {after}" if line.rstrip().endswith(":") and after else line.rstrip()
    return lines[-1] if lines else f"exit {returncode}"


def flops_per_token(train_len: int, shape: dict | None = None) -> float:
    """Training FLOPs per token at ``train_len`` of a model of ``shape`` (:func:`model_shape`,
    default ``model=tiny``): 6 N + 6 n_layers d_model T (the module docstring derives it)."""
    shape = shape or model_shape("tiny")
    d, L, ff, V = shape["d_model"], shape["n_layers"], shape["d_ff"], shape["vocab"]
    matmul_params = L * (4 * d * d + 2 * d * ff) + V * d
    return 6 * matmul_params + 6 * L * d * train_len


def mfu(tokens_per_s: float, train_len: int, shape: dict, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: ``tokens_per_s`` x :func:`flops_per_token` as a fraction of
    ``peak_tflops`` (a datasheet's, or a measured matmul peak); None without a peak."""
    if not peak_tflops or not tokens_per_s or peak_tflops != peak_tflops:
        return None
    return tokens_per_s * flops_per_token(train_len, shape) / (peak_tflops * 1e12)


def _short(error) -> str:
    """A table cell for a failed measurement (the CSV keeps the whole message)."""
    error = str(error)
    if "memory" in error.lower():
        return "out of memory"
    return error.split(": ", 1)[-1][:60]


def _fmt(value, spec=",.0f"):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, spec)


MALLOCS = ("system", "posbench")  # glibc's default; posbench's (freed memory kept in the heap)


def bench(encodings, train_lens, eval_lens, peer: bool, kernels: bool, steps: int, mallocs=MALLOCS,
          log=print, device: str = "cpu", matmuls: bool = True, tokens: dict | None = None,
          models=("tiny",), compiled: bool = False, jobs: int = 1, deadline: float | None = None,
          timeout: float = 900, progress=None) -> dict:
    """Run every measurement on ``device`` (cpu or cuda); -> {"machine": {...}, "rows": [...],
    "kernels": [...]}. ``matmuls=False`` skips the machine's matmul peaks (``--update`` keeps the
    earlier run's machine figures, so measuring them again would be thrown away). ``tokens``:
    {"train": tokens a step, "eval": tokens a pass} (default 4,096 and 16,384), in every row.
    ``models``: presets, measured in this order, each encoding's posbench row before its peer's.
    ``compiled``: training steps under torch.compile. ``jobs``: children at once (their timed
    steps take turns); ``deadline``: ``time.monotonic()`` past which no child starts; ``timeout``:
    seconds a child may take; ``progress(result)``: called with the result so far after each row."""
    import torch

    from .encodings import REGISTRY
    from .model.build import autocast_dtype

    unknown = sorted({split_entry(e)[0] for e in encodings} - set(REGISTRY))
    if unknown:
        from .errors import PosbenchError
        raise PosbenchError(f"unknown encoding(s) {', '.join(unknown)}; valid choices: {', '.join(sorted(REGISTRY))}")
    precision = "bf16" if autocast_dtype(torch.device(device), "auto") is not None else "fp32"
    # bf16 products are emulated, and slow, on a CPU without bf16 instructions: measured only where used
    dtypes = ("float32", "bfloat16") if precision == "bf16" else ("float32",)
    gpu = device == "cuda"
    name = torch.cuda.get_device_name() if gpu else cpu_model()
    n = MATMUL_N["cuda" if gpu else "cpu"]

    def matmul_peaks() -> dict:  # GFLOP/s of each dtype (nan where not measured or it failed)
        got = run_child({"what": "matmul", "dtypes": list(dtypes), "device": device, "n": n}) if matmuls else {}
        return {f"{d}_gflops": got.get(f"{d}_gflops", math.nan) for d in dtypes}

    machine = {"cpu": name, "cores": os.cpu_count(), "device": device, "torch": torch.__version__,
               "python": platform.python_version(), "precision": precision, "matmul_n": n, **matmul_peaks()}
    if gpu:
        machine["datasheet_bf16_tflops"] = datasheet_tflops(name)
    if jobs > 1:
        machine["jobs"] = jobs
    log(f"machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, {precision}; matmul {n}^3: "
        + (", ".join(f"{d} {machine[f'{d}_gflops']:.0f} GFLOP/s" for d in dtypes) if matmuls else "not measured"))
    impls = ["posbench"] + (["x-transformers", "x-transformers flash"] if peer else [])
    tokens = {**DEFAULT_TOKENS, **(tokens or {})}
    lock = None
    if jobs > 1:
        import tempfile

        handle, lock = tempfile.mkstemp(prefix="posbench-bench-", suffix=".lock")
        os.close(handle)
    specs = [{**spec, "lock": lock, "compile_threads": max(1, (os.cpu_count() or 1) // jobs)} if lock else spec
             for spec in _specs(models, encodings, mallocs, impls, train_lens, eval_lens, steps, device,
                                tokens, compiled)]
    result = {"machine": machine, "rows": [], "kernels": []}
    try:
        for rows in _measure_all(specs, jobs, deadline, timeout, log):
            result["rows"] = rows
            if progress:
                progress(result)
    finally:
        if lock:
            os.unlink(lock)
    for key, again in matmul_peaks().items():  # again at the end: the higher of the two readings
        machine[key] = max((v for v in (machine[key], again) if v == v), default=math.nan)
    if kernels:
        for kernel in ("sdpa, no bias", "bias per query chunk", "Toeplitz slices (posbench)", "flex attention"):
            got = run_child({"what": "kernel", "kernel": kernel, "length": 8192, "device": device})
            result["kernels"].append({"kernel": kernel, "length": 8192, **got})
            log(f"kernel {kernel:<28} " + (got.get("error") or f"{got['seconds']:.3f} s/layer"
                                            + (f" (compile {got['compile_s']:.0f} s)" if got.get("compile_s") else "")))
    return result


def _specs(models, encodings, mallocs, impls, train_lens, eval_lens, steps, device, tokens, compiled) -> list[dict]:
    """Every model measurement, in the order asked: per model, per encoding, posbench then its peer.
    On a GPU the peer runs in one setting: attn_flash, but for T5's bias (:data:`PEER_NO_FLASH`)."""
    gpu, specs = device == "cuda", []
    for model in models:
        for encoding in encodings:
            for malloc in mallocs:
                for impl in impls:
                    if impl != "posbench" and encoding not in PEER_ENCODINGS:
                        continue
                    if gpu and impl == ("x-transformers" if encoding not in PEER_NO_FLASH else "x-transformers flash"):
                        continue
                    for kind, lengths in (("train", train_lens), ("eval", eval_lens)):
                        specs += [{"what": "model", "model": model, "encoding": encoding, "impl": impl,
                                   "malloc": malloc,
                                   "kind": kind, "length": length, "steps": steps, "warmup": 2, "device": device,
                                   "tokens": tokens[kind], "compile": compiled and kind == "train"}
                                  for length in lengths]
    return specs


def _measure_all(specs, jobs: int, deadline: float | None, timeout: float, log):
    """Measure ``specs``, ``jobs`` children at once; after each finishes, log its line and yield
    the rows so far in the order of ``specs`` (whatever finished first). A spec not started by
    ``deadline`` (``time.monotonic()``) is a row saying so."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    def measure(spec):
        if deadline is not None and time.monotonic() > deadline:
            return {"error": "not run: past --deadline"}
        return run_child(spec, timeout)

    done = {}
    with ThreadPoolExecutor(max(1, jobs)) as pool:  # one thread per child at once; each waits on its process
        futures = {pool.submit(measure, spec): i for i, spec in enumerate(specs)}
        for future in as_completed(futures):
            i, got = futures[future], future.result()
            spec = {k: v for k, v in specs[i].items() if k not in ("lock", "compile_threads")}
            done[i] = {**spec, **got}
            figure = got.get("error") or (f"{got['tokens_per_s']:10,.0f} tok/s  {got['peak_mb']:8,.0f} MB"
                                          + (f"  (compile {got['compile_s']:.0f} s)" if got.get("compile_s") else ""))
            log(f"{spec['model']:<6} {spec['encoding']:<14} {spec['impl']:<22} {spec['malloc']:<8} "
                f"{spec['kind']:<5} {spec['length']:>6}  {figure}")
            yield [done[j] for j in sorted(done)]


def measured(result: dict):
    """The rows as a DataFrame, with the columns older bench.json files lack: ``malloc`` (there,
    posbench ran under its own setting and the peer under ``machine.peer_malloc``), ``params``,
    ``tokens`` (a step or a pass; there, the defaults) and ``model`` (there, ``tiny``)."""
    import pandas as pd

    df = pd.DataFrame(result["rows"])
    for col in ("tokens_per_s", "peak_mb", "error", "params", "seconds", "compile_s"):
        if col not in df:
            df[col] = None
    df["model"] = df.model.fillna("tiny") if "model" in df else "tiny"  # rows from before --model: model=tiny
    if "malloc" not in df:
        df["malloc"] = None
    peer_malloc = result["machine"].get("peer_malloc", "system")
    df["malloc"] = df.malloc.fillna(df.impl.map(lambda impl: "posbench" if impl == "posbench" else peer_malloc))
    defaults = df.kind.map(DEFAULT_TOKENS)  # rows from before --train-tokens / --eval-tokens ran with the defaults
    df["tokens"] = defaults if "tokens" not in df else df.tokens.fillna(defaults)
    return df


def _pick(df, enc, malloc, kind, length, peer: bool):
    """posbench's row, or the faster x-transformers row (attn_flash on or off), or None."""
    rows = df[(df.encoding == enc) & (df.malloc == malloc) & (df.kind == kind) & (df.length == length)
              & ((df.impl != "posbench") if peer else (df.impl == "posbench"))]
    fast = rows[rows.tokens_per_s.notna()]
    if len(fast):
        return fast.loc[fast.tokens_per_s.idxmax()]
    return rows.iloc[0] if len(rows) else None


def _tps(row):
    return None if row is None or row.tokens_per_s is None or row.tokens_per_s != row.tokens_per_s else row.tokens_per_s


def _cell_text(row, value):
    """A figure, or the row's shortened error, or '-' when nothing was measured."""
    if row is None:
        return "-"
    return _fmt(value) if _tps(row) else _short(row.error)


def _params(df, enc, impl_is_peer: bool) -> str:
    rows = df[(df.encoding == enc) & ((df.impl != "posbench") if impl_is_peer else (df.impl == "posbench"))]
    counts = rows.params.dropna()
    return f"{counts.iloc[0] / 1e6:.2f}M" if len(counts) else "-"


def _model_table(df, kind: str, peak_gflops: float, shape: dict | None = None) -> list[str]:
    """One line per (encoding, malloc): per length, posbench and x-transformers under that same
    allocator setting and their ratio (training: and posbench's FLOP/s as a fraction of the peak;
    evaluation: and both peak memories)."""
    lengths = sorted(set(df[df.kind == kind].length))
    if not lengths:
        return []
    per = (("tok/s", "x-t", "ratio", "FLOP/s of peak") if kind == "train"
           else ("tok/s", "MB", "x-t tok/s", "x-t MB", "ratio"))
    head = ["encoding", "malloc", "params", "x-t params"] + [f"{x} {'T=' if kind == 'train' else ''}{n}"
                                                             for n in lengths for x in per]
    counts = ", ".join(f"{int(n):,}" for n in sorted(set(df[df.kind == kind].tokens)))
    out = [f"### {'Training' if kind == 'train' else 'Evaluation'}", "",
           f"{counts} tokens {'a step' if kind == 'train' else 'a pass'}.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for enc in _encodings(df):
        for malloc in [m for m in MALLOCS if m in set(df.malloc)]:
            cells = [enc, malloc, _params(df, enc, False), _params(df, enc, True)]
            for n in lengths:
                ours, theirs = _pick(df, enc, malloc, kind, n, False), _pick(df, enc, malloc, kind, n, True)
                ratio = f"{_tps(ours) / _tps(theirs):.2f}" if _tps(ours) and _tps(theirs) else "-"
                if kind == "train":
                    frac = f"{_tps(ours) * flops_per_token(n, shape) / (peak_gflops * 1e9):.0%}" if _tps(ours) else "-"
                    cells += [_cell_text(ours, _tps(ours)), _cell_text(theirs, _tps(theirs)), ratio, frac]
                else:
                    cells += [_cell_text(ours, _tps(ours)), _fmt(None if ours is None else ours.peak_mb),
                              _cell_text(theirs, _tps(theirs)), _fmt(None if theirs is None else theirs.peak_mb), ratio]
            out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _encodings(df, asked: bool = False) -> list[str]:
    """The encodings of ``df``'s rows, sorted, or in the order they were asked for (``asked``)."""
    return list(dict.fromkeys(df.encoding)) if asked else sorted(set(df.encoding))


def _percent(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _gpu_table(df, machine: dict, shape: dict, length: int, malloc: str) -> list[str]:
    """Training on a GPU at ``length``: per encoding, posbench's and x-transformers' tokens/s, MFU
    against the datasheet peak, fraction of the measured matmul peak, peak memory and compile
    time, and the ratio of their tokens/s."""
    datasheet, measured_peak = machine.get("datasheet_bf16_tflops"), machine.get("bfloat16_gflops", math.nan) / 1e3
    head = ["encoding", "params", "tok/s", "MFU", "of matmul peak", "peak GB", "compile s",
            "x-t tok/s", "x-t MFU", "x-t of matmul peak", "x-t peak GB", "x-t compile s", "posbench / x-t"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for enc in _encodings(df, asked=True):
        cells = [enc, _params(df, enc, False)]
        for peer in (False, True):
            row = _pick(df, enc, malloc, "train", length, peer)
            if peer and row is None and split_entry(enc)[0] not in PEER_ENCODINGS:
                cells += ["none in x-t", "-", "-", "-", "-"]
                continue
            tps = _tps(row)
            cells += [_cell_text(row, tps), _percent(mfu(tps, length, shape, datasheet)),
                      _percent(mfu(tps, length, shape, measured_peak)),
                      "-" if row is None or not tps else f"{row.peak_mb / 1024:.1f}",
                      "-" if row is None else _fmt(row.compile_s, ".0f")]
        ours, theirs = _pick(df, enc, malloc, "train", length, False), _pick(df, enc, malloc, "train", length, True)
        cells.append(f"{_tps(ours) / _tps(theirs):.2f}" if _tps(ours) and _tps(theirs) else "-")
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _shape_line(name: str, shape: dict) -> str:
    return (f"model={name}: {shape['n_layers']} layers, d_model {shape['d_model']}, {shape['n_heads']} heads, "
            f"FFN {shape['d_ff']}, vocabulary {shape['vocab']}")


def tables(result: dict) -> str:
    """bench.md: the command, machine, per model a training and an evaluation table, kernels, targets."""
    machine, df = result["machine"], measured(result)
    precision = machine.get("precision", "bf16")
    peak = machine["bfloat16_gflops" if precision == "bf16" else "float32_gflops"]
    n = machine.get("matmul_n", MATMUL_N["cpu"])
    dtypes = (("float32", "fp32"), ("bfloat16", "bf16"))
    peaks = ", ".join(f"{name} {machine[f'{d}_gflops']:.0f} GFLOP/s" for d, name in dtypes
                      if f"{d}_gflops" in machine)
    gpu = machine.get("device") == "cuda"
    where = (f"GPU {machine['cpu']} ({machine['cores']} host cores)" if gpu
             else f"{machine['cpu']}, {machine['cores']} cores")
    autocast = " autocast" if precision == "bf16" else f" (no bf16 autocast on this {'GPU' if gpu else 'CPU'})"
    out = [f"Command: `{result['command']}`", ""] if result.get("command") else []
    out += [f"Machine: {where}, torch {machine['torch']}. Matmul {n}^3: {peaks}."
            + (" Peak MB: the GPU's allocated memory (torch.cuda.max_memory_allocated)." if gpu else ""), ""]
    if machine.get("jobs", 1) > 1:
        out += [f"{machine['jobs']} children at once, timed one at a time"
                + (": compiling children used the GPU briefly meanwhile." if gpu else
                   ": the others' work shared this CPU's cores while one was timed, so these figures are low."), ""]
    models = list(dict.fromkeys(df.model))
    if gpu:
        datasheet = machine.get("datasheet_bf16_tflops")
        out += [f"bf16{autocast}, fused AdamW, gradient clipping; compiled where the compile column has a time. "
                "MFU: training FLOP/s (6 N + 6 n_layers d_model T a token, posbench/bench.py) against the "
                + (f"datasheet dense bf16 peak of this GPU, {datasheet:,.1f} TFLOP/s" if datasheet else
                   f"datasheet dense bf16 peak, which posbench does not know for a {machine['cpu']}: MFU n/a "
                   "(posbench/bench.py DENSE_BF16_TFLOPS)")
                + f"; of matmul peak: against the bf16 {n}^3 product measured in this run. x-transformers (x-t) "
                "with attn_flash (t5: without; x-transformers refuses it there), "
                "at posbench's head dimension with tied "
                "embeddings; 'none in x-t': it has no such "
                "encoding. Each figure: the median step of the timed steps.", ""]
    for model in models:
        sub, shape = df[df.model == model], model_shape(model)
        if gpu:
            train = sub[sub.kind == "train"]
            for length in sorted(set(train.length)):
                counts = ", ".join(f"{int(t):,}" for t in sorted(set(train[train.length == length].tokens)))
                for malloc in [m for m in MALLOCS if m in set(train.malloc)]:
                    out += [f"### Training, {_shape_line(model, shape)}; T={length}, {counts} tokens a step"
                            + (f", malloc={malloc}" if len(set(train.malloc)) > 1 else ""), ""]
                    out += _gpu_table(sub, machine, shape, length, malloc)
            out += _model_table(sub, "eval", peak, shape)
        else:
            if len(models) > 1:
                out += [f"## {_shape_line(model, shape)}", ""]
            out += [f"Model: {shape['n_layers']} layers, d_model {shape['d_model']}, {shape['n_heads']} heads, "
                    f"FFN {shape['d_ff']}, vocabulary {shape['vocab']}; {precision}{autocast}. x-transformers (x-t): "
                    "the faster of attn_flash off/on per cell, at posbench's head dimension with tied embeddings; each "
                    "ratio compares the two under the same allocator setting (malloc: glibc's default `system`, or "
                    f"posbench's `posbench`). FLOP/s against the {precision} matmul peak.", ""]
            out += _model_table(sub, "train", peak, shape) + _model_table(sub, "eval", peak, shape)
    if result["kernels"]:
        out += [f"### Attention kernels: one ALiBi layer at 8,192 tokens ({precision}, no grad)", "",
                "| kernel | s/layer | compile s | peak MB |", "|---|---|---|---|"]
        for k in result["kernels"]:
            out.append(f"| {k['kernel']} | {k.get('error') or format(k['seconds'], '.3f')} | "
                       f"{_fmt(k.get('compile_s'), '.0f')} | {_fmt(k.get('peak_mb'))} |")
        out.append("")
    lines = gpu_targets(df, machine) if gpu else [
        (f"model={model}: " if len(models) > 1 else "") + line
        for model in models for line in targets(df[df.model == model])]
    out += ["### Targets", ""] + [f"- {line}" for line in lines]
    return "\n".join(out) + "\n"


GPU_MFU_TARGETS = {"rope": 0.40, "nope": 0.40}  # at model=base; every static-bias encoding: STATIC_BIAS_MFU
STATIC_BIAS_MFU = 0.30


def gpu_targets(df, machine: dict) -> list[str]:
    """The GPU issue's targets, each with its figures: at model=base, MFU >= 40% for rope and nope
    and >= 30% for every static-bias encoding (hook ``bias``); at every model, posbench's
    training ahead of x-transformers' for each encoding it has."""
    from .encodings import REGISTRY

    lines = []
    datasheet = machine.get("datasheet_bf16_tflops")
    tr = df[df.kind == "train"]
    malloc = "system" if "system" in set(tr.malloc) else next(iter(set(tr.malloc)), "system")
    if not datasheet:
        lines.append(f"MFU not judged: no datasheet bf16 peak for a {machine.get('cpu')} (posbench/bench.py "
                     "DENSE_BF16_TFLOPS)")
    for model in dict.fromkeys(tr.model):
        sub, shape = tr[tr.model == model], model_shape(model)
        for length in sorted(set(sub.length)):
            for enc in _encodings(sub, asked=True):
                name = split_entry(enc)[0]
                ours = _pick(sub, enc, malloc, "train", length, False)
                theirs = _pick(sub, enc, malloc, "train", length, True)
                goal = GPU_MFU_TARGETS.get(enc) or (STATIC_BIAS_MFU if name in REGISTRY and
                                                    REGISTRY[name].hook_kind() == "bias" and enc == name else None)
                if datasheet and model == "base" and goal:
                    got = mfu(_tps(ours), length, shape, datasheet)
                    lines.append(f"{'met' if got is not None and got >= goal else 'NOT met'}: {enc} at model=base, "
                                 f"T={length}: MFU >= {goal:.0%} ("
                                 + (f"{got:.1%}" if got is not None else _cell_text(ours, None)) + ")")
                if _tps(ours) and _tps(theirs):
                    ratio = _tps(ours) / _tps(theirs)
                    lines.append(f"{'met' if ratio > 1 else 'NOT met'}: {enc} at model={model}, T={length} ahead of "
                                 f"x-transformers ({_tps(ours):,.0f} vs {_tps(theirs):,.0f} tok/s, {ratio:.2f}x)")
    return lines


def targets(df) -> list[str]:
    """The performance issue's targets, each with the figures it is judged on: posbench's own
    figures under its default allocator setting, and each training ratio under equal settings."""
    lines = []
    if "malloc" not in df:
        df = df.assign(malloc="posbench")
    own = "posbench" if (df[df.impl == "posbench"].malloc == "posbench").any() else "system"
    ev = df[(df.kind == "eval") & (df.impl == "posbench") & (df.malloc == own)]
    longest = ev.length.max() if len(ev) else None
    if longest:
        at = ev[ev.length == longest]
        worst = at.loc[at.peak_mb.idxmax()] if at.peak_mb.notna().any() else None
        failed = at[at.tokens_per_s.isna()]
        ok = worst is not None and worst.peak_mb < 2048 and failed.empty
        lines.append(f"{'met' if ok else 'NOT met'}: every encoding evaluates at {longest:,} tokens under 2 GB peak"
                     + (f" (highest: {worst.encoding} {worst.peak_mb:,.0f} MB)" if worst is not None else "")
                     + (f"; failed: {', '.join(failed.encoding)}" if len(failed) else ""))

    def seconds(enc, n):
        r = ev[(ev.encoding == enc) & (ev.length == n)]
        return r.seconds.iloc[0] if len(r) and r.seconds.notna().iloc[0] else None

    for enc in ("alibi", "t5"):
        mine, rope = seconds(enc, 8192), seconds("rope", 8192)
        if mine and rope:
            lines.append(f"{'met' if mine <= 2 * rope else 'NOT met'}: {enc} evaluation at 8,192 tokens within 2x of "
                         f"rope's time ({mine:.2f} s vs {rope:.2f} s, {mine / rope:.2f}x)")
    tr = df[df.kind == "train"]
    for malloc in [m for m in MALLOCS if m in set(tr.malloc)]:
        for enc in ("rope", "alibi", "t5"):
            for n in sorted(set(tr.length)):
                ours, theirs = _pick(tr, enc, malloc, "train", n, False), _pick(tr, enc, malloc, "train", n, True)
                if _tps(ours) and _tps(theirs):
                    ratio = _tps(ours) / _tps(theirs)
                    lines.append(f"{'met' if ratio >= 1.3 else 'NOT met'}: {enc} training at T={n} >= 1.3x "
                                 f"x-transformers, both under malloc={malloc} ({_tps(ours):,.0f} vs "
                                 f"{_tps(theirs):,.0f} tok/s, {ratio:.2f}x)")
    return lines


def _parser() -> argparse.ArgumentParser:
    from .encodings import REGISTRY

    parser = argparse.ArgumentParser(prog="posbench bench", description=__doc__.splitlines()[0])
    parser.add_argument("--encodings", nargs="+", default=[*sorted(REGISTRY), *MODEL_OPTION_ENTRIES], metavar="NAME",
                        help="default: all, and each model option with one encoding; NAME+KEY=VALUE adds a config "
                             "override, e.g. nope+model.length_scaling=ssmax")
    parser.add_argument("--model", nargs="+", default=["tiny"], choices=model_names(), metavar="NAME",
                        help="model presets (conf/model/NAME.yaml), measured in this order (default: tiny)")
    parser.add_argument("--train-lens", nargs="*", type=int, default=None, metavar="T",
                        help="default: 128 512 on the CPU, 512 on a GPU")
    parser.add_argument("--eval-lens", nargs="*", type=int, default=None, metavar="L",
                        help="default: 1024 4096 8192 16384 on the CPU, none on a GPU")
    parser.add_argument("--steps", type=int, default=8, help="timed training steps per figure (after 2 warm-up steps)")
    parser.add_argument("--train-tokens", type=int, default=None, metavar="N",
                        help=f"tokens a training step (batch = N / train length; default {TRAIN_TOKENS} on the CPU, "
                             f"{GPU_TRAIN_TOKENS} on a GPU)")
    parser.add_argument("--eval-tokens", type=int, default=EVAL_TOKENS, metavar="N",
                        help=f"tokens an evaluation pass (default {EVAL_TOKENS}: batch = N / length)")
    parser.add_argument("--no-peer", action="store_true", help="leave out x-transformers")
    parser.add_argument("--kernels", action="store_true",
                        help="also compare attention kernels (flex attention compiles)")
    parser.add_argument("--malloc", nargs="+", choices=MALLOCS, default=None,
                        help="allocator settings every implementation is measured under (default: both on the CPU, "
                             "system on a GPU): glibc's default (system) and posbench's, freed memory kept in the "
                             "heap (posbench)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the models run (default: cpu); cuda: the first visible GPU")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="training steps under torch.compile (default: on a GPU only)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="children at once, compiling side by side, timed one at a time (default 1; for a GPU: "
                             "on a CPU the others' work shares the cores being timed)")
    parser.add_argument("--deadline", type=float, default=None, metavar="S",
                        help="start no child after S seconds (the rows not started say so); default: none")
    parser.add_argument("--timeout", type=float, default=900, metavar="S",
                        help="seconds a child may take (default 900)")
    parser.add_argument("--update", action="store_true",
                        help="re-measure --encodings at the lengths given and replace those rows in --out's "
                             "bench.json (other rows, machine figures and kernels kept unless --kernels)")
    parser.add_argument("--out", default="results/bench", help="where bench.csv, bench.json and bench.md go")
    return parser


def main(argv: list[str] | None = None) -> None:
    import shlex

    from .errors import PosbenchError

    argv = sys.argv[1:] if argv is None else list(argv)
    ns = _parser().parse_args(argv)
    begun = time.monotonic()
    gpu, peer = ns.device == "cuda", not ns.no_peer
    train_lens = ns.train_lens if ns.train_lens is not None else ([512] if gpu else [128, 512])
    eval_lens = ns.eval_lens if ns.eval_lens is not None else ([] if gpu else [1024, 4096, 8192, 16384])
    train_tokens = ns.train_tokens or (GPU_TRAIN_TOKENS if gpu else TRAIN_TOKENS)
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise PosbenchError("posbench bench --device cuda: no CUDA GPU is visible here; valid here: --device cpu")
    if ns.jobs < 1:
        raise PosbenchError(f"posbench bench --jobs {ns.jobs}: valid: an integer >= 1")
    mallocs = ns.malloc or (["system"] if gpu else list(MALLOCS))
    if peer:
        try:
            import x_transformers  # noqa: F401
        except ImportError:
            raise PosbenchError('x-transformers is not installed; valid: pip install -e ".[bench]", or --no-peer')
    out = Path(ns.out)
    if ns.update and not (out / "bench.json").is_file():
        raise PosbenchError(f"--update needs an earlier run's {out / 'bench.json'}; valid: run posbench bench "
                            f"--out {out} first, or leave out --update")
    for flag, value, least in (("--train-tokens", train_tokens, max(train_lens, default=1)),
                               ("--eval-tokens", ns.eval_tokens, max(eval_lens, default=1))):
        if value < least:
            raise PosbenchError(f"posbench bench {flag} {value}: fewer tokens than one window of {least}; valid: "
                                f"an integer >= {least}")
    command = shlex.join(["posbench", "bench", *argv])
    old = json.loads((out / "bench.json").read_text()) if ns.update else None
    from .runs.rundir import atomic_write_text

    def write(result: dict) -> str:
        """bench.csv, bench.json and bench.md from ``result`` (with --update: merged into the earlier run's)."""
        result = _merged(old, result) if old else result
        result["command"] = command
        out.mkdir(parents=True, exist_ok=True)
        text = tables(result)
        atomic_write_text(out / "bench.csv", measured(result).to_csv(index=False))  # every column, errors or none
        atomic_write_text(out / "bench.json", json.dumps(result, indent=1))
        atomic_write_text(out / "bench.md", text)
        return text

    result = bench(ns.encodings, train_lens, eval_lens, peer, ns.kernels, ns.steps, mallocs,
                   log=lambda line: print(line, flush=True), device=ns.device, matmuls=not ns.update,
                   tokens={"train": train_tokens, "eval": ns.eval_tokens}, models=ns.model,
                   compiled=gpu if ns.compile is None else ns.compile, jobs=ns.jobs,
                   deadline=None if ns.deadline is None else begun + ns.deadline, timeout=ns.timeout, progress=write)
    text = write(result)
    print("\n" + text)
    print(f"wrote {out / 'bench.md'}, {out / 'bench.csv'}, {out / 'bench.json'}")


def _merged(old: dict, result: dict) -> dict:
    """``--update``: the earlier run's machine figures and rows, the rows measured again replaced."""
    rows = measured(old).to_dict("records")  # older files: the allocator and model of each row
    key = ("model", "encoding", "impl", "malloc", "kind", "length")
    fresh = {tuple(r.get(k, "tiny" if k == "model" else None) for k in key) for r in result["rows"]}
    return {"machine": old["machine"], "kernels": result["kernels"] or old["kernels"],
            "rows": [r for r in rows if tuple(r[k] for k in key) not in fresh] + result["rows"]}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        spec = json.loads(sys.argv[2])
        child = {"model": _child, "kernel": _kernel_child, "matmul": _matmul_child}[spec["what"]]
        print(json.dumps(child(spec)), flush=True)
    else:
        from .errors import PosbenchError, fail

        try:
            main()
        except PosbenchError as e:  # one line, as `posbench bench` prints it
            fail(str(e))
