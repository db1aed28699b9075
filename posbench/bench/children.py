"""What one measurement runs in its own process: the models (posbench's and the peer's), the timed
steps, the kernel and matmul figures, and the child process that holds them (``python -m
posbench.bench --child SPEC``); the FLOP and MFU arithmetic of :mod:`posbench.bench`'s docstring."""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

PEER_ENCODINGS = ("sinusoidal", "learned", "rope", "alibi", "t5", "xpos", "nope")


PEER = "x-transformers"  # the peer's implementations: "x-transformers" and "x-transformers flash"


def is_peer(impl: str) -> bool:
    """Whether a row's implementation is the peer's (not posbench's loop nor its trainer)."""
    return impl.startswith(PEER)


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
    from ..config import conf_dir

    return sorted(path.stem for path in (conf_dir() / "model").glob("*.yaml"))


def model_shape(name: str = "tiny") -> dict:
    """The shape of preset ``name`` (conf/model/NAME.yaml) with the bench's vocabulary."""
    import yaml

    from ..config import conf_dir

    cfg = yaml.safe_load((conf_dir() / "model" / f"{name}.yaml").read_text())
    return {key: int(cfg[key]) for key in ("d_model", "n_layers", "n_heads", "d_ff")} | {"vocab": VOCAB}


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

    from ..config import conf_dir
    from ..model.build import build_model

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
def _gpu_turn(lock: str | None, times: dict):
    """Hold the run's lock file while inside (``--jobs``: one child at a time times its steps);
    ``times`` gets when the turn began and ended (``turn_from``, ``turn_to``: seconds since the
    epoch), so a run's rows show that no two turns met."""
    import fcntl
    from contextlib import nullcontext

    with open(lock, "a") if lock else nullcontext() as handle:
        if lock:
            fcntl.flock(handle, fcntl.LOCK_EX)
        times["turn_from"] = time.time()
        try:
            yield
        finally:
            times["turn_to"] = time.time()
            if lock:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _wait_for_wave(spec: dict, times: dict, poll: float = 0.1) -> None:
    """``--jobs``: say this child is ready to be timed (compiled, or nothing to compile; ``times``
    gets when, ``ready_at``), then wait until every child of its wave is ready or has ended
    (posbench.bench.run's waves), so that no figure is timed while another child compiles."""
    times["ready_at"] = time.time()
    barrier = spec.get("barrier")
    if not barrier:
        return
    Path(barrier, f"ready-{spec['id']}").touch()

    def settled(j: int) -> bool:
        return Path(barrier, f"ready-{j}").exists() or Path(barrier, f"ended-{j}").exists()

    while not all(settled(j) for j in spec["wave"]):
        time.sleep(poll)


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


