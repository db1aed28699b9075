"""The study files that replaced the shell drivers: each composes the runs its driver trained,
with the same config hashes (``config.NOT_HASHED`` leaves the launcher, run dirs, compile and the
branch points out), and where the driver's runs ship, the hashes they carry."""

import itertools
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from posbench.study import Sweep, load_study, plan, study_files, sweep_hash, sweeps

ROOT = Path(__file__).resolve().parents[1]

BUDGET = ["train.schedule=wsd", "train.decay_frac=0.2", "train.warmup_steps=40", "train.compile=true"]
DROPE = ["experiment=zoo_quick", "encoding=nope", "train.init_from=PARENT", "train.schedule=constant",
         "train.lr=3e-4", "train.warmup_steps=5"]
EXT = ["experiment=reference", "encoding=rope", "train.train_len=512", "eval.lengths=[128,256,512,1024,2048]"]
ZOO_QUICK = ("alibi,complex,conv,cope,deberta,dynamic,fire,kerple_log,kerple_power,learned,multiplicative,nope,rnn,"
             "rope,sandwich,shaw,sinusoidal,t5,tener,xl,xpos")

# Each former driver's `posbench -m train` commands, their hashed overrides and run dirs' parents
# as the driver passed them (a value with commas is Hydra's sweep over them).
DRIVERS = {
    "cpu_quick": [  # scripts/reference_comparison.sh
        ["seed=0,1,2", "encoding=sinusoidal,learned,rope,t5,alibi,nope"]],
    "baseline_zoo_quick": [  # scripts/baseline_zoo_quick.sh
        ["experiment=zoo_quick", "encoding=alibi,rope,t5,sinusoidal,nope", "seed=0,1,2"]],
    "zoo_quick": [  # scripts/zoo_comparison.sh, `posbench encodings` at e3a45e7
        ["experiment=zoo_quick", f"encoding={ZOO_QUICK}", "seed=0,1"]],
    "variants": [  # scripts/variant_comparison.sh
        [*o, "experiment=zoo_quick", "seed=0,1"] for o in (
            ["encoding=sinusoidal", "encoding.layout=concat"], ["encoding=multiplicative", "encoding.table=learned"],
            ["encoding=rope", "encoding.pairing=interleaved"], ["encoding=shaw", "encoding.max_distance=2,4,64"],
            ["encoding=alibi", "encoding.form=symmetric"], ["encoding=alibi", "encoding.learned_slopes=true"],
            ["encoding=t5", "encoding.per_layer=true"])],
    "ablation_t5": [  # scripts/ablations.sh, t5/
        ["seed=0,1,2", "encoding=t5", "encoding.bias_scale=none"]],
    "ablation_embed_scale": [  # scripts/ablations.sh, embed_scale/
        ["seed=0,1,2", "encoding=sinusoidal,learned,alibi,rope", "model.embed_scale=none"]],
    "budget_study": [  # the five's 488-step runs and 122-step branches (their 1221 and 4883 steps are the
        # matched study's: test below), and T5 unscaled's 4883-step run and branches
        *([*steps, "encoding=alibi,rope,nope,t5,sinusoidal", "seed=0,1,2", "experiment=reference"]
          for steps in (["train.steps=488", "train.save_steps=[98]"], ["train.steps=122", "train.branch_from=PARENT"])),
        *([*steps, "encoding=t5", "encoding.bias_scale=none", "seed=0,1,2", "experiment=reference"]
          for steps in (["train.steps=4883", "train.save_steps=[977,390,98]"],
                        *([f"train.steps={s}", "train.branch_from=PARENT"] for s in (1221, 488, 122))))],
    "extension": [  # scripts/extension_study.sh with SEEDS="0 1 2": parents, baselines, then fine-tunes
        ["experiment=reference", "encoding=rope,alibi", "seed=0,1,2"],
        *([*EXT, "train.steps=1538", "train.save_steps=[990]", "seed=0,1,2"],
          [*EXT, "train.steps=1238", "train.branch_from=PARENT", "seed=0,1,2"]),
        *([*EXT, "train.init_from=PARENT", f"train.steps={steps}", "train.schedule=constant", "train.lr=1e-4",
           "train.warmup_steps=10", *scaled, "seed=0,1,2"] for steps in (100, 400)
          for scaled in ([], *([f"encoding.trained_scaling={k}", "encoding.trained_factor=4", "encoding.original_len=128"]
                               for k in ("pi", "ntk", "yarn"))))],
    "drope": [  # scripts/baseline_zoo_quick.sh's rope and nope (the parents), then scripts/drope.sh
        ["experiment=zoo_quick", "encoding=rope,nope", "seed=0,1,2"],
        *([*DROPE, f"train.steps={s}", *qk, "seed=0,1,2"] for s in (25, 100) for qk in ([], ["model.qk_norm=true"]))],
}


