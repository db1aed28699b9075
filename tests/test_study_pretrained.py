"""``posbench study`` with a pretrained stage: a tiny random Llama (built here, nothing downloaded)
on the ladder under two scalings, in sliding windows and on passkey, planned from its rows, resumed, exported with
its blocks, the export keeping its rows when the folder under ``out`` is made again."""

import re
import shutil

import numpy as np
import pandas as pd
import pytest
from test_pretrained import models  # noqa: F401  (the fixture: tiny saved Hugging Face models)
from test_study import posbench, write_study

from posbench.errors import PosbenchError
from posbench.study import load_study, plan
from posbench.study.derived import longppl

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

STUDY = """description: a tiny llama's ladder and passkey
out: {tmp}/out
runs: {tmp}/runs
results: {tmp}/results
folder: "{{pretrained}}"
stages:
  - name: ladder
    pretrained: {model}
    grid: {{eval.rope_scaling: [none, yarn]}}
    overrides: ["eval.lengths=[32,64,128]", eval.max_tokens=256]
  - name: short                  # sliding windows into the same folder (LongPPL's short context)
    pretrained: {model}
    grid: {{}}
    overrides: [eval.mode=sliding, eval.stride=32, "eval.lengths=[64]", eval.max_tokens=256]
  - name: passkey
    pretrained: {model}
    grid: {{}}
    overrides: [probe=passkey, "probe.lengths=[64,128]", "probe.depths=[0,1]", probe.trials=1]
report:
  args: [--no-reference]
"""


def test_a_pretrained_study_plans_from_its_rows_and_resumes(models, tmp_path):  # noqa: F811
    conf = write_study(tmp_path / "conf", STUDY.format(tmp=tmp_path, model=models / "llama"))
    study = load_study("mini", [conf])
    todo, have = plan(study)
    assert have == 0 and [s.stage for s in todo] == ["ladder", "ladder", "short", "passkey"]
    r = posbench("study", "--config-dir", str(conf), "mini", "--step", "train")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 of 4 runs done; 0 to train, 4 to evaluate" in r.stdout
    assert plan(study) == ([], 4)
    export = tmp_path / "runs" / "llama"
    rows = pd.read_csv(export / "results.csv")
    assert list(zip(rows[rows["mode"] == "sliding"].eval_len, rows[rows["mode"] == "sliding"].stride)) == [(64, 32)]
    rows = rows[rows["mode"] == "nonoverlapping"]
    assert sorted(zip(rows.rope_scaling, rows.eval_len)) == [(k, n) for k in ("none", "yarn") for n in (32, 64, 128)]
    assert rows[rows.eval_len <= 64].groupby("eval_len").nll.nunique().eq(1).all()  # yarn at factor 1: none's rows
    assert len(np.load(export / "blocks.npz").files) == 7
    assert sorted(set(pd.read_csv(export / "passkey.csv").length)) == [64, 128]
    # the folder under out gone: the export says what is done
    shutil.rmtree(tmp_path / "out")
    assert plan(study) == ([], 4)
    # a non-overlapping row of the short stage's length is not its sliding row: without that, it is planned again
    full = pd.read_csv(export / "results.csv")
    full[full["mode"] != "sliding"].to_csv(export / "results.csv", index=False)
    todo, have = plan(study)
    assert have == 3 and [s.stage for s in todo] == ["short"]
    full.to_csv(export / "results.csv", index=False)
    # a probe length missing from the export: planned alone, run, and the export keeps every other row
    probe = pd.read_csv(export / "passkey.csv")
    probe[probe.length != 128].to_csv(export / "passkey.csv", index=False)
    todo, have = plan(study)
    assert have == 3 and [s.overrides[-1] for s in todo] == ["probe.lengths=[128]"]
    r = posbench("study", "--config-dir", str(conf), "mini")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(set(pd.read_csv(export / "passkey.csv").length)) == [64, 128]
    assert len(pd.read_csv(export / "results.csv")) == 7 and len(np.load(export / "blocks.npz").files) == 7
    assert plan(study) == ([], 4) and (tmp_path / "results" / "report.csv").is_file()


@pytest.mark.parametrize("stage, message", [
    ("{name: a, pretrained: m, from: b, grid: {}}", "has pretrained: and from:"),
    ("{name: a, pretrained: m, grid: {seed: [0, 1]}}", "has pretrained: and a seed in its grid"),
])
def test_a_bad_pretrained_stage_is_one_line(tmp_path, stage, message):
    write_study(tmp_path, f"out: o\nruns: r\nresults: s\nstages:\n  - {stage}\n")
    r = posbench("study", "--config-dir", str(tmp_path), "mini", "--step", "plan")
    assert r.returncode != 0 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


