"""What a planned sweep will cost, for ``posbench study NAME --step plan``: its training tokens, the
time they take at the throughput measured on this machine (:mod:`posbench.runs.throughput`;
"unknown on this machine" where it has trained no such model), and the peak memory of one run,
the preflight's estimate (:mod:`posbench.model.preflight`: a training step, and the evaluation at
the longest length), on the device the run would use. Eval and pretrained sweeps train nothing:
their line says so. Nothing here trains or loads a corpus; the model is built once per sweep to
count its parameters and estimate its memory."""

from __future__ import annotations

from dataclasses import dataclass

from .planning import _compose
from .spec import Study, Sweep


@dataclass
class Cost:
    runs: int
    tokens: int  # training tokens per run
    seconds: float | None  # per run, at the measured throughput; None: unknown on this machine
    measured: str  # what the throughput is the median of ('' when unknown)
    peak_gb: float | None  # one run's estimated peak (training step or evaluation), None: not estimated
    layout: str = ""  # ", model.layers=X" where the layers are not all attention (throughput is kept per layout)

    def text(self) -> str:
        total = self.runs * self.tokens
        time = (f"about {_duration(self.runs * self.seconds)} ({_duration(self.seconds)} a run, at the median "
                f"tokens/s of {self.measured} on this machine)" if self.seconds is not None
                else f"time unknown on this machine (no run of this model{self.layout} and train_len trained here yet)")
        memory = "" if self.peak_gb is None else f"; peak memory about {self.peak_gb:.2f} GB a run"
        return f"{self.runs} run(s) x {_tokens(self.tokens)} training tokens = {_tokens(total)}; {time}{memory}"


def _tokens(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n:,.0f}"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def sweep_cost(study: Study, sweep: Sweep, extra: list[str] = ()) -> Cost | None:
    """The cost of a training sweep's runs still to train; None for an eval or pretrained sweep."""
    if sweep.evaluates or sweep.pretrained:
        return None
    cfg = _compose(study, sweep, "app_train", [*study.common, *sweep.overrides, *extra])
    train = cfg.train
    tokens = int(train.steps) * int(train.batch_size) * int(train.train_len)
    device = str(cfg.get("device") or "auto")
    found = _throughput(cfg, device)
    seconds = None if found is None else tokens / found[0]
    layers = str(cfg.model.get("layers", "a"))
    return Cost(len(sweep.seeds), tokens, seconds, "" if found is None else found[1], _peak_gb(cfg, device),
                "" if layers == "a" else f", model.layers={layers}")


def _device(device: str):
    from ..model.build import resolve_device

    return resolve_device(device)


def _throughput(cfg, device: str) -> tuple[float, str] | None:
    from ..runs.throughput import measured

    return measured(str(cfg.model.name), str(cfg.encoding.name), int(cfg.train.train_len), str(_device(device)),
                    layers=str(cfg.model.get("layers", "a")))


def _peak_gb(cfg, device: str) -> float | None:
    """The preflight's estimate of one run's peak: its training step or its evaluation, the larger;
    None for an algorithmic task's run or a model that cannot be built here."""
    from ..config import EvalConfig, task_config, typed
    from ..errors import PosbenchError
    from ..model.build import autocast_dtype, build_model
    from ..model.preflight import GB, eval_memory, train_memory

    if not task_config(cfg.get("task")).is_lm:
        return None
    where = _device(device)
    dtype = autocast_dtype(where, str(cfg.train.get("precision", "auto")))
    try:
        model = build_model(cfg, int(cfg.data.vocab_size))
    except PosbenchError:
        return None
    ecfg = typed(EvalConfig, cfg.eval, "eval")
    lengths = ecfg.resolve_lengths(int(cfg.train.train_len))
    micro = int(cfg.train.get("micro_batch_size") or cfg.train.batch_size)
    step = train_memory(model, micro, int(cfg.train.train_len), where, dtype).total
    evaluation = eval_memory(model, lengths, ecfg.batch_tokens, ecfg.max_tokens, where, dtype).total
    return max(step, evaluation) / GB
