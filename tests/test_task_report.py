"""The algorithmic tasks' report on hand-made run dirs holding tasks.csv: the Wilson interval and
the exact pooling of per-run means and sds against closed forms and numpy, the t interval over
seeds, the lines' labels, the Markdown tables, the figure files, the verdicts, and the errors."""

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import posbench
from posbench.errors import PosbenchError
from posbench.intervals import pooled_moments, pooled_t_interval, t_quantile, wilson_interval
from posbench.report.build import report
from posbench.eval.results import TASK_COLUMNS
from posbench.report.tasks import read_tasks, summarize_tasks, task_labels, task_report, task_verdicts

Z = 1.959963984540054  # the 0.975 quantile of the standard normal


def t2_quantile(p: float) -> float:
    """Student's t with 2 degrees of freedom, F(t) = 1/2 + t / (2 sqrt(2 + t²)), has the closed-form
    quantile (2p - 1) / sqrt(2p(1 - p))."""
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


# the 0.975 quantile of t with 2 degrees of freedom: 4.3026527297494639 to 17 digits; the often
# quoted 4.302652729911275 (scipy's stdtrit) is 1.6e-10 off
T2 = t2_quantile(0.975)


def wilson_roots(k: int, n: int) -> tuple[float, float]:
    """The Wilson interval as the two p with (k/n - p)² = z² p (1 - p) / n: the roots of
    (1 + z²/n) p² - (2 k/n + z²/n) p + (k/n)² = 0."""
    a, b, c = 1 + Z * Z / n, -(2 * k / n + Z * Z / n), (k / n) ** 2
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


def row(task="copy", encoding="rope", random_positions=0, seed=0, multiple=1, instances=100, exact=1.0,
        token=None, token_sd=0.0, train_size=20, chash=None) -> dict:
    """One tasks.csv row (the run's own intervals are not read by the report; they are filled with 0..1)."""
    return {"task": task, "encoding": encoding, "random_positions": random_positions, "train_size": train_size,
            "eval_size": train_size * multiple, "multiple": multiple, "seed": seed, "step": 1000,
            "instances": instances, "exact_match": exact, "exact_lo": 0.0, "exact_hi": 1.0,
            "token_acc": exact if token is None else token, "token_sd": token_sd, "token_lo": 0.0, "token_hi": 1.0,
            "params": 12345, "config_hash": chash or f"{task}-{encoding}-{random_positions}"}


def write_run(path: Path, *rows: dict) -> Path:
    path.mkdir(parents=True)
    pd.DataFrame(list(rows), columns=TASK_COLUMNS).to_csv(path / "tasks.csv", index=False)
    return path


def cell(summary: pd.DataFrame, label: str, multiple: int = 1, task: str = "copy") -> pd.Series:
    found = summary[(summary.task == task) & (summary.label == label) & (summary.multiple == multiple)]
    assert len(found) == 1, found
    return found.iloc[0]


def test_wilson_interval_is_the_root_pair_of_the_score_equation():
    for k, n in [(0, 20), (7, 20), (20, 20), (37, 50), (1, 1)]:
        iv = wilson_interval(k, n)
        low, high = wilson_roots(k, n)
        assert iv.estimate == k / n and iv.method == "wilson"
        assert iv.low == pytest.approx(max(low, 0.0), abs=1e-12) and iv.high == pytest.approx(min(high, 1.0), abs=1e-12)
    assert wilson_interval(0, 20).low == 0.0 and wilson_interval(0, 20).high > 0.1  # a width at p = 0
    assert math.isnan(wilson_interval(0, 0).low)