LONGPPL = STUDY.split("  - name: passkey")[0] + """report:
  args: [--no-reference]
  longppl: {{evaluator: llama, short: 64, short_stride: 32, long: 128, alpha: -1.0e+9, beta: -1.0e+9}}
"""


def test_a_study_s_longppl_is_computed_before_its_report_and_kept_without_its_rows(models, tmp_path, capsys):  # noqa: F811
    """``report: {longppl: ...}``: the study's report step writes runs/longppl.csv with the rows
    ``posbench longppl`` gives for the same evaluator and folders, the report draws it, and a
    machine without the folders under out keeps the exported rows (on the exported key tokens)."""
    conf = write_study(tmp_path / "conf", LONGPPL.format(tmp=tmp_path, model=models / "llama"))
    r = posbench("study", "--config-dir", str(conf), "mini")
    assert r.returncode == 0, r.stdout + r.stderr
    shipped = pd.read_csv(tmp_path / "runs" / "longppl.csv")
    out = tmp_path / "out" / "llama"
    r = posbench("longppl", "--evaluator", str(out), "--short", "64", "--short-stride", "32", "--long", "128",
                 "--alpha=-1e9", "--beta=-1e9", str(out), "--out", str(tmp_path / "direct.csv"))
    assert r.returncode == 0, r.stdout + r.stderr
    direct = pd.read_csv(tmp_path / "direct.csv")
    assert len(shipped) == 7 and (shipped.long_len == 128).all() and (shipped.key_tokens > 0).all()
    pd.testing.assert_frame_equal(shipped, direct)
    assert "LongPPL" in (tmp_path / "results" / "report.md").read_text()
    shutil.copytree(out, tmp_path / "before")
    shutil.rmtree(tmp_path / "out")
    capsys.readouterr()
    longppl(load_study("mini", [conf]))  # the report step's LongPPL, in this process
    assert "LongPPL of 7 row(s) on the key tokens of" in capsys.readouterr().out  # from runs/longppl_keys.npz
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "runs" / "longppl.csv"), direct)
    # the evaluator's folder made again with its rows at 32 only (a fresh machine evaluating other lengths):
    # the saved key tokens stand, where the folder holds neither the long row nor the sliding one they came from
    out.mkdir(parents=True)
    rows = pd.read_csv(tmp_path / "before" / "results.csv")
    rows[rows.eval_len == 32].to_csv(out / "results.csv", index=False)
    with np.load(tmp_path / "before" / "token_nll.npz") as z:
        np.savez(out / "token_nll.npz", **{k: z[k] for k in z.files if k.endswith("/eval_len=32")})
    shutil.copyfile(tmp_path / "before" / "config.yaml", out / "config.yaml")
    longppl(load_study("mini", [conf]))
    assert "LongPPL of 7 row(s) on the key tokens of" in capsys.readouterr().out
    by = ["rope_scaling", "mode", "eval_len"]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "runs" / "longppl.csv").sort_values(by).reset_index(drop=True),
                                  direct.sort_values(by).reset_index(drop=True))


def test_a_study_s_longppl_without_an_evaluator_is_one_line(tmp_path):
    conf = write_study(tmp_path / "conf", LONGPPL.format(tmp=tmp_path, model="m").replace("evaluator: llama, ", ""))
    with pytest.raises(PosbenchError, match="report.longppl has no evaluator; valid: the folder under out"):
        load_study("mini", [conf])


@pytest.mark.parametrize("sensitivity, said", [
    ("[0.5]", "report.longppl.sensitivity is [0.5]; valid: NAME: {key: value}, e.g. {alpha0.5: {alpha: 0.5}}"),
    ("{a/b: {alpha: 0.5}}", "sensitivity name 'a/b' is not valid; valid: letters, digits, '.', '_' and '-'"),
    ("{low: 0.5}", "sensitivity low is 0.5; valid: a mapping of some of short, short_stride, long, alpha, beta"),
    ("{low: {evaluator: x}}", "sensitivity low has an unknown key 'evaluator'; valid keys: short, short_stride, long, "
                              "alpha, beta"),
])
def test_a_study_s_longppl_sensitivity_is_checked_as_the_file_is_read(tmp_path, sensitivity, said):
    """report.longppl.sensitivity names files and changes thresholds or contexts, nothing else."""
    text = LONGPPL.format(tmp=tmp_path, model="m").replace("evaluator: llama, ", f"evaluator: llama, sensitivity: "
                                                           f"{sensitivity}, ")
    conf = write_study(tmp_path / "conf", text)
    with pytest.raises(PosbenchError, match=re.escape(said)):
        load_study("mini", [conf])


