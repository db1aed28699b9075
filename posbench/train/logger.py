"""Training metrics: a JSONL file in the run dir, and Weights & Biases when ``wandb.mode`` enables it.

    posbench train logger=wandb                     # offline: written under <run dir>/wandb/, no network
    wandb sync outputs/train/alibi/default/wandb/offline-run-*   # upload later
    posbench train logger=wandb wandb.mode=online   # straight to the server (needs `wandb login`)

``logger=none`` (the default) sets ``wandb.mode: disabled``; ``logger=wandb`` sets
``offline``. A wandb run gets the resolved config, the config hash as its group (so the
seeds of one config sit together), the training curves (``train/loss``, ``train/lr``,
``train/tokens_per_s``), and at the end the results table (ppl, nll, bpb, ... per length,
scaling and protocol) with a perplexity-vs-length chart, each line's ppl and bpb per length
in the summary, and the run's positions.csv and probe tables (passkey.csv, ...) when evaluation wrote them.
"""

from __future__ import annotations

import json
import math

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from ..config import WANDB_MODES, choice, config_hash
from ..errors import PosbenchError
from ..eval.results import read_table, with_labels
from ..runs.rundir import RunDir, atomic_write_text, disk_full, no_space


def _step(line: str) -> float:
    """The step of one JSONL record; a torn or blank line (killed mid-write) sorts last."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")


class NullLogger:
    """The logger of a process that logs nothing (every rank but 0): the trainer calls it the same
    way, so it needs no "is logging on?" checks (nanochat's DummyWandb)."""

    def log(self, record: dict) -> None:
        pass

    def finish(self, results: pd.DataFrame) -> None:
        pass

    def close(self) -> None:
        pass


def check_wandb(cfg: DictConfig) -> None:
    """``wandb.mode=online`` needs a login and the server. Without a login wandb.init raises at
    once; without the server it waits out its 90 s init timeout, then raises. Either way after the
    run dir was written, with a traceback. Checked before anything is written: one line, at once."""
    if str(cfg.wandb.mode) != "online":
        return
    import socket
    import urllib.parse

    import wandb

    try:
        wandb.login(verify=False)  # finds the key (WANDB_API_KEY, netrc); never prompts off a terminal
    except wandb.errors.UsageError as e:
        raise PosbenchError(f"wandb.mode=online: {str(e).splitlines()[0].rstrip('.')}; valid: `wandb login` first, "
                            "or logger=wandb (offline; `wandb sync` the run later), or logger=none") from e
    url = urllib.parse.urlparse(str(wandb.Settings().base_url))
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=5).close()
    except OSError as e:
        raise PosbenchError(f"wandb.mode=online cannot reach {url.geturl()} ({e}); valid: logger=wandb "
                            "(offline; `wandb sync` the run later), or logger=none") from e


def open_logger(run: RunDir, cfg: DictConfig, resume_step: int, is_main: bool):
    """Rank 0's :class:`MetricsLogger`, a :class:`NullLogger` elsewhere."""
    return MetricsLogger(run, cfg, resume_step) if is_main else NullLogger()


class MetricsLogger:
    def __init__(self, run: RunDir, cfg: DictConfig, resume_step: int = 0):
        self.run = run
        self.path = run.metrics
        # On resume, drop records past the checkpoint so the file reads like one clean run.
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _step(line) <= resume_step]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        self.wandb = None
        mode = str(cfg.wandb.mode)
        choice("wandb.mode", mode, WANDB_MODES)
        if mode != "disabled":
            import wandb

            self.wandb = wandb.init(project=str(cfg.wandb.project), mode=mode, dir=str(run.path),
                                    name=run.path.name, group=config_hash(cfg), tags=[str(cfg.encoding.name)],
                                    config=OmegaConf.to_container(cfg, resolve=True), resume="allow", reinit=True)

    def log(self, record: dict) -> None:
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:  # a torn last line is dropped when the run resumes
            if disk_full(e) is None:
                raise
            raise no_space(self.path, e) from e
        if self.wandb is not None:
            self.wandb.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=record["step"])

    def close(self) -> None:
        """Close the wandb run, if any, flushing what it logged; called in ``finally``, so a run
        that fails still leaves its curves. Closing twice is harmless."""
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None

    def finish(self, results: pd.DataFrame) -> None:
        """Log the evaluation (results rows, and the run's positions and probe tables) and close."""
        if self.wandb is None:
            return
        import wandb

        rows = with_labels(results)
        ok = rows[rows.status == "ok"]
        plain = results.astype(object).where(results.notna(), None)  # pandas' NA (an empty Int64 cell) is no JSON
        logged = {"eval/results": wandb.Table(dataframe=plain),
                  "eval/ppl_vs_length": wandb.plot.line(
                      wandb.Table(dataframe=ok[["label", "eval_len", "ppl"]]), "eval_len", "ppl", stroke="label",
                      title="perplexity vs eval length")}
        if self.run.plot.is_file():
            logged["eval/ppl_vs_length_figure"] = wandb.Image(str(self.run.plot))
        from ..eval.probes import probe_files

        for name in ("positions", *probe_files(self.run.path)):
            path = self.run.path / f"{name}.csv"
            if path.is_file():
                logged[f"eval/{name}"] = wandb.Table(dataframe=read_table(path))
        self.wandb.log(logged)
        for r in ok.itertuples():
            for metric in ("ppl", "nll", "bpb", "word_ppl"):
                value = getattr(r, metric, math.nan)
                if not pd.isna(value):
                    self.wandb.summary[f"eval/{r.label}/{metric}@{r.eval_len}"] = float(value)
        self.close()
