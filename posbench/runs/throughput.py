"""Training throughput measured on this machine, kept to say what a plan will cost.

A training run that finishes appends one record to ``throughput.jsonl`` in the cache
(``~/.cache/posbench``): the machine (host, CPU model, cores, and the GPU where it trained on
one), the model's name and size, its layer types (``model.layers``: a hybrid of Gated DeltaNet
and attention trains at another speed than the transformer of the same name; records without the
key are ``a``), the encoding, train_len, precision, and the median tokens/s of
its logged windows after the first (which holds compiling and warming up). ``posbench study
NAME --step plan`` reads the records of this machine (:func:`measured`) to turn a stage's
training tokens into hours; where none matches it says the time is unknown on this machine
rather than guess from another. The records are a cache: losing them loses estimates, nothing
else, and writing them never fails a run.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
from pathlib import Path

FILE = "throughput.jsonl"


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo; the platform's processor elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine(device: str = "cpu") -> str:
    """This machine as its records name it: host, CPU model and cores, and the GPU of ``device``."""
    where = f"{socket.gethostname()} | {cpu_model()} | {os.cpu_count()} cores"
    if device.startswith("cuda"):
        import torch

        where += f" | {torch.cuda.get_device_name(torch.device(device))}"
    return where


def cache_file(cache_dir: Path | None = None) -> Path:
    from ..config import default_cache_dir

    return Path(cache_dir or default_cache_dir()) / FILE


def record(run_dir: Path, model: str, params: int, encoding: str, train_len: int, device: str, precision: str,
           cache_dir: Path | None = None, layers: str = "a") -> dict | None:
    """Append the run's measured throughput (from its metrics.jsonl) -> the record, or None where
    it logged no window, or the cache cannot be written."""
    try:
        rates = [json.loads(line)["tokens_per_s"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if line.strip()]
    except (OSError, ValueError, KeyError):
        return None
    if not rates:
        return None
    entry = {"machine": machine(device), "device": device.split(":")[0], "model": model, "params": int(params),
             "layers": layers, "encoding": encoding, "train_len": int(train_len), "precision": precision,
             "tokens_per_s": statistics.median(rates[1:] or rates)}  # one window alone: warm-up and all
    try:
        path = cache_file(cache_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")
    except OSError:
        return None
    return entry


def measured(model: str, encoding: str, train_len: int, device: str = "cpu",
             cache_dir: Path | None = None, layers: str = "a") -> tuple[float, str] | None:
    """(tokens/s, what it is the median of) of this machine's records of ``model`` with the layer
    types ``layers`` at ``train_len``: those of ``encoding`` where there are some, else those of
    every encoding (said so); None where this machine has trained no such model."""
    path = cache_file(cache_dir)
    if not path.is_file():
        return None
    here, kind, found = machine(device), device.split(":")[0], []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (entry.get("machine"), entry.get("device"), entry.get("model"), entry.get("train_len"),
                entry.get("layers", "a")) == (here, kind, model, int(train_len), layers):
            found.append(entry)
    same = [e["tokens_per_s"] for e in found if e.get("encoding") == encoding]
    if same:
        of = "" if layers == "a" else f" of model.layers={layers}"
        return statistics.median(same), f"{len(same)} {encoding} run(s){of}"
    if found:
        return statistics.median(e["tokens_per_s"] for e in found), f"{len(found)} run(s) of other encodings"
    return None