def test_pooled_moments_equal_numpy_over_the_union_of_instances():
    rng = np.random.default_rng(0)
    groups = [rng.uniform(0, 1, n) for n in (5, 17, 1, 30)]  # per-instance token fractions of four runs
    means = [g.mean() for g in groups]
    sds = [g.std(ddof=1) if g.size > 1 else math.nan for g in groups]  # one instance: no sd
    mean, sd, n = pooled_moments(means, sds, [g.size for g in groups])
    union = np.concatenate(groups)
    assert n == union.size and mean == pytest.approx(union.mean(), abs=1e-12)
    assert sd == pytest.approx(union.std(ddof=1), abs=1e-12)
    # 3 instances: t with 2 degrees of freedom, whose quantile has a closed form
    iv = pooled_t_interval([0.5, 0.9], [0.1 * math.sqrt(2), math.nan], [2, 1])
    three = np.array([0.4, 0.6, 0.9])
    assert T2 == pytest.approx(4.3026527297494639, abs=1e-14) and T2 == pytest.approx(4.302652729911275, abs=1e-9)
    half = T2 * three.std(ddof=1) / math.sqrt(3)
    assert (iv.low, iv.high) == pytest.approx((three.mean() - half, three.mean() + half), abs=1e-9)
    assert math.isnan(pooled_t_interval([0.5], [math.nan], [1]).low)


def test_three_seeds_give_the_mean_and_a_t_interval_over_seeds(tmp_path):
    exact, token = [0.6, 0.7, 0.95], [0.8, 0.85, 0.97]
    for seed in range(3):
        write_run(tmp_path / f"s{seed}", row(seed=seed, exact=exact[seed], token=token[seed], token_sd=0.2))
    got = cell(summarize_tasks(read_tasks([tmp_path])), "rope")
    assert (got.basis, got.seeds, got.instances, got.exact_method, got.token_method) == ("seeds", 3, 300, "t", "t")
    for prefix, values in (("exact", exact), ("token", token)):
        mean, sd = sum(values) / 3, math.sqrt(sum((v - sum(values) / 3) ** 2 for v in values) / 2)
        half = T2 * sd / math.sqrt(3)
        assert got[prefix + ("_match" if prefix == "exact" else "_acc")] == pytest.approx(mean, abs=1e-12)
        assert got[f"{prefix}_std"] == pytest.approx(sd, abs=1e-12)
        assert got[f"{prefix}_lo"] == pytest.approx(max(0.0, mean - half), abs=1e-9)
        assert got[f"{prefix}_hi"] == pytest.approx(min(1.0, mean + half), abs=1e-9)
    assert got.exact_hi == 1.0  # 0.75 + 0.47: clipped


def test_fewer_seeds_pool_the_instances(tmp_path):
    rng = np.random.default_rng(1)
    per_instance = [rng.uniform(0.3, 1.0, 20), rng.uniform(0.5, 1.0, 40)]  # token fractions, seed 0 and 1
    for seed, (k, x) in enumerate(zip((7, 20), per_instance)):
        write_run(tmp_path / f"s{seed}", row(seed=seed, instances=x.size, exact=k / x.size, token=x.mean(),
                                             token_sd=x.std(ddof=1)))
    got = cell(summarize_tasks(read_tasks([tmp_path])), "rope")
    assert (got.basis, got.seeds, got.instances, got.exact_method, got.token_method) == \
        ("instances", 2, 60, "wilson", "pooled t")
    low, high = wilson_roots(27, 60)
    assert (got.exact_match, got.exact_lo, got.exact_hi) == pytest.approx((27 / 60, low, high), abs=1e-12)
    assert got.exact_std == pytest.approx(np.std([7 / 20, 20 / 40], ddof=1))  # std over the 2 seeds
    union = np.concatenate(per_instance)
    half = t_quantile(0.975, 59) * union.std(ddof=1) / math.sqrt(60)
    assert (got.token_acc, got.token_lo, got.token_hi) == pytest.approx(
        (union.mean(), union.mean() - half, union.mean() + half), abs=1e-12)
    one = cell(summarize_tasks(pd.DataFrame([row(instances=50, exact=0.5)]).assign(run="r")), "rope")
    assert math.isnan(one.exact_std) and one.seeds == 1


def test_labels_name_randomized_positions_and_their_range_only_when_it_varies():
    df = pd.DataFrame([row(encoding="rope"), row(encoding="rope", random_positions=256), row(encoding="nope"),
                       row(encoding="alibi", random_positions=512), row(encoding="alibi", random_positions=1024)])
    assert task_labels(df).tolist() == ["rope", "rope +rand", "nope", "alibi +rand L=512", "alibi +rand L=1024"]


