"""Every run shipped under results/ still hashes to the config hash its results.csv records.

A run's config hash keys resume, re-evaluation, reuse by a study and the report's pairing of
runs; a change to :func:`posbench.config.hashed_part` (a new key, a renamed default) that moved
the hash of runs already made would orphan them. The guard recomputes the hash of every shipped
run config (config.yaml beside results.csv) and compares it with every row of its results.csv.
"""

from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from posbench.config import config_hash

RESULTS = Path(__file__).resolve().parents[1] / "results"


def shipped_runs() -> list[Path]:
    return sorted(p.parent for p in RESULTS.rglob("config.yaml") if (p.parent / "results.csv").is_file())


def test_every_shipped_run_config_hashes_as_its_results_say():
    runs = shipped_runs()
    assert len(runs) >= 116  # the exported runs of baselines, zoo, new_schemes, ...
    moved = []
    for run in runs:
        recorded = set(pd.read_csv(run / "results.csv", usecols=["config_hash"])["config_hash"].astype(str))
        now = config_hash(OmegaConf.load(run / "config.yaml"))
        if recorded != {now}:
            moved.append(f"{run.relative_to(RESULTS)}: results.csv {sorted(recorded)}, config.yaml now {now}")
    assert moved == []


def test_the_guard_sees_a_moved_hash():
    """The guard can fail: one hashed value changed gives another hash."""
    cfg = OmegaConf.load(shipped_runs()[0] / "config.yaml")
    before = config_hash(cfg)
    cfg.train.steps = int(cfg.train.steps) + 1
    assert config_hash(cfg) != before
