import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
from zygote import import_time_env

ROOT = Path(__file__).resolve().parents[1]
# Quick end-to-end settings on a slice of the real packaged corpus, on a narrow model (0.13M
# parameters instead of the preset's 3.4M): a test's command then spends its time on what the test
# checks, not on matmuls; a train of 40 steps with its evaluation takes 7 s instead of 12 s in a
# fresh interpreter.
NARROW = ["model.d_model=64", "model.n_heads=4", "model.n_layers=2", "model.d_ff=128"]
SMOKE = ["experiment=smoke", "device=cpu", *NARROW]


def load_script(name: str):
    """scripts/NAME.py imported as a module (the scripts are files, not a package), to call its
    functions in-process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory):
    """Tokenizer/token caches (ours and Hugging Face's) go to a per-session temp dir."""
    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    yield cache
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


# Commands the tests run keep a fixed thread count (posbench.runs.threads is bypassed where
# OMP_NUM_THREADS is set), so their numbers do not depend on what else the machine runs;
# tests/test_threads.py tests the policy itself. The suite runs its files on pytest-xdist
# workers (pyproject's addopts: -n 2 --dist loadfile, one worker per core of this project's
# 2-core CPU target), which share the cores: each takes its share of two threads. The workers
# inherit the environment of the controlling process, which imports this file first and knows
# no worker count: so what the user set is kept apart (POSBENCH_TESTS_OMP, "" where unset) and
# each process sets its own share from it, else the workers would keep the controller's two
# threads each and oversubscribe the cores (OpenMP's waits then made training steps x10 slower).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
_USER_OMP = os.environ.setdefault("POSBENCH_TESTS_OMP", os.environ.get("OMP_NUM_THREADS", ""))
os.environ["OMP_NUM_THREADS"] = _USER_OMP or str(max(1, min(2, os.cpu_count() or 1) // _WORKERS))
# Importing torch._inductor (torch.compile in tests/test_compile.py) sets TORCHINDUCTOR_CACHE_DIR in
# the worker's environment where it is unset. Set first, to the same directory, it stays as the
# zygote saw it; else every later command of that worker differs from the zygote in a variable read
# at import and runs in a fresh interpreter (3-5 s more each; about 50 commands of a suite run).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(default_cache_dir()))


@pytest.fixture(scope="session", autouse=True)
def _zygote_ends():
    yield
    for zygote in _ZYGOTE:
        zygote.close()


@pytest.fixture(autouse=True)
def _threads():
    """The worker's share of two threads (this project's CPU target), or OMP_NUM_THREADS when set."""
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


class Zygote:
    """This worker's warm interpreter (tests/zygote.py), started at its first command: each
    command runs in a fork of it, a process of its own, without paying the imports again."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py"))], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ), bufsize=1)
        self.env = import_time_env(os.environ)
        self.pending, self.lock = b"", threading.Lock()
        self.ready = "ready" in (self._reply(timeout=300) or {})
        self.outputs = Path(tempfile.mkdtemp(prefix="posbench-zygote-"))

    def _reply(self, timeout: float) -> dict | None:
        """The zygote's next line, or None when none came within ``timeout`` seconds (or it ended)."""
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, args: list[str], cwd, environ: dict, timeout: float) -> subprocess.CompletedProcess:
        with self.lock:  # one command at a time (a test may call posbench from several threads)
            return self._run(args, cwd, environ, timeout)

    def _run(self, args: list[str], cwd, environ: dict, timeout: float) -> subprocess.CompletedProcess:
        out, err = self.outputs / "stdout", self.outputs / "stderr"
        self.proc.stdin.write(json.dumps({"args": args, "cwd": str(cwd) if cwd else None, "env": environ,
                                          "out": str(out), "err": str(err)}) + "\n")
        self.proc.stdin.flush()
        pid = self._reply(timeout=60)["pid"]
        done = self._reply(timeout)
        if done is None:
            os.kill(pid, signal.SIGKILL)
            self._reply(timeout=60)
            raise subprocess.TimeoutExpired(["posbench", *args], timeout)
        return subprocess.CompletedProcess([*COMMAND, *args], done["rc"], out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        shutil.rmtree(self.outputs, ignore_errors=True)


_ZYGOTE: list[Zygote] = []
_STARTING = threading.Lock()
COMMAND = [sys.executable, "-m", "posbench.cli"]


def command_env(env: dict | None) -> dict:
    """This process's environment with ``env``'s variables set or, where None, removed."""
    environ = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = str(value)
    return environ


def fresh_posbench(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """`posbench args` in a fresh interpreter, its output captured."""
    return subprocess.run([*COMMAND, *map(str, args)], cwd=cwd, env=command_env(env), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600)


def posbench(*args, cwd=None, check=True, env=None):
    """Run the installed console script like a user would (``env``: variables to set or, with
    None, to remove): a process of its own, forked from this worker's warm interpreter, or a
    fresh interpreter where the environment differs from the warm one's in what libraries read
    at import (tests/zygote.py)."""
    environ = command_env(env)
    args = list(map(str, args))
    with _STARTING:
        if not _ZYGOTE and hasattr(os, "fork"):
            _ZYGOTE.append(Zygote())
    if _ZYGOTE and _ZYGOTE[0].ready and import_time_env(environ) == _ZYGOTE[0].env:
        proc = _ZYGOTE[0].run(args, cwd, environ, timeout=600)
    else:
        proc = fresh_posbench(*args, cwd=cwd, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"posbench {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def fake_distribution(site: Path, name: str, version: str, entry_points: str) -> Path:
    """An installed distribution as importlib.metadata finds it: ``site/<name>-<version>.dist-info``
    with its METADATA and ``entry_points.txt`` (e.g. ``[posbench.encodings]\nmine = pkg.mod:Class``);
    put ``site`` on PYTHONPATH. -> ``site``."""
    dist = site / f"{name}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "entry_points.txt").write_text(entry_points)
    return site


def compose(*overrides):
    """The resolved train config, as `posbench train <overrides>` would see it."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf

    from posbench.config import conf_dir, run_name

    OmegaConf.register_new_resolver("run_name", run_name, replace=True)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name="app_train", overrides=list(overrides))


def tiny_model(name="alibi", params=None, *, vocab=50, train_len=8, **model):
    """A seeded one-layer ``LanguageModel`` for CPU tests, in eval mode: encoding ``name`` with
    options ``params``; ``model``: ModelConfig fields that replace the sizes below (attn_chunk,
    dropout and embed_scale keep ModelConfig's defaults unless given)."""
    from posbench.encodings import build_encoding
    from posbench.model.transformer import LanguageModel, ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(**{"d_model": 32, "n_layers": 1, "n_heads": 4, "d_ff": 64, **model})
    encoding = build_encoding({"name": name, **(params or {})}, LanguageModel.dims(cfg, train_len, vocab))
    return LanguageModel(cfg, vocab, encoding).eval()


@pytest.fixture(autouse=True)
def _close_figures():
    """Figures a test draws without saving (save() closes its own) are closed after it."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def _smoke(tmp_path_factory, encoding: str) -> Path:
    run = tmp_path_factory.mktemp(f"smoke_{encoding}") / "run"
    posbench("train", *SMOKE, f"encoding={encoding}", f"hydra.run.dir={run}")
    return run


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """One trained smoke run (alibi, train_len 32, the default eval lengths) for the whole session.
    Read it only; a test that writes into a run dir takes ``smoke_run_copy``."""
    return _smoke(tmp_path_factory, "alibi")


@pytest.fixture
def smoke_run_copy(smoke_run, tmp_path):
    """A private copy of ``smoke_run``, for tests that add rows or files to it."""
    return Path(shutil.copytree(smoke_run, tmp_path / "run"))


@pytest.fixture(scope="session")
def smoke_rope_run(tmp_path_factory):
    """The same for rope: the parent of fine-tunes, a run beside a baseline. Read it only; a test
    that writes into a run dir takes ``smoke_rope_run_copy``."""
    return _smoke(tmp_path_factory, "rope")


@pytest.fixture
def smoke_rope_run_copy(smoke_rope_run, tmp_path):
    """A private copy of ``smoke_rope_run``."""
    return Path(shutil.copytree(smoke_rope_run, tmp_path / "rope"))


class Oracle(torch.nn.Module):
    """A probe's oracle: puts the maximum on each next token of the prompt followed by
    ``answer(prompt)``, so teacher forcing scores it 1 exactly when ``answer`` is the right one."""

    def __init__(self, prompts, answer, vocab):
        super().__init__()
        self.full = {tuple(p.forward_ids): p.ids + answer(p) for p in prompts}
        self.vocab = vocab

    def forward(self, x):
        out = torch.zeros(*x.shape, self.vocab)
        for b, row in enumerate(x.tolist()):
            full = self.full[tuple(row)]
            for t in range(len(row)):
                out[b, t, full[t + 1] if t + 1 < len(full) else 0] = 1.0
        return out
