"""`posbench study NAME`: a study file's runs keyed by (config hash, seed), trained only when no
export or finished run holds them, exported, reported; one-line errors for a bad study."""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from posbench.errors import PosbenchError
from posbench.eval.longppl import load_keys
from posbench.study import load_study, plan, report_command, study_files, sweep_hash, sweeps
from posbench.study.derived import longppl

ROOT = Path(__file__).resolve().parents[1]


def posbench(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "posbench.cli", *args], capture_output=True, text=True, cwd=cwd)


def write_study(tmp_path: Path, body: str, name: str = "mini") -> Path:
    (tmp_path / "study").mkdir(parents=True, exist_ok=True)
    (tmp_path / "study" / f"{name}.yaml").write_text(body)
    return tmp_path


MINI = """description: one smoke run
out: {tmp}/out
runs: {tmp}/runs
results: {tmp}/results
common: [experiment=smoke, train.steps=4, "eval.multiples=[1,2]"]
stages:
  - name: a
    grid: {{encoding: [alibi], seed: [0]}}
report:
  tables: {{lines.txt: {tmp}/count.py}}
"""


def test_the_shipped_studies_load_and_expand():
    files = study_files([])
    assert "scale" in files
    for name in files:
        study = load_study(name)
        assert sweeps(study), name


# the shipped studies whose runs ship: (runs done, the seeds each sweep still lacks)
# zoo: 82, gate, differential, sinks, hybrids, KDA
SHIPPED = {"headline": (15, {(3, 4)}), "zoo": (102, set()), "new_schemes": (33, set()), "train_len": (19, set()),
           "scale_matched": (4, {(1, 2), (0, 1, 2)})}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_study_finds_its_shipped_runs_done(name):
    """Each run of the file composes to the (config hash, seed) of a run exported under its
    ``runs``: the study file says what those runs were trained with (new_schemes' third seeds
    included)."""
    todo, have = plan(load_study(name))
    done, missing = SHIPPED[name]
    assert have == done and {s.seeds for s in todo} == missing


def test_the_headline_trains_only_the_runs_no_export_holds(tmp_path):
    """Exports moved to another folder still count: (encoding, seed) pairs alibi 0, 1 and rope 0
    are done, every other run of the grid is trained, each encoding's sweep with its own seeds."""
    import shutil

    study = load_study("headline")
    for enc, seed in [("alibi", 0), ("alibi", 1), ("rope", 0)]:
        shutil.copytree(study.runs / enc / f"seed={seed}", tmp_path / "runs" / f"moved_{enc}" / f"seed={seed}")
    study.runs, study.out = tmp_path / "runs", tmp_path / "out"
    todo, have = plan(study)
    assert have == 3
    assert {(s.stage, s.folder): s.seeds for s in todo} == {
        ("headline", "sinusoidal"): (0, 1, 2), ("headline", "rope"): (1, 2), ("headline", "t5"): (0, 1, 2),
        ("headline", "alibi"): (2,), ("headline", "nope"): (0, 1, 2),
        **{("breaking_seeds", f"breaking_seeds/{e}"): (3, 4) for e in ("sinusoidal", "rope", "nope")}}


def test_the_headline_longppl_runs_are_the_matched_studys_long_runs():
    """headline_longppl's headline stage trains in the matched study's out, in its long stage's
    folders, with its overrides: the same run dirs and config hashes, and the headline's hash (so a
    run either study trained is done for the other, and its per-token NLLs judge it)."""
    longppl, matched, headline = (load_study(n) for n in ("headline_longppl", "matched", "headline"))
    assert longppl.out == matched.out
    mine = [s for s in sweeps(longppl) if s.stage == "headline"]
    theirs = {s.folder: s for s in sweeps(matched) if s.stage == "long"}
    first = {s.folder: s for s in sweeps(headline)}
    assert sorted(s.folder for s in mine) == sorted(theirs) and len(mine) == 5
    for sweep in mine:
        assert sweep.overrides == theirs[sweep.folder].overrides and sweep.seeds == theirs[sweep.folder].seeds
        assert sweep_hash(longppl, sweep) == sweep_hash(headline, first[sweep.folder.split("/")[1]])
    assert all(s.folder.startswith("longppl_judge/") for s in sweeps(longppl) if s.stage != "headline")


def test_the_report_commands_are_the_shipped_reports():
    """new_schemes reports the headline's runs beside its own, with the zoo's --by keys, its contrasts
    (each scheme's ratio over its base's) and table."""
    study = load_study("new_schemes")
    command = report_command(study)[3:]
    assert command[:8] == [
        "report", "results/baselines/headline", "results/new_schemes/runs", "--out", "results/new_schemes",
        "--by=model.length_scaling", "--by=model.qk_norm", "--by=model.window"]
    assert command[-2:] == ["--missing-contrasts", "--log-y"] and len(command) == 8 + 8 + 2
    assert command[8] == "--contrast={encoding: p_rope}/{encoding: rope}"  # line keys (posbench.report.keys)
    assert study.report["tables"] == {"encodings.md": "encodings"}
    from posbench.report.encoding_table import TABLES
    from posbench.study.spec import TABLE_KINDS

    assert tuple(TABLES) == TABLE_KINDS  # the study files' check knows every table the report writes
    assert report_command(load_study("headline"))[3:] == [
        "report", "results/baselines/headline", "--out", "results/headline", "--log-y"]