def test_a_pretrained_export_keeps_its_rows_and_probes_when_the_folder_under_out_is_made_again(tmp_path):
    """A fresh machine's folder under ``out``: while its first evaluation has written only its config,
    nothing is exported (the export's config and probes stay); once it holds rows, the export takes
    them and keeps every earlier row, probe csv and probes.json entry the new folder lacks."""
    import json

    from posbench.study.run import export_pretrained
    from posbench.study.spec import sweeps

    conf = write_study(tmp_path / "conf", STUDY.format(tmp=tmp_path, model="llama"))
    study = load_study("mini", [conf])
    sweep = next(s for s in sweeps(study, None) if s.stage == "ladder")
    export, run = tmp_path / "runs" / sweep.folder, tmp_path / "out" / sweep.folder
    export.mkdir(parents=True)
    key = "encoding,rope_scaling,train_len,eval_len,seed,split,mode,stride,ppl,config_hash"
    (export / "results.csv").write_text(f"{key}\nrope,none,64,32,0,validation,nonoverlapping,32,9.0,abc\n")
    np.savez(export / "blocks.npz", **{"validation/nonoverlapping/stride=32/none/eval_len=32": np.ones(4)})
    (export / "passkey.csv").write_text("length,depth,trial,correct\n64,0,0,1\n")
    index = {"passkey": {"_target_": None, "options": {"trials": 1}}}
    (export / "probes.json").write_text(json.dumps(index))
    (export / "config.yaml").write_text("eval: {lengths: [32]}\n")
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("eval: {lengths: [64]}\n")
    assert export_pretrained(study, sweep) == []  # a config alone: nothing computed yet
    assert (export / "config.yaml").read_text() == "eval: {lengths: [32]}\n" and (export / "probes.json").is_file()
    (run / "results.csv").write_text(f"{key}\nrope,none,64,64,0,validation,nonoverlapping,64,8.0,abc\n")
    np.savez(run / "token_nll.npz", **{"validation/nonoverlapping/stride=64/none/eval_len=64": np.full(4, 2.0)})
    (run / "positions.csv").write_text("encoding,rope_scaling,train_len,eval_len,seed,split,mode,stride,bin_start,"
                                       "bin_end,nll,tokens,config_hash\n")
    assert export_pretrained(study, sweep) == [export]
    rows = pd.read_csv(export / "results.csv")
    assert sorted(rows.eval_len) == [32, 64] and len(pd.read_csv(export / "passkey.csv")) == 1
    assert json.loads((export / "probes.json").read_text()) == index
    assert sorted(np.load(export / "blocks.npz").files) == ["validation/nonoverlapping/stride=32/none/eval_len=32",
                                                            "validation/nonoverlapping/stride=64/none/eval_len=64"]


def test_a_method_that_leaves_every_length_as_trained_is_planned_until_its_rows_exist(models, tmp_path):  # noqa: F811
    """yarn at lengths inside the tiny model's context is the model as trained: its rows are copies of
    none's. A study cut off after none's rows is not done: yarn's rows are still to be written (a copy
    each, nothing computed), and once they are, it is."""
    text = STUDY.split("  - name: short")[0].replace("[32,64,128]", "[32,64]")
    conf = write_study(tmp_path / "conf", text.format(tmp=tmp_path, model=models / "llama"))
    study = load_study("mini", [conf])
    r = posbench("study", "--config-dir", str(conf), "mini", "--step", "train", "--where", "eval.rope_scaling=none")
    assert r.returncode == 0, r.stdout + r.stderr
    todo, have = plan(study)
    assert have == 1 and [s.overrides[0] for s in todo] == ["eval.rope_scaling=yarn"]
    r = posbench("study", "--config-dir", str(conf), "mini", "--step", "train")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = pd.read_csv(tmp_path / "runs" / "llama" / "results.csv")
    assert sorted(zip(rows.rope_scaling, rows.eval_len)) == [("none", 32), ("none", 64), ("yarn", 32), ("yarn", 64)]
    assert rows.groupby("eval_len").nll.nunique().eq(1).all()
    assert plan(study) == ([], 2)