def separated_and_overlapping(tmp_path: Path) -> Path:
    """copy: rope +rand holds up at 8x, nope collapses (2 seeds, pooled); sort: both near 50% at 8x."""
    sweep = tmp_path / "sweep"
    for seed in (0, 1):
        write_run(sweep / f"copy/rand/{seed}", *(row(encoding="rope", random_positions=256, seed=seed, multiple=m,
                                                   exact=e) for m, e in ((1, 1.0), (2, 0.97), (4, 0.93), (8, 0.9))))
        write_run(sweep / f"copy/nope/{seed}", *(row(encoding="nope", seed=seed, multiple=m, exact=e)
                                                 for m, e in ((1, 1.0), (2, 0.4), (4, 0.1), (8, 0.05))))
        write_run(sweep / f"sort/rope/{seed}", *(row(task="sort", seed=seed, multiple=m, exact=e)
                                                 for m, e in ((1, 0.99), (8, 0.5))))
        write_run(sweep / f"sort/nope/{seed}", *(row(task="sort", encoding="nope", seed=seed, multiple=m, exact=e)
                                                 for m, e in ((1, 0.98), (8, 0.55))))
    return sweep


def test_verdicts_name_only_lines_whose_intervals_do_not_overlap(tmp_path):
    summary = summarize_tasks(read_tasks([separated_and_overlapping(tmp_path)]))
    nope, rand = cell(summary, "nope", 8), cell(summary, "rope +rand", 8)
    assert nope.exact_hi < rand.exact_lo
    copy, sort = task_verdicts(summary)
    assert copy == (f"copy at 8x (n=160): nope 5.0% [{100 * nope.exact_lo:.1f}, {100 * nope.exact_hi:.1f}] below "
                    f"rope +rand 90.0% [{100 * rand.exact_lo:.1f}, {100 * rand.exact_hi:.1f}] (95% intervals do not "
                    "overlap)")
    assert sort.startswith("sort at 8x (n=160): not distinguishable: every line's 95% interval of exact match "
                           "overlaps that of the highest, nope 55.0% [")
    one = summarize_tasks(read_tasks([tmp_path / "sweep/sort/rope"]))
    assert task_verdicts(one) == ["sort at 8x (n=160): one line, rope 50.0% [43.1, 56.9]: nothing to compare"]


