"""The named experiment presets compose to what their comments promise."""

import re

import pytest
import torch

from conftest import ROOT, compose
from posbench.model.build import build_model
from posbench.config import config_hash
from posbench.runs.distributed import World, micro_batches


def test_cpu_quick_is_the_default_comparison():
    default, quick = compose(), compose("experiment=cpu_quick")
    for section in ("model", "data", "train", "eval"):
        assert quick[section] == default[section], section


def test_cpu_full_trains_longer_on_the_same_model_and_data():
    default, full = compose(), compose("experiment=cpu_full")
    assert full.model == default.model and full.data == default.data
    assert full.train.train_len == default.train.train_len
    tokens = full.train.steps * full.train.batch_size * full.train.train_len
    assert tokens == 20_480_000 and tokens / (400 * 32 * 128) == 12.5


def test_alibi_paper_matches_the_papers_wikitext103_setting():
    cfg = compose("experiment=alibi_paper")
    m = cfg.model
    assert (m.n_layers, m.d_model, m.n_heads, m.d_ff, m.dropout) == (16, 1024, 8, 4096, 0.2)
    assert cfg.data.name == "wikitext103" and cfg.train.train_len == 512
    # fairseq --max-tokens 9216 per GPU on 8 GPUs, 286k updates
    assert cfg.train.batch_size * cfg.train.train_len == 9216 * 8
    assert cfg.train.micro_batch_size * cfg.train.train_len == 9216
    assert cfg.train.steps * cfg.train.batch_size * cfg.train.train_len == pytest.approx(21.1e9, rel=0.01)
    for gpus, accum in ((1, 8), (2, 4), (4, 2), (8, 1)):
        assert micro_batches(cfg.train.batch_size, cfg.train.micro_batch_size, World(0, gpus)) == (18, accum)
    lengths = [m * cfg.train.train_len for m in cfg.eval.multiples]
    assert lengths[0] == 512 and lengths[-1] == 16384
    with torch.device("meta"):
        model = build_model(cfg, cfg.data.vocab_size)
    assert model.num_params() == pytest.approx(235e6, rel=0.01)  # the cost estimate's 235M


def test_tasks_quick_trains_a_small_model_on_a_task_and_fits_random_positions():
    from posbench.data.tasks import make_task
    from posbench.config import TaskConfig

    cfg = compose("experiment=tasks_quick", "task=duplicate")
    assert (cfg.model.d_model, cfg.model.n_layers) == (64, 2) and cfg.train.steps == 2000
    assert cfg.task.name == "duplicate" and cfg.task.train_size == 8 and list(cfg.task.eval_multiples) == [1, 2, 4, 8]
    # the comment's L = 256 covers the longest evaluated sequence of every task at 8x
    longest = max(make_task(TaskConfig(name=n)).length(8 * 8) for n in ("copy", "reverse", "duplicate", "sort",
                                                                          "addition", "parity", "recall"))
    assert longest == 197 and "random_positions=256" in (ROOT / "conf/experiment/tasks_quick.yaml").read_text()


def study_budgets() -> list[int]:
    """The budget study's steps, from its stages' train.steps in conf/study/budget_study.yaml."""
    text = (ROOT / "conf/study/budget_study.yaml").read_text()
    return sorted({int(s) for s in re.findall(r"train\.steps=(\d+)", text)})


def test_reference_is_a_budget_of_the_study_and_pools_with_its_runs():
    ref = compose("experiment=reference", "encoding=alibi")
    assert ref.train.steps in study_budgets()
    assert (ref.model, ref.data, ref.eval) == (compose().model, compose().data, compose().eval)
    # a run at that budget as the former budget study started it: branched, compiled, another seed
    study = compose("encoding=alibi", "seed=1", "train.schedule=wsd", "train.decay_frac=0.2", "train.warmup_steps=40",
                    "train.compile=true", f"train.steps={ref.train.steps}", "train.branch_from=outputs/long")
    assert config_hash(ref) == config_hash(study)
    assert config_hash(ref) != config_hash(compose("encoding=alibi", f"train.steps={ref.train.steps}"))  # not cosine