def test_a_folder_names_a_grid_points_runs(tmp_path):
    body = """out: o
runs: r
results: s
folder: "{stage}/{encoding}"
stages:
  - name: x
    grid: {encoding: [rope, alibi], seed: [0, 1]}
    overrides: [model.qk_norm=true]
"""
    write_study(tmp_path, body)
    assert [s.folder for s in sweeps(load_study("mini", [tmp_path]))] == ["x/rope", "x/alibi"]
    write_study(tmp_path, body.replace('"{stage}/{encoding}"', '"{stage}/{point}"'))  # the default
    assert sweeps(load_study("mini", [tmp_path]))[0].folder == "x/encoding=rope,model.qk_norm=true"
    write_study(tmp_path, body.replace('"{stage}/{encoding}"', '"{model}"'))
    with pytest.raises(PosbenchError, match=r"folder '\{model\}' names a key stage x lacks; valid keys: stage, point, "
                                            "encoding"):
        sweeps(load_study("mini", [tmp_path]))
    write_study(tmp_path, body.replace('"{stage}/{encoding}"', '"{stage}"'))
    with pytest.raises(PosbenchError, match="x encoding=rope,model.qk_norm=true and x encoding=alibi,"
                                            "model.qk_norm=true share the folder 'x'"):
        sweeps(load_study("mini", [tmp_path]))


def test_a_grid_expands_per_stage_with_its_seeds(tmp_path):
    write_study(tmp_path, """out: o
runs: r
results: s
stages:
  - name: x
    grid: {model: [tiny, small], encoding: [rope, alibi], seed: [0, 1, 2]}
    overrides: [train.compile=false]
  - name: y
    grid: {encoding: nope}
""")
    got = sweeps(load_study("mini", [tmp_path]))
    assert [(s.stage, s.overrides, s.seeds) for s in got][:2] == [
        ("x", ("model=tiny", "encoding=rope", "train.compile=false"), (0, 1, 2)),
        ("x", ("model=tiny", "encoding=alibi", "train.compile=false"), (0, 1, 2))]
    assert len(got) == 5 and got[-1].overrides == ("encoding=nope",) and got[-1].seeds == (0,)
    assert [s.stage for s in sweeps(load_study("mini", [tmp_path]), only=["y"])] == ["y"]


@pytest.mark.parametrize("body, message", [
    ("out: o\nruns: r\nresults: s\nstages: [{name: a, grid: {encoding: [rope]}}]\nlaunch: 3\n", "unknown key 'launch'"),
    ("out: o\nruns: r\nstages: [{name: a, grid: {encoding: [rope]}}]\n", "lacks 'results'"),
    ("out: o\nruns: r\nresults: s\nstages: [{name: a}]\n", "needs a name and a grid"),
    ("out: o\nruns: [r\n", r"mini.yaml line 3, column 1: expected ',' or '\]', but got '<stream end>' \(not valid YAML\); "
     "valid: a YAML mapping of description, out"),
    ("- out: o\n", "mini.yaml holds list, not a mapping"),
    ("out: o\nruns: r\nresults: s\ncommon: experiment=smoke\nstages: [{name: a, grid: {}}]\n",
     "mini.yaml common is 'experiment=smoke' \\(str\\); valid: a list of strings$"),
    ("out: o\nruns: r\nresults: s\nstages: [{name: a, grid: {}, eval: sure}]\n",
     "stage a eval is 'sure' \\(str\\); valid: true or false$"),
    ("out: o\nruns: r\nresults: s\nstages: [{name: a, grid: {seed: {a: 1}}}]\n", "stage a grid seed is \\{'a': 1\\}"),
    ("out: o\nruns: r\nresults: s\nstages: {name: a}\n", "stages is \\{'name': 'a'\\} \\(dict\\); valid: a list of stages"),
    ("out: o\nruns: r\nresults: s\nstages: [{name: a, grid: {}}]\nreport: {contrasts: [[a]]}\n",
     "report contrasts is \\[\\['a'\\]\\] \\(list\\); valid: a list of \\[line, line\\] pairs"),
])
def test_a_bad_study_file_is_one_line(tmp_path, body, message):
    write_study(tmp_path, body)
    with pytest.raises(PosbenchError, match=message):
        load_study("mini", [tmp_path])