def test_report_of_tasks_only_writes_tables_figure_and_no_perplexity_report(tmp_path):
    sweep = separated_and_overlapping(tmp_path)
    done = report([sweep])
    names = sorted(p.name for p in sweep.iterdir() if p.is_file())
    assert names == ["tasks.png", "tasks.svg", "tasks_report.csv", "tasks_report.md"]
    assert sorted(p.name for p in done.files) == names and all((sweep / n).stat().st_size > 0 for n in names)
    assert done.summary.empty and done.table == "" and done.tasks is not None
    md = (sweep / "tasks_report.md").read_text()
    assert "## copy" in md and "## sort" in md and md.index("## copy") < md.index("## sort")
    assert "| line | seeds | instances | 1x (n=20) | 2x (n=40) | 4x (n=80) | 8x (n=160) |" in md
    assert "| nope | 2 | 200 | 100.0% [98.1, 100.0] | 40.0% [33.5, 46.9] |" in md  # Wilson of 80/200
    assert "Token accuracy (% of answer tokens right, mean over instances):" in md
    assert "Verdict: copy at 8x (n=160): nope 5.0% [" in md and "t interval over the seed means" in md
    tidy = pd.read_csv(sweep / "tasks_report.csv")
    assert len(tidy) == 4 + 4 + 2 + 2 and set(tidy.basis) == {"instances"}
    svg = ET.parse(sweep / "tasks.svg")
    ids = {e.get("id") for e in svg.iter() if e.get("id")}
    assert {"task:copy:rope +rand", "task:sort:nope", "interval:copy:nope", "train_size"} <= ids
    assert {"token:copy:rope +rand", "token:sort:nope", "token_interval:copy:nope"} <= ids
    texts = {t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")}
    assert {"copy (train size 20)", "rope +rand", "train size", "exact match (%)", "token accuracy (%)"} <= texts
    assert "setup" in ids and "0.0123M params, 1,000 steps" in " ".join(t for t in texts if t)  # the caption
    assert task_report([sweep], tmp_path / "again").files[-1] == tmp_path / "again/tasks.svg"


def test_report_with_results_and_tasks_writes_both(tmp_path):
    from test_report import rows, write_run as write_results_run

    write_results_run(tmp_path / "lm/alibi", rows("alibi", 0, {32: 10.0, 64: 10.5}), tokens=False)
    write_run(tmp_path / "tasks/rope", row(), row(multiple=2, exact=0.5))
    done = report([tmp_path], tmp_path / "out", reference=None)
    assert {"report.csv", "report.md", "tasks_report.md", "tasks.png"} <= {p.name for p in done.files}
    assert list(done.summary.label) == ["alibi", "alibi"] and len(done.tasks.summary) == 2
    assert "failed" not in (tmp_path / "out/tasks_report.md").read_text()


def test_errors_name_the_paths_and_the_files_looked_for(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PosbenchError, match=r"^report: neither results.csv nor tasks.csv under .*empty; pass run"):
        report([tmp_path / "empty"])
    with pytest.raises(PosbenchError, match=r"^report: no tasks.csv under .*empty; pass run or sweep"):
        task_report([tmp_path / "empty"])
    write_run(tmp_path / "a", row(seed=0, chash="h1"))
    write_run(tmp_path / "b", row(seed=1, chash="h2"))
    with pytest.raises(PosbenchError, match=r"cannot pool copy rope at eval_size=20 over runs whose configs differ "
                                            r"\(config_hash h1 in .*a; h2 in .*b\)"):
        summarize_tasks(read_tasks([tmp_path / "a", tmp_path / "b"]))
    write_run(tmp_path / "c", row(seed=0))
    write_run(tmp_path / "d", row(seed=0))
    with pytest.raises(PosbenchError, match=r"copy rope at eval_size=20 has 2 rows for seed\(s\) 0"):
        summarize_tasks(read_tasks([tmp_path / "c", tmp_path / "d"]))
    pd.DataFrame({"task": ["copy"]}).to_csv(tmp_path / "e.csv", index=False)
    (tmp_path / "f").mkdir()
    (tmp_path / "e.csv").rename(tmp_path / "f/tasks.csv")
    with pytest.raises(PosbenchError, match=r"lacks column\(s\) encoding, random_positions"):
        read_tasks([tmp_path / "f"])


def test_cli_prints_the_task_tables(tmp_path):
    sweep = separated_and_overlapping(tmp_path)
    proc = posbench("report", sweep)
    assert "## copy" in proc.stdout and "Verdict: sort at 8x (n=160): not distinguishable" in proc.stdout
    assert "tasks_report.md" in proc.stdout and not (sweep / "report.md").exists()
    bad = posbench("report", tmp_path / "sweep/copy/nope/0/tasks.csv", tmp_path / "nothing", check=False)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_seeds_that_agree_exactly_keep_the_pooled_instances_interval():
    """Three seeds at 0% exact match: the t interval over seeds has width 0; the reported one is
    the Wilson interval of the 3 x 256 pooled instances, [0, 1.92 / (768 + 1.92^2)...]."""
    df = pd.DataFrame([row(seed=s, instances=256, exact=0.0) for s in range(3)])
    zero = cell(summarize_tasks(df), "rope")
    assert zero.basis == "seeds" and zero.exact_match == 0.0
    assert zero.exact_lo == 0.0 and zero.exact_hi == pytest.approx(wilson_roots(0, 768)[1])
    assert zero.exact_hi == pytest.approx(Z * Z / (768 + Z * Z))  # the Wilson bound at k = 0 in closed form
    spread = pd.DataFrame([row(seed=s, instances=256, exact=e) for s, e in enumerate([0.375, 0.5, 0.625])])
    wide = cell(summarize_tasks(spread), "rope")  # seeds that disagree: the t interval over seeds stands
    half = T2 * 0.125 / math.sqrt(3)
    assert (wide.exact_lo, wide.exact_hi) == pytest.approx((0.5 - half, 0.5 + half))