def expand(command: list[str]) -> list[list[str]]:
    """A multirun command's runs: the product of its comma-separated values (not inside [...])."""
    choices = [[f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")] if "[" not in o else [o]
               for o in command]
    return [list(run) for run in itertools.product(*choices)]


HASHES: dict[tuple[str, ...], str | None] = {}  # overrides -> config hash (the seed is not hashed)


def key(study, overrides: list[str], seed: int):
    """A run's key: its config hash, or (a run that starts from another: unhashed) its overrides
    without the parent's run dir."""
    if tuple(overrides) not in HASHES:
        HASHES[tuple(overrides)] = sweep_hash(study, Sweep("driver", tuple(overrides), (seed,)))
    digest = HASHES[tuple(overrides)]
    return (digest, seed) if digest else (tuple(sorted(o for o in overrides if not o.startswith("train.init_from="))),
                                          seed)


def study_runs(study) -> Counter:
    runs = Counter()
    for sweep in (s for s in sweeps(study) if not s.evaluates):  # an evaluation trains no run
        bare = replace(study, common=[])
        for seed in sweep.seeds:
            runs[key(bare, [*study.common, *sweep.overrides], seed)] += 1
    return runs


def driver_runs(study, commands: list[list[str]]) -> Counter:
    runs = Counter()
    bare = replace(study, common=[])
    for command in commands:
        for run in expand(command):
            seed = int(next(o for o in run if o.startswith("seed=")).split("=")[1])
            runs[key(bare, [o for o in run if not o.startswith("seed=")], seed)] += 1
    return runs


@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_a_study_composes_the_runs_of_its_former_driver(name):
    study = load_study(name)
    assert study_runs(study) == driver_runs(study, DRIVERS[name])


def test_the_budget_study_reads_the_matched_study_s_runs_at_5m_and_20m_tokens():
    """The budget study reports the five encodings at 1221 and 4883 steps from the matched study's
    exports: each is the run the budget study would train at that budget (the same config hash), and
    so was the former budget study's (the default experiment with its WSD overrides, 2 seeds)."""
    budget, matched = load_study("budget_study"), load_study("matched")
    assert budget.report["dirs"] == ["results/matched/runs/long", "results/matched/runs/steps1221"]
    assert budget.report["per"] == ["train.steps"] and "train.steps" in budget.report["by"]
    short = [s for s in sweeps(budget) if s.stage == "steps488"]
    assert len(short) == 5
    for sweep in short:
        encoding = next(o for o in sweep.overrides if o.startswith("encoding="))
        for steps, stage in ((4883, "long"), (1221, "steps1221")):
            theirs = next(s for s in sweeps(matched) if s.stage == stage and encoding in s.overrides)
            assert sweep_hash(budget, sweep, [f"train.steps={steps}"]) == sweep_hash(matched, theirs), (encoding, steps)
        former = Sweep("driver", (encoding, *BUDGET, "train.steps=4883"), (0,))
        long = next(s for s in sweeps(matched) if s.stage == "long" and encoding in s.overrides)
        assert sweep_hash(replace(budget, common=[]), former) == sweep_hash(matched, long)


def shipped_keys(folder: str) -> set[tuple[str, int]]:
    keys = set()
    for results in (ROOT / folder).rglob("results.csv"):
        rows = pd.read_csv(results, usecols=["config_hash", "seed"])
        keys |= {(str(h), int(s)) for h, s in zip(rows.config_hash, rows.seed)}
    return keys


# studies whose runs (some of them) ship with their config hashes: (where, how many of the study's runs)
SHIPPED = {
    "baseline_zoo_quick": ("results/baselines/zoo_quick", 15),
    "zoo_quick": ("results/baselines/zoo_quick", 10),  # alibi, rope, t5, sinusoidal, nope; seeds 0, 1
    "drope": ("results/baselines/zoo_quick", 6),  # the parents, rope and nope; seeds 0-2
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_study_has_the_config_hashes_of_its_shipped_runs(name):
    folder, count = SHIPPED[name]
    study = load_study(name)
    shipped = shipped_keys(folder)
    ours = {k for k in study_runs(study) if isinstance(k[0], str)}
    assert len(ours & shipped) == count


def test_the_baseline_zoo_quick_study_finds_its_shipped_runs_done():
    todo, have = plan(load_study("baseline_zoo_quick"))
    assert (todo, have) == ([], 15)


def test_docs_encoding_tables_are_the_tables_their_studies_wrote():
    """docs/encodings.md shows each study's generated encodings table (report ``tables:``) verbatim:
    a table retyped or left behind by a regenerated report is a claim the results no longer make."""
    doc = (ROOT / "docs/encodings.md").read_text()
    shown = []
    for name in study_files([]):
        study = load_study(name)
        if "encodings.md" not in study.report.get("tables", {}):
            continue
        written = (ROOT / study.results / "encodings.md").read_text()
        table = [line for line in written.splitlines() if line.startswith("|")]
        assert "\n".join(table) in doc, f"docs/encodings.md lacks {study.results}/encodings.md's table as written"
        shown.append(name)
    assert {"zoo", "zoo_quick", "new_schemes", "schemes_reference"} <= set(shown)