def train_step(model, x, y, amp, compiled: bool, peer: bool = False):
    """The bench's training step on the batch (x, y), as a function of no arguments: the model and
    its loss (under ``torch.compile`` where ``compiled``) in ``amp``, backward, clipping at 1,
    AdamW (fused on CUDA), gradients set to None. ``peer``: an x-transformers model, whose logits
    the step turns into the loss."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=x.device.type == "cuda")

    def loss_of(x, y):  # what compiles: the model and its loss
        return F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) if peer else model(x, targets=y)

    loss_fn = torch.compile(loss_of) if compiled else loss_of

    def step():
        with amp:
            loss = loss_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _child(spec: dict) -> dict:
    import torch

    from ..model.build import autocast_dtype, keep_freed_memory

    peer = is_peer(spec["impl"])
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
    compile_s, times = None, {}

    def batch(tokens, n):
        return torch.randint(0, VOCAB, (max(1, tokens // n), n), device=dev)

    if spec["kind"] == "train":
        x, y = batch(spec["tokens"], length), batch(spec["tokens"], length)
        step = train_step(model, x, y, amp, bool(spec.get("compile")), peer)

        if spec.get("compile"):  # the first steps compile (forward, backward; a guard may ask once more)
            start = time.perf_counter()
            for _ in range(2):
                step()
            sync()
            compile_s = time.perf_counter() - start
        _wait_for_wave(spec, times)
        with _gpu_turn(spec.get("lock"), times):
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

        _wait_for_wave(spec, times)
        with _gpu_turn(spec.get("lock"), times):
            forward(1024)  # warm-up: threads, allocator, one-time initialisation
            sync()
            start = time.perf_counter()
            tokens = forward(length)
            sync()
            seconds = time.perf_counter() - start
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "params": sum(p.numel() for p in model.parameters()),
            "peak_mb": peak_mb(), "compile_s": compile_s, **times}


TRAINER_LOG_EVERY = 5  # steps a metrics line of the trainer row covers: one figure a window


def _trainer_child(spec: dict) -> dict:
    """The real trainer at the bench's shape: ``posbench train`` in a process of its own (the
    packaged corpus, whose vocabulary is :data:`VOCAB`; preset ``model``, no dropout, the batch of
    ``spec["tokens"]`` tokens a step, compiled as ``spec["compile"]`` says), its tokens/s read
    from its metrics.jsonl: the median of the windows of :data:`TRAINER_LOG_EVERY` steps after
    the first two (compiling, warm-up), as many windows as ``spec["steps"]`` asks steps (two at
    least). Beside the bench's own loop (:func:`_child`, impl ``posbench``) it shows what the
    command a user runs gets that the loop does not: the data pipeline, the schedule, the checks
    of each step, the logging; a figure of one cannot drift from the other unseen. Its
    evaluation (one window) is not timed. Peak MB: the trainer process's resident high-water
    mark on a CPU, none on a GPU. Under ``--jobs`` it waits for its wave's other children to
    compile, then holds the lock for the whole run, its own compilation included (the command
    cannot be told to wait between compiling and timing)."""
    import tempfile

    from ..eval.results import read_table

    name, overrides = split_entry(spec["encoding"])
    length, log_every = spec["length"], TRAINER_LOG_EVERY
    windows = max(2, math.ceil(spec["steps"] / log_every))
    steps = log_every * (windows + 2)
    times: dict = {}
    _wait_for_wave(spec, times)  # the others compiled: this run compiles and is timed alone
    with tempfile.TemporaryDirectory(prefix="posbench-bench-train-") as run, _gpu_turn(spec.get("lock"), times):
        args = ["train", f"encoding={name}", *overrides, f"model={spec.get('model', 'tiny')}", "model.dropout=0",
                f"train.train_len={length}", f"train.batch_size={max(1, spec['tokens'] // length)}",
                f"train.steps={steps}", "train.warmup_steps=1", f"train.log_every={log_every}",
                f"train.ckpt_every={steps}", f"train.compile={str(bool(spec.get('compile'))).lower()}",
                f"device={spec.get('device', 'cpu')}", f"eval.lengths=[{length}]", f"eval.max_tokens={length}",
                "wandb.mode=disabled", f"hydra.run.dir={run}"]
        done = subprocess.run([sys.executable, "-m", "posbench.cli", *args], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(error_line(done.stderr, done.returncode))
        records = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]
        params = int(read_table(Path(run) / "results.csv").params.iloc[0])
    per_window = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    tokens = max(1, spec["tokens"] // length) * length
    first = tokens * log_every / per_window[0]
    gpu = spec.get("device", "cpu") != "cpu"
    peak = None if gpu else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    tps = statistics.median(per_window[2:])
    return {"tokens_per_s": tps, "seconds": tokens / tps, "peak_mb": peak,
            "compile_s": first if spec.get("compile") else None, "params": params, **times}


def _kernel_child(spec: dict) -> dict:
    """One attention layer at spec['length'] tokens with an ALiBi bias, by kernel."""
    import torch
    import torch.nn.functional as F

    from ..encodings import ModelDims, build_encoding
    from ..model import attention
    from ..model.build import autocast_dtype, keep_freed_memory

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
