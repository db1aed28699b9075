"""Branch a warmup-stable-decay run off a longer one: the same numbers for a fraction of the cost.

Under ``train.schedule=wsd`` (:mod:`posbench.train.optim`) two runs that differ only in
``train.steps`` take the same learning rate at every step before the shorter one's decay
starts, and draw the same batches (the sampler's stream depends on the seed alone). So the
shorter run's state at its decay start *is* the longer run's state at that step. A run with
``train.branch_from=<longer run dir>`` loads that state from the longer run's
``checkpoints/step_<N>.pt`` (kept by its ``train.save_steps``) instead of training the first N
steps again; ``tests/test_branch.py`` checks that the branch ends bit for bit where a run from
scratch ends. A budget study (``posbench study budget_study``) then costs its longest run plus the
decays of the shorter budgets.

Only the start is borrowed: the branch writes its own last.pt, and once it has one it resumes
from it like any run. ``branch_from`` is left out of the config hash, as it does not change
what is trained.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ..config import RunConfig, flat_items, hashed_part
from ..errors import PosbenchError
from ..runs.rundir import RunDir, load_checkpoint


def _comparable(config: dict) -> dict:
    """The hashed keys of a config, flattened, without train.steps (the one key a branch may
    change), with the seed (not hashed, but it fixes the batches and the init)."""
    flat = dict(flat_items(hashed_part(config)))
    flat.pop("train.steps", None)
    return {**flat, "seed": config.get("seed")}


def _differences(ours: dict, theirs: dict) -> list[str]:
    return [f"{k} ({theirs.get(k)} there, {ours.get(k)} here)" for k in sorted(set(ours) | set(theirs))
            if ours.get(k) != theirs.get(k)]


def read_branch_state(rc: RunConfig) -> dict:
    """The checkpoint this run starts from: ``train.branch_from``'s kept checkpoint at this run's
    decay start, after checking that the source is a longer wsd run of the same config and seed."""
    tcfg = rc.train
    source = Path(tcfg.branch_from).expanduser()
    where = f"train.branch_from={tcfg.branch_from!r}"
    if not (source / "config.yaml").is_file():
        raise PosbenchError(f"{where} is not a posbench run dir (no config.yaml inside it); valid: the run dir of "
                            "a longer train.schedule=wsd run of the same config")
    theirs = OmegaConf.to_container(OmegaConf.load(source / "config.yaml"), resolve=True)
    ours = OmegaConf.to_container(rc.tree, resolve=True)
    differ = _differences(_comparable(ours), _comparable(theirs))
    if differ:
        raise PosbenchError(f"{where} is a run of another config: {', '.join(differ[:3])}; valid: a run that "
                            "differs only in train.steps")
    step = tcfg.decay_start()
    if int(theirs["train"]["steps"]) <= step:
        raise PosbenchError(f"{where} trains {theirs['train']['steps']} steps, no more than this run's decay "
                            f"start ({step}); valid: a longer run")
    path = RunDir(source).step_checkpoint(step)
    if not path.is_file():
        kept = sorted(int(p.stem.split("_")[1]) for p in path.parent.glob("step_*.pt"))
        raise PosbenchError(f"{where} has no checkpoint at step {step}, this run's decay start (kept: "
                            f"{', '.join(map(str, kept)) or 'none'}); train it with train.save_steps including {step}")
    return load_checkpoint(path)
