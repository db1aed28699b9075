"""Training metrics: a JSONL file in the run dir, and wandb when ``wandb.mode`` enables it.

wandb defaults to ``disabled``; ``offline`` writes under the run dir and never needs a
network (``wandb sync`` uploads later).
"""

from __future__ import annotations

import json

from omegaconf import DictConfig, OmegaConf

from .checkpoint import RunDir, atomic_write_text
from .config import WANDB_MODES, _choice


def _step(line: str) -> float:
    """The step of one JSONL record; a torn or blank line (killed mid-write) sorts last."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")


class MetricsLogger:
    def __init__(self, run: RunDir, cfg: DictConfig, resume_step: int = 0):
        self.path = run.metrics
        # On resume, drop records past the checkpoint so the file reads like one clean run.
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _step(line) <= resume_step]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        self.wandb = None
        mode = str(cfg.wandb.mode)
        _choice("wandb.mode", mode, WANDB_MODES)
        if mode != "disabled":
            import wandb

            self.wandb = wandb.init(project=str(cfg.wandb.project), mode=mode, dir=str(run.path),
                                    name=run.path.name, config=OmegaConf.to_container(cfg, resolve=True),
                                    resume="allow", reinit=True)

    def log(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=record["step"])

    def finish(self, results) -> None:
        if self.wandb is None:
            return
        import wandb

        ok = results[results.status == "ok"]
        self.wandb.log({"eval/results": wandb.Table(dataframe=results),
                        "eval/ppl_vs_length": wandb.plot.line(
                            wandb.Table(dataframe=ok[["eval_len", "ppl"]]), "eval_len", "ppl",
                            title="perplexity vs eval length")})
        self.wandb.finish()