def test_a_broken_study_file_is_listed_as_broken_beside_the_others(tmp_path):
    write_study(tmp_path, "out: o\nruns: [r\n", name="broken")
    write_study(tmp_path, MINI.format(tmp=tmp_path))
    r = posbench("study", "--config-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    listed = dict(line.split(None, 1) for line in r.stdout.splitlines())
    assert listed["mini"] == "one smoke run" and "headline" in listed
    assert listed["broken"].startswith(f"broken: {tmp_path / 'study' / 'broken.yaml'} line 3, column 1: ")
    r = posbench("study", "--config-dir", str(tmp_path), "broken")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "(not valid YAML)" in r.stderr


def test_a_shipped_study_that_cannot_start_here_never_advises_removing_shipped_files():
    """drope's branches start from its parents' checkpoints, which results/ does not ship: the plan
    says so, and how to train them whole in folders of one's own."""
    r = posbench("study", "drope", "--step", "plan")
    assert r.returncode == 0 and "cannot start (below)" in r.stdout
    lines = [x for x in r.stdout.splitlines() if "cannot start: its parent's run" in x]
    assert lines and all("the project ships its runs' exports, not their checkpoints; to train the seed whole, copy "
                         "the study file into DIR/study/" in x for x in lines)
    assert "remove results/" not in r.stdout


def test_unknown_study_and_stage_are_one_line_errors(tmp_path):
    r = posbench("study", "nosuch")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "'nosuch' is not known; valid choices:" in r.stderr
    assert "scale" in r.stderr
    r = posbench("study", "scale", "--only", "huge", "--step", "plan")
    assert r.returncode != 0 and "--only 'huge' is not one of its stages; valid choices: tiny, tiny_seeds, small, base" in r.stderr


@pytest.mark.slow
def test_a_study_trains_exports_reports_and_resumes_by_hash(tmp_path):
    """The run trains once; then neither deleting its run dir nor moving its export makes the
    study train it again: the (config hash, seed) of the export says it is done."""
    cfg = write_study(tmp_path, MINI.format(tmp=tmp_path))
    (tmp_path / "count.py").write_text("import sys; print(len(open(sys.argv[1]).readlines()))")
    r = posbench("study", "--config-dir", str(cfg), "mini", "--jobs", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 of 1 runs done; 1 to train" in r.stdout and "exported 1 run(s)" in r.stdout
    export = tmp_path / "runs" / "a" / "encoding=alibi" / "seed=0"
    assert {"config.yaml", "results.csv", "blocks.npz"} <= {p.name for p in export.iterdir()}
    assert (tmp_path / "results" / "report.md").is_file()
    assert (tmp_path / "results" / "lines.txt").read_text() == "3\n"  # report.csv: a header, two lengths
    import shutil

    shutil.rmtree(tmp_path / "out")
    (tmp_path / "runs" / "a" / "encoding=alibi").rename(tmp_path / "runs" / "a" / "renamed")
    study = load_study("mini", [cfg])
    todo, have = plan(study)
    assert (todo, have) == ([], 1)
    r = posbench("study", "--config-dir", str(cfg), "mini", "--step", "plan")
    assert r.returncode == 0 and "1 of 1 runs done; 0 to train" in r.stdout
    # another seed is another run
    (cfg / "study" / "mini.yaml").write_text(MINI.format(tmp=tmp_path).replace("seed: [0]", "seed: [0, 1]"))
    todo, have = plan(load_study("mini", [cfg]))
    assert have == 1 and [s.seeds for s in todo] == [(1,)]


def test_runs_are_exported_while_their_sweep_still_runs(tmp_path, monkeypatch, capsys):
    """A sweep whose seeds run one after another: its finished runs are looked for every
    EXPORT_EVERY seconds, not only when the whole sweep ends, and the sweep's last line counts the
    runs exported while it ran (the export at its end finds them written already)."""
    import posbench.study.run as st

    write_study(tmp_path, MINI.format(tmp=tmp_path))
    study = load_study("mini", [tmp_path])
    calls = []
    monkeypatch.setattr(st, "EXPORT_EVERY", 0.5)
    monkeypatch.setattr(st, "train_command", lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(3)"])

    def export(study, sweep):  # the run is found finished once, at the first look
        calls.append(time.monotonic())
        return [tmp_path / "runs" / "seed=0"] if len(calls) == 1 else []

    monkeypatch.setattr(st, "export", export)
    start = time.monotonic()
    assert st.train(study, sweeps(study), jobs=1) == []
    assert len(calls) >= 3 and calls[0] - start < 2.5  # during the sweep, then at its end
    out = capsys.readouterr().out
    assert f"exported {tmp_path / 'runs' / 'seed=0'}" in out and "a encoding=alibi done; exported 1 run(s)" in out
    assert out.rstrip().endswith("a encoding=alibi done; exported 1 run(s); 1 of the 1 run(s) of this command done")


BRANCHED = """out: {tmp}/out
runs: {tmp}/runs
results: {tmp}/results
folder: "{{stage}}/{{encoding}}"
common: [experiment=smoke, train.schedule=wsd, train.warmup_steps=1, train.decay_frac=0.5, "eval.multiples=[1,2]"]
stages:
  - name: long
    grid: {{encoding: [alibi, rope], seed: [0, 1]}}
    overrides: [train.steps=8, "train.save_steps=[2]"]
  - name: short
    from: long
    grid: {{encoding: [alibi, rope], seed: [0, 1]}}
    overrides: [train.steps=4, "train.branch_from={{from}}"]
"""


def test_a_stage_from_another_names_the_same_points_run_dirs(tmp_path):
    write_study(tmp_path, BRANCHED.format(tmp=tmp_path))
    study = load_study("mini", [tmp_path])
    short = [s for s in sweeps(study) if s.stage == "short"]
    assert [s.parent for s in short] == ["long/alibi", "long/rope"]
    assert f"train.branch_from='{tmp_path}/out/long/rope/seed=${{seed}}'" in short[1].overrides
    assert all(s.parent == "" for s in sweeps(study) if s.stage == "long")
    # the branch's hash leaves branch_from out: the same as a run of 4 steps from scratch
    from dataclasses import replace

    assert sweep_hash(study, short[0]) == sweep_hash(study, replace(short[0], overrides=short[0].overrides[:-1]))
    bad = BRANCHED.format(tmp=tmp_path).replace("from: long", "from: longer")
    write_study(tmp_path, bad)
    with pytest.raises(PosbenchError, match=r"stage short has from: 'longer', which is not an earlier stage; "
                                            r"valid choices: long"):
        sweeps(load_study("mini", [tmp_path]))


def test_a_branch_starts_after_its_parent_and_not_at_all_when_it_failed(tmp_path, monkeypatch):
    import posbench.study.run as st

    write_study(tmp_path, BRANCHED.format(tmp=tmp_path))
    study = load_study("mini", [tmp_path])
    events = []

    def command(study, sweep, jobs, extra=()):
        fail = sweep.folder == "long/rope"
        code = f"import time; time.sleep(0.5); raise SystemExit({int(fail)})"
        events.append(("start", sweep.folder, time.monotonic()))
        return [sys.executable, "-c", code]

    monkeypatch.setattr(st, "train_command", command)
    monkeypatch.setattr(st, "export", lambda study, sweep: events.append(("end", sweep.folder, time.monotonic())) or [])
    failed = st.train(study, sweeps(study), jobs=8)
    started = {f: t for kind, f, t in events if kind == "start"}
    ended = {f: t for kind, f, t in events if kind == "end"}
    assert set(started) == {"long/alibi", "long/rope", "short/alibi"}  # short/rope: its parent failed
    assert started["short/alibi"] >= ended["long/alibi"]
    assert any(f.endswith("long/rope.log") for f in failed)
    assert any("short/rope.log (not started: long/rope failed)" in f for f in failed)


def test_with_one_job_a_lines_branches_start_before_the_next_lines_run(tmp_path, monkeypatch):
    """jobs=1: long/alibi, then its branch short/alibi, then long/rope and short/rope, not the
    file's order (both long runs first): a study cut off early holds whole lines."""
    import posbench.study.run as st

    write_study(tmp_path, BRANCHED.format(tmp=tmp_path))
    study = load_study("mini", [tmp_path])
    started = []

    def command(study, sweep, jobs, extra=()):
        started.append(sweep.folder)
        return [sys.executable, "-c", "pass"]

    monkeypatch.setattr(st, "train_command", command)
    monkeypatch.setattr(st, "export", lambda study, sweep: [])
    assert st.train(study, sweeps(study), jobs=1) == []
    assert started == ["long/alibi", "short/alibi", "long/rope", "short/rope"]


def test_each_sweeps_line_tallies_the_commands_runs_and_the_time_left_at_its_pace(tmp_path, monkeypatch, capsys):
    """Four sweeps of two seeds one after another, each a second long: after the first, 2 of the
    8 runs are done and the other 6 take about three times what the first took; a failed sweep's
    runs are not done but no longer to wait for; the last line has no time left to tell."""
    import re

    import posbench.study.run as st

    write_study(tmp_path, BRANCHED.format(tmp=tmp_path))
    study = load_study("mini", [tmp_path])

    def command(study, sweep, jobs, extra=()):
        return [sys.executable, "-c", f"import time; time.sleep(1); raise SystemExit({int(sweep.folder == 'short/alibi')})"]

    monkeypatch.setattr(st, "train_command", command)
    monkeypatch.setattr(st, "export", lambda study, sweep: [])
    start = time.monotonic()
    assert len(st.train(study, sweeps(study), jobs=1)) == 1
    took = time.monotonic() - start
    lines = [x for x in capsys.readouterr().out.splitlines() if "run(s) of this command done" in x]
    assert [re.search(r"; (\d+) of the 8 run", x).group(1) for x in lines] == ["2", "2", "4", "6"]
    first = re.search(r"2 of the 8 run\(s\) of this command done, about ([\d.]+) s left at its pace so far$", lines[0])
    assert first and 3 * 1.0 <= float(first.group(1)) <= 3 * took / 4 + 3  # 3x the first sweep's 1-2 s
    assert "short encoding=alibi" in lines[1] and "FAILED (exit 1)" in lines[1]
    second = re.search(r"2 of the 8 run\(s\) of this command done, about ([\d.]+) s left", lines[1])
    assert second and 2 * 1.0 <= float(second.group(1)) <= took  # 4 settled in two sweeps of 1-2 s, 4 to go
    assert lines[-1].endswith("6 of the 8 run(s) of this command done")


def test_a_branch_whose_parent_trained_elsewhere_is_named_and_not_started(tmp_path, monkeypatch):
    """long/rope's two seeds are exported, but only seed 0's run dir (with its checkpoints) is here:
    short/rope's seed 1 cannot branch, so the study trains the rest, names that seed and the exports
    to remove to train it whole, and exits non-zero at the end."""
    write_study(tmp_path, BRANCHED.format(tmp=tmp_path))
    study = load_study("mini", [tmp_path])
    (long_rope,) = [s for s in sweeps(study) if s.folder == "long/rope"]
    digest = sweep_hash(study, long_rope)
    for seed in (0, 1):
        export = tmp_path / "runs" / "long" / "rope" / f"seed={seed}"
        export.mkdir(parents=True)
        pd.DataFrame({"config_hash": [digest], "seed": [seed]}).to_csv(export / "results.csv", index=False)
    (tmp_path / "out" / "long" / "rope" / "seed=0").mkdir(parents=True)
    (tmp_path / "out" / "long" / "rope" / "seed=0" / "config.yaml").write_text("seed: 0\n")
    from posbench.study.planning import orphaned

    todo, have = plan(study)
    assert have == 2 and [(s.folder, s.seeds) for s in todo] == [
        ("long/alibi", (0, 1)), ("short/alibi", (0, 1)), ("short/rope", (0, 1))]
    keep, lines = orphaned(study, todo)
    assert [(s.folder, s.seeds) for s in keep] == [("long/alibi", (0, 1)), ("short/alibi", (0, 1)), ("short/rope", (0,))]
    assert lines == [f"short of long/rope seed=1 cannot start: its parent's run {tmp_path}/out/long/rope/seed=1 is "
                     "not here (its export is), and a branch starts from that run's checkpoints; to train the seed "
                     f"whole, remove {tmp_path}/runs/long/rope/seed=1"]
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--step", "plan")
    assert r.returncode == 0, r.stderr
    assert "study mini: 2 of 8 runs done; 5 to train, 1 cannot start (below)" in r.stdout
    assert f"study mini: {lines[0]}" in r.stdout
    (short_rope,) = [line for line in r.stdout.splitlines() if "hydra.sweep.dir=" in line and "out/short/rope" in line]
    assert " seed=0 " in short_rope and "seed=0,1" not in short_rope
    import posbench.study.run as st

    trained = []
    monkeypatch.setattr(st, "train", lambda study, todo, jobs, extra=(), stop=None: trained.extend(todo) or [])
    with pytest.raises(PosbenchError, match=rf"^study mini: 1 branch run\(s\) could not start, their parents' runs "
                                            rf"not under {tmp_path}/out; valid: what the lines above name \(train those "
                                            rf"seeds whole as they say"):
        st.main(["--config-dir", str(tmp_path), "mini", "--step", "train"])
    assert [(s.folder, s.seeds) for s in trained] == [(s.folder, s.seeds) for s in keep]  # the rest trained first


@pytest.mark.slow
def test_a_branched_study_trains_its_branches_from_the_long_runs(tmp_path):
    """A real two-stage study: the short runs branch off the long runs' step-2 checkpoints and
    equal a 4-step run from scratch of their config hash (tests/test_branch.py checks the numbers)."""
    write_study(tmp_path, BRANCHED.format(tmp=tmp_path).replace("seed: [0, 1]", "seed: [0]")
                .replace("encoding: [alibi, rope]", "encoding: [rope]"))
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--jobs", "2", "--step", "train")
    assert r.returncode == 0, r.stdout + r.stderr
    log = (tmp_path / "out" / "short" / "rope.log").read_text()
    assert f"train.branch_from='{tmp_path}/out/long/rope/seed=${{seed}}'" in log
    assert (tmp_path / "runs" / "short" / "rope" / "seed=0" / "blocks.npz").is_file()
    assert (tmp_path / "runs" / "long" / "rope" / "seed=0" / "blocks.npz").is_file()
    # the two budgets of the line: the matched table reads it where its ppl at train_len is the target
    r = posbench("report", str(tmp_path / "runs"), "--matched", "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stdout + r.stderr
    table = pd.read_csv(tmp_path / "rep" / "matched.csv")
    assert list(table.label) == ["rope"] and table.weight.iloc[0] == pytest.approx(1.0)  # its own final value
    assert "rope [steps=4]" in (tmp_path / "rep" / "report.md").read_text()  # each budget a line


EVALUATED = """out: {tmp}/out
runs: {tmp}/runs
results: {tmp}/results
folder: "{{stage}}/{{encoding}}"
common: [experiment=smoke, train.steps=4, "eval.multiples=[1,2]"]
stages:
  - name: a
    grid: {{encoding: [rope], seed: [0]}}
  - name: scaled
    eval: true
    from: a
    grid: {{encoding: [rope], eval.rope_scaling: [pi], seed: [0]}}
    overrides: ["eval.lengths=[32,64]"]
"""


def test_an_eval_stage_evaluates_its_parents_runs(tmp_path):
    """An eval stage's sweeps are its parent's runs (folder, run dirs, exports); its own grid keys
    and overrides go to ``posbench -m eval``, without the study's common (training) overrides and
    with only the --extra overrides posbench eval takes."""
    from dataclasses import replace

    from posbench.study import eval_command

    write_study(tmp_path, EVALUATED.format(tmp=tmp_path).replace("[pi]", "[pi, yarn]"))
    study = load_study("mini", [tmp_path])
    scaled = [s for s in sweeps(study) if s.stage == "scaled"]
    assert [(s.folder, s.parent, s.evaluates) for s in scaled] == [("a/rope", "a/rope", True)] * 2
    assert [s.overrides for s in scaled] == [("eval.rope_scaling=pi", "eval.lengths=[32,64]"),
                                             ("eval.rope_scaling=yarn", "eval.lengths=[32,64]")]
    command = eval_command(study, replace(scaled[0], seeds=(0, 1)), 4, ["train.compile=false", "device=cuda"])
    assert command[3:5] == ["-m", "eval"]
    assert f"checkpoint='{tmp_path}/out/a/rope/seed=0','{tmp_path}/out/a/rope/seed=1'" in command
    assert "device=cuda" in command and "train.compile=false" not in command and "experiment=smoke" not in command
    assert "hydra.launcher.n_jobs=2" in command
    todo, have = plan(study)
    assert have == 0 and [(s.stage, s.seeds) for s in todo] == [("a", (0,)), ("scaled", (0,)), ("scaled", (0,))]
    write_study(tmp_path, EVALUATED.replace("    from: a\n", "").format(tmp=tmp_path))
    with pytest.raises(PosbenchError, match="eval: true and no from:"):
        load_study("mini", [tmp_path])


def test_evaluations_of_one_run_dir_run_one_after_another(tmp_path, monkeypatch):
    """``posbench eval`` holds the run dir: two eval sweeps on the same runs never overlap, and
    neither starts before the runs have trained."""
    import posbench.study.run as st

    write_study(tmp_path, EVALUATED.format(tmp=tmp_path).replace("[pi]", "[pi, yarn]"))
    study = load_study("mini", [tmp_path])
    spans = {}

    def command(study, sweep, jobs, extra=()):
        spans.setdefault(sweep.name, [time.monotonic()])
        return [sys.executable, "-c", "import time; time.sleep(0.5)"]

    monkeypatch.setattr(st, "train_command", command)
    monkeypatch.setattr(st, "eval_command", command)
    monkeypatch.setattr(st, "export", lambda study, sweep: spans[sweep.name].append(time.monotonic()) or [])
    assert st.train(study, sweeps(study), jobs=8) == []
    (start_a, end_a), (start_pi, end_pi), (start_yarn, _) = spans.values()
    assert start_pi >= end_a and start_yarn >= end_pi


@pytest.mark.slow
def test_an_eval_stage_is_done_by_its_rows_and_exported_with_them(tmp_path):
    """A real smoke run and its evaluation under pi: the plan then finds the evaluation done (its
    rows in the run dir), the export holds the run's rows of both evaluations with their blocks; a
    second scaling adds rows and the export is written again with them; with the run dir gone the
    export alone says which evaluations are done."""
    import numpy as np

    from posbench.study import evaluated

    write_study(tmp_path, EVALUATED.format(tmp=tmp_path))
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--jobs", "2", "--step", "train")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 to train, 1 to evaluate" in r.stdout
    study = load_study("mini", [tmp_path])
    scaled = [s for s in sweeps(study) if s.stage == "scaled"]
    assert evaluated(study, scaled[0], 0) and plan(study) == ([], 2)
    export = tmp_path / "runs" / "a" / "rope" / "seed=0"
    rows = pd.read_csv(export / "results.csv")
    assert sorted(zip(rows.rope_scaling, rows.eval_len)) == [("none", 32), ("none", 64), ("pi", 32), ("pi", 64)]
    assert len(np.load(export / "blocks.npz").files) == 4
    # another scaling: planned, evaluated, and the export written again with its rows
    write_study(tmp_path, EVALUATED.format(tmp=tmp_path).replace("[pi]", "[pi, ntk]"))
    todo, have = plan(load_study("mini", [tmp_path]))
    assert have == 2 and [s.overrides[0] for s in todo] == ["eval.rope_scaling=ntk"]
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--step", "train")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = pd.read_csv(export / "results.csv")
    assert set(rows.rope_scaling) == {"none", "pi", "ntk"} and len(np.load(export / "blocks.npz").files) == 6
    import shutil

    shutil.rmtree(tmp_path / "out")
    study = load_study("mini", [tmp_path])
    assert plan(study) == ([], 3)
    write_study(tmp_path, EVALUATED.format(tmp=tmp_path).replace("[pi]", "[yarn]"))
    todo, have = plan(load_study("mini", [tmp_path]))
    assert have == 1 and [s.overrides[0] for s in todo] == ["eval.rope_scaling=yarn"]


@pytest.mark.parametrize("name, parent", [("rope_scaling", "cpu_quick"), ("headline_sliding", "headline")])
def test_an_eval_study_shares_its_parent_studys_runs(name, parent):
    """The studies that replaced scripts/rope_scaling.sh and scripts/headline_sliding.sh train
    nothing of their own: their first stage is runs of the parent study, with its config hashes,
    out and folders, so the eval stage reads the parent's run dirs."""
    study, base = load_study(name), load_study(parent)
    own = {s.folder: sweep_hash(study, s) for s in sweeps(study) if not s.evaluates}
    theirs = {s.folder: sweep_hash(base, s) for s in sweeps(base)}
    assert study.out == base.out and own and all(theirs[f] == h for f, h in own.items())
    evals = [s for s in sweeps(study) if s.evaluates]
    assert {s.folder for s in evals} == set(own) and all(s.seeds == (0, 1, 2) for s in evals)


TASKS = """out: {tmp}/out
runs: {tmp}/runs
results: {tmp}/results
folder: "{{stage}}/{{task}}/{{encoding}}"
common: [experiment=tasks_quick, train.steps=4, train.warmup_steps=1, "task.eval_multiples=[1,2]",
         task.eval_instances=8]
stages:
  - name: plain
    grid: {{task: [copy], encoding: [rope], seed: [0]}}
  - name: random
    grid: {{task: [copy], encoding: [rope], seed: [0]}}
    overrides: [train.random_positions=64]
"""


@pytest.mark.slow
def test_a_task_study_is_keyed_by_its_tasks_csv(tmp_path):
    """Task runs write tasks.csv, not results.csv: the study hashes them with the train_len the
    task sets (posbench train does before hashing), exports their tasks.csv and config.yaml, reports
    them, and finds them done by the export alone."""
    import shutil

    write_study(tmp_path, TASKS.format(tmp=tmp_path))
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--jobs", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 of 2 runs done; 2 to train" in r.stdout
    export = tmp_path / "runs" / "random" / "copy" / "rope" / "seed=0"
    assert {p.name for p in export.iterdir()} == {"tasks.csv", "config.yaml"}
    assert (tmp_path / "results" / "tasks_report.md").is_file()
    study = load_study("mini", [tmp_path])
    digest = sweep_hash(study, sweeps(study)[1])
    assert set(pd.read_csv(export / "tasks.csv").config_hash.astype(str)) == {digest}
    shutil.rmtree(tmp_path / "out")
    assert plan(study) == ([], 2)


def test_the_tasks_study_is_the_former_drivers_84_runs():
    """scripts/tasks_comparison.sh: five encodings on four tasks, and sinusoidal and rope with
    train.random_positions=256, three seeds each."""
    runs = {(s.overrides, seed) for s in sweeps(load_study("tasks_quick")) for seed in s.seeds}
    assert len(runs) == 84
    random = {o for o, _ in runs if "train.random_positions=256" in o}
    assert {o[1] for o in random} == {"encoding=sinusoidal", "encoding=rope"} and len(random) == 8


PROBED = EVALUATED.replace("name: scaled", "name: probed").replace('''    grid: {{encoding: [rope], eval.rope_scaling: [pi], seed: [0]}}
    overrides: ["eval.lengths=[32,64]"]''', '''    grid: {{encoding: [rope], seed: [0]}}
    overrides: [probe=passkey, "probe.lengths=[64,128]", "probe.depths=[0,1]", probe.trials=1]''')


@pytest.mark.slow
def test_an_eval_stage_runs_a_probe_done_by_its_csv(tmp_path):
    """A probe as an eval stage: run on the trained run, done once its csv holds rows of every
    length (in the run dir, or its export alone), the csv exported with the run; a longer length
    makes it to do again."""
    write_study(tmp_path, PROBED.format(tmp=tmp_path))
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--step", "train")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 to train, 1 to evaluate" in r.stdout
    study = load_study("mini", [tmp_path])
    assert plan(study) == ([], 2)
    export = tmp_path / "runs" / "a" / "rope" / "seed=0"
    assert sorted(set(pd.read_csv(export / "passkey.csv").length)) == [64, 128]
    import shutil

    shutil.rmtree(tmp_path / "out")
    assert plan(study) == ([], 2)
    write_study(tmp_path, PROBED.format(tmp=tmp_path).replace("[64,128]", "[64,128,256]"))
    todo, have = plan(load_study("mini", [tmp_path]))
    assert have == 1 and [s.stage for s in todo] == ["probed"]


def test_seed_major_trains_every_lines_first_seed_first(tmp_path):
    """``--seed-major``: one sweep per seed, seed 0 of every line (a branch after its parent) before
    any seed 1; --step plan lists them in that order."""
    from posbench.study import seed_major

    write_study(tmp_path, BRANCHED.format(tmp=tmp_path))
    todo, _ = plan(load_study("mini", [tmp_path]))
    order = [(s.seeds, s.stage, s.name) for s in seed_major(todo)]
    assert [o[0] for o in order] == [(0,)] * 4 + [(1,)] * 4
    assert [o[1] for o in order[:4]] == ["long", "long", "short", "short"]
    assert sorted(order) == sorted((((seed,), s.stage, s.name) for s in todo for seed in s.seeds))
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--step", "plan", "--seed-major")
    assert r.returncode == 0, r.stdout + r.stderr
    seeds = [re.search(r" seed=([0-9,]+) ", line).group(1) for line in r.stdout.splitlines() if " -m train " in line]
    assert seeds == ["0"] * 4 + ["1"] * 4


def test_where_picks_the_runs_of_some_grid_points_and_seeds(tmp_path):
    """``--where encoding=rope --where seed=1``: only those runs are planned (a branch with its
    parent); a key no run sets, a value none has and a malformed condition are one line each."""
    from posbench.study import parse_where

    write_study(tmp_path, BRANCHED.format(tmp=tmp_path))
    study = load_study("mini", [tmp_path])
    assert parse_where(["encoding=rope", "seed=1", "probe.lengths=[1024,2048],[4096]"]) == {
        "encoding": {"rope"}, "seed": {"1"}, "probe.lengths": {"[1024,2048]", "[4096]"}}
    todo, have = plan(study, where=parse_where(["encoding=rope", "seed=1"]))
    assert have == 0 and [(s.folder, s.seeds) for s in todo] == [("long/rope", (1,)), ("short/rope", (1,))]
    todo, _ = plan(study, where=parse_where(["train.steps=4"]))  # a stage's own override picks too
    assert [(s.folder, s.seeds) for s in todo] == [("short/alibi", (0, 1)), ("short/rope", (0, 1))]
    with pytest.raises(PosbenchError, match=r"^study mini: --where encoding=rop matches no run; valid values of "
                                            r"encoding: alibi, rope$"):
        plan(study, where=parse_where(["encoding=rop"]))
    with pytest.raises(PosbenchError, match=r"^study mini: --where seed=7 matches no run; valid values of seed: 0, 1$"):
        plan(study, where=parse_where(["seed=7"]))
    with pytest.raises(PosbenchError, match=r"^study mini: --where model: no run of the chosen stages sets model; "
                                            r"valid keys: seed, encoding, train.branch_from, train.save_steps, "
                                            r"train.steps$"):
        plan(study, where=parse_where(["model=tiny"]))
    from posbench.study.planning import orphaned

    todo, _ = plan(study, where=parse_where(["train.steps=4", "seed=0"]))  # branches without their parents
    keep, lines = orphaned(study, todo)
    assert keep == [] and lines == [
        f"short of long/{enc} seed=0 cannot start: its parent run has not trained and is not among the runs chosen; "
        "valid: add its stage long to --only, or widen --where to it" for enc in ("alibi", "rope")]
    write_study(tmp_path, JUDGED.format(tmp=tmp_path), name="judged")  # an eval stage has its parent's keys
    todo, _ = plan(load_study("judged", [tmp_path]), where=parse_where(["encoding=rope"]))
    assert [s.stage for s in todo] == ["main", "judge", "judge_short"]
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--step", "plan", "--where", "encoding")
    assert r.returncode != 0 and r.stderr.count("\n") == 1
    assert "--where 'encoding' is not valid; valid: KEY=VALUE[,VALUE...]" in r.stderr
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--step", "plan", "--where", "encoding=alibi")
    assert r.returncode == 0, r.stderr
    assert "study mini: 0 of 4 runs done; 4 to train" in r.stdout
    assert r.stdout.count(" -m train ") == 2 and "encoding=rope" not in r.stdout


JUDGED = """description: LongPPL of trained runs on a judge trained at twice their length
out: {tmp}/out
runs: {tmp}/runs
results: {tmp}/results
folder: "{{stage}}/{{encoding}}"
common: [experiment=smoke, train.steps=4, "eval.multiples=[1,2]"]
stages:
  - name: main
    grid: {{encoding: [alibi, rope], seed: [0]}}
  - name: judge
    grid: {{encoding: [rope], seed: [0]}}
    overrides: [train.train_len=64, train.batch_size=4]
  - name: judge_short
    eval: true
    from: judge
    grid: {{encoding: [rope], seed: [0]}}
    overrides: [eval.mode=sliding, eval.stride=8, "eval.lengths=[32]"]
report:
  args: [--mix]                  # the judge's sliding row scores another token count
  longppl: {{evaluator: judge/rope/seed=0, short: 32, short_stride: 8, alpha: -1.0e+9, beta: -1.0e+9,
            sensitivity: {{lower: {{alpha: -2.0e+9}}}}}}
"""


@pytest.mark.slow
def test_a_trained_study_s_longppl_uses_its_judge_run(tmp_path, capsys):
    """conf/study/headline_longppl.yaml's shape at smoke size: the runs, a judge trained at twice
    their length with a sliding row at theirs (an eval stage), and report.longppl naming the judge's
    run dir: runs/longppl.csv holds every row of every run dir of the study, on the judge's key
    tokens (its 64-token row against its sliding 32-token row), and report.md its section.

    The runner writes it as sweeps finish (not only at the report), with the key tokens beside it,
    so it outlives out: a run whose per-token NLLs are gone keeps its rows, and one exported without
    rows and without them is named with how to train it again."""
    write_study(tmp_path, JUDGED.format(tmp=tmp_path))
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--step", "train")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no LongPPL yet" in r.stdout or "no LongPPL: the evaluator's rows are not under" in r.stdout
    trained = pd.read_csv(tmp_path / "runs" / "longppl.csv")  # written after the last sweep, no report step
    assert (tmp_path / "runs" / "longppl_keys.npz").is_file() and len(trained) == 7
    shutil.rmtree(tmp_path / "out" / "main" / "alibi")  # alibi's per-token NLLs gone, its export still here
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--step", "report")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = pd.read_csv(tmp_path / "runs" / "longppl.csv")
    order = ["encoding", "train_len", "eval_len", "mode"]
    pd.testing.assert_frame_equal(rows.sort_values(order).reset_index(drop=True),
                                  trained.sort_values(order).reset_index(drop=True))
    assert "have no LongPPL" not in r.stdout
    saved = tmp_path / "runs" / "longppl_keys.npz"
    original = saved.read_bytes()
    keys = load_keys(saved)
    keys.mask[np.flatnonzero(keys.mask)[0]] = False  # key tokens not the evaluator's: rows on them cannot mix
    keys.save(saved)
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--step", "report")
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert "the key tokens of" in r.stderr and "differ from those saved in" in r.stderr
    saved.write_bytes(original)
    assert sorted(zip(rows.encoding, rows.train_len, rows.eval_len, rows["mode"])) == [
        ("alibi", 32, 32, "nonoverlapping"), ("alibi", 32, 64, "nonoverlapping"),
        ("rope", 32, 32, "nonoverlapping"), ("rope", 32, 64, "nonoverlapping"),
        ("rope", 64, 32, "sliding"), ("rope", 64, 64, "nonoverlapping"), ("rope", 64, 128, "nonoverlapping")]
    assert (rows.long_len == 64).all() and (rows.short_len == 32).all() and (rows.short_stride == 8).all()
    assert (rows.key_tokens > 0).all() and rows.evaluator.str.endswith("judge/rope/seed=0").all()
    assert "## LongPPL" in (tmp_path / "results" / "report.md").read_text()
    # the sensitivity: the same rows on the key tokens its change chooses, kept and reported apart
    lower = pd.read_csv(tmp_path / "runs" / "longppl_lower.csv")
    assert (tmp_path / "runs" / "longppl_lower_keys.npz").is_file() and len(lower) == 7
    assert (lower.alpha == -2.0e9).all() and (rows.alpha == -1.0e9).all()
    assert load_keys(tmp_path / "runs" / "longppl_lower_keys.npz").alpha == -2.0e9
    text = (tmp_path / "results" / "longppl_lower.md").read_text()
    assert text.startswith("# mini: LongPPL sensitivity lower (alpha -2000000000.0)\n")
    assert "more than -2e+09 nats better" in text and "sensitivity" not in (tmp_path / "results" / "report.md").read_text()
    assert all((tmp_path / "results" / f"longppl_lower.{x}").is_file() for x in ("csv", "png", "svg"))
    study = load_study("mini", [tmp_path])  # the report's LongPPL step, in this process from here on
    (tmp_path / "runs" / "longppl.csv").unlink()  # and now its rows too: the export alone is left
    longppl(study)
    said = capsys.readouterr().out
    assert "study mini: 1 exported run(s) have no LongPPL in longppl.csv and no per-token NLLs under" in said
    assert f"rm -r {tmp_path / 'runs' / 'main' / 'alibi' / 'seed=0'}" in said
    assert len(pd.read_csv(tmp_path / "runs" / "longppl.csv")) == 5
    shutil.rmtree(tmp_path / "out")  # a fresh machine: the key tokens come from their file, the rows stay
    longppl(study)
    assert len(pd.read_csv(tmp_path / "runs" / "longppl.csv")) == 5


CHILD = """import os, signal, sys, time
out = sys.argv[1]
open(out, "w").write(f"group {os.getpgid(0) == os.getpid()}\\n")
def stop(signum, frame):
    open(out, "a").write(f"got {signal.Signals(signum).name}\\n")
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
time.sleep(60)
"""


def test_a_deadline_starts_nothing_more_and_stops_each_running_sweep_once(tmp_path, monkeypatch):
    """At --deadline the running sweep gets one SIGTERM in its own process group (so a terminal's
    Ctrl-C reaches the study alone), the next sweep never starts, and a stopped sweep is not a
    failed one: its line is not marked dead and no log is listed as failed."""
    import posbench.study.run as st

    write_study(tmp_path, MINI.format(tmp=tmp_path).replace("encoding: [alibi]", "encoding: [alibi, rope]"))
    study = load_study("mini", [tmp_path])
    (tmp_path / "child.py").write_text(CHILD)
    started = []

    def child(study, sweep, jobs, extra=()):
        started.append(sweep.name)
        return [sys.executable, str(tmp_path / "child.py"), str(tmp_path / f"child{len(started)}.txt")]

    monkeypatch.setattr(st, "train_command", child)
    monkeypatch.setattr(st, "export", lambda study, sweep: [])
    stop = st.Stop(deadline=4.0)  # the child has its handler by then, even on busy cores
    t0 = time.monotonic()
    assert st.train(study, sweeps(study), jobs=1, stop=stop) == []
    assert time.monotonic() - t0 < 30 and len(started) == 1
    assert (tmp_path / "child1.txt").read_text() == "group True\ngot SIGTERM\n"
    assert stop.reason == "its --deadline of 4 s passed"


def test_sigterm_to_a_study_checkpoints_its_runs_and_the_same_command_resumes(tmp_path):
    """`timeout` or a scheduler signals the study alone: its run saves a checkpoint and stops, the
    study says what is left and exits non-zero, no process of the sweep outlives it, and the same
    command resumes the run from that checkpoint."""
    body = MINI.format(tmp=tmp_path).replace("train.steps=4", "train.steps=80")
    cfg = write_study(tmp_path, body)
    cmd = [sys.executable, "-m", "posbench.cli", "study", "--config-dir", str(cfg), "mini", "--jobs", "1",
           "--step", "train"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "out" / "a" / "encoding=alibi" / "seed=0" / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.is_file() and metrics.read_text().strip()):  # step 5 logged: 75 to go
        assert proc.poll() is None and time.time() < deadline, "the run ended before it logged"
        time.sleep(0.05)
    proc.terminate()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, out + err  # a posbench error's exit status
    assert "study mini: stopping because it got SIGTERM: nothing new starts; 1 sweep(s) save a checkpoint" in err
    assert "stopped because it got SIGTERM: 0 of 1 runs done, 1 left; re-run the same command" in err
    assert "a encoding=alibi stopped; exported 0 run(s); 0 of the 1 run(s) of this command done" in out
    assert (metrics.parent / "checkpoints" / "last.pt").is_file()
    log = (tmp_path / "out" / "a" / "encoding=alibi.log").read_text()
    assert "interrupted at step" in log
    alive = subprocess.run(["pgrep", "-f", f"hydra.sweep.dir={tmp_path}"], capture_output=True, text=True).stdout
    assert alive == ""
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming" in (tmp_path / "out" / "a" / "encoding=alibi.log").read_text()
    assert "exported 1 run(s)" in again.stdout


def test_a_deadline_that_is_not_positive_is_one_line(tmp_path):
    cfg = write_study(tmp_path, MINI.format(tmp=tmp_path))
    r = posbench("study", "--config-dir", str(cfg), "mini", "--deadline", "0")
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == \
        "posbench: error: study: --deadline 0 is not valid; valid: seconds > 0"
    assert not (tmp_path / "out").exists()
