"""One report, one text: `posbench report` refuses runs scored on different text (corpus, split,
vocabulary, scored tokens) unless asked to mix them (--mix), and names the field that differs;
runs that differ in model size, train_len or budget on the same text stay together, their
differences stated above the table."""

import pandas as pd
import pytest
from conftest import posbench
from omegaconf import OmegaConf
from test_report import rows, write_run

from posbench.errors import PosbenchError
from posbench.report.baselines import resolve_baseline
from posbench.report.build import report

ZOO_QUICK = resolve_baseline("zoo_quick")
ZOO_QUICK_RUN = ZOO_QUICK / "alibi" / "experiment=zoo_quick,seed=0"  # the first of its runs collect finds


def with_config(run, **sections):
    """``run``'s config.yaml with ``sections`` merged in (data=..., model=..., train=...)."""
    config = OmegaConf.merge(OmegaConf.load(run / "config.yaml"), OmegaConf.create(sections))
    OmegaConf.save(config, run / "config.yaml")
    return run


@pytest.mark.slow
def test_a_smoke_run_beside_the_zoo_quick_baseline_is_refused_naming_what_differs(smoke_run, tmp_path):
    """The command as a user types it: a smoke run (1,024-token vocabulary, 24 documents, 2,048
    scored tokens) beside the shipped zoo_quick runs (8,192, all documents, 16,384)."""
    out = tmp_path / "out"
    proc = posbench("report", smoke_run, "--baseline", "zoo_quick", "--out", out, check=False)
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.strip() == (
        "posbench: error: report: these runs were scored on different text, so their perplexities do not compare: "
        f"data.max_docs (24 in {smoke_run}, None in {ZOO_QUICK_RUN}), "
        f"data.vocab_size (1024 in {smoke_run}, 8192 in {ZOO_QUICK_RUN}), "
        f"scored tokens (2048 in {smoke_run}, 16384 in {ZOO_QUICK_RUN}); report them apart, or pass --mix to put "
        "them in one report anyway (its header then says what differs)")

    # asked: each text's lines apart (a data column), ranked and bolded within their text only
    proc = posbench("report", smoke_run, "--baseline", "zoo_quick", "--out", out, "--mix", "--no-reference")
    md = (out / "report.md").read_text()
    assert md.startswith("The runs differ in model.d_model (64/256), model.n_layers (2/4), ") and \
        "train_len (32/64), train.steps (30/250)" in md.split("\n")[0]
    assert "**Scored on different text** (--mix): data.max_docs (24 in " in md and md.split("\n")[0] in proc.stdout
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| encoding | train_len | seeds | params (position) | data | L=32 |")
    assert "| alibi | 32 | 1 | 0.13M (0) | sotu [max_docs=24, vocab_size=1024, tokens=2048] |" in md
    tidy = pd.read_csv(out / "report.csv")
    ranked = tidy.groupby(["train_len", "eval_len", "data"]).vs_best.min()
    assert (ranked == 1).all()  # every text's own lowest line is its best: no ratio across texts
    smoke = tidy[tidy.data.str.contains("vocab_size=1024")]
    assert set(smoke.label) == {"alibi"} and (smoke.train_len == 32).all()


def test_runs_on_other_tokens_or_another_split_are_refused_and_mixed_when_asked(tmp_path):
    a = write_run(tmp_path / "a", rows("alibi", 0, {32: 10.0, 64: 10.5}))
    b = write_run(tmp_path / "b", rows("rope", 0, {32: 11.0, 64: 12.0}, chash="h2").assign(tokens=4096))
    with pytest.raises(PosbenchError) as e:
        report([a, b], tmp_path / "out")
    assert "scored tokens (2048 in " in str(e.value) and f"4096 in {b})" in str(e.value)
    assert "data." not in str(e.value) and not (tmp_path / "out").exists()
    done = report([a, b], tmp_path / "out", mix=True)
    assert sorted(set(done.summary.data)) == ["sotu [tokens=2048]", "sotu [tokens=4096]"]
    assert (done.summary.vs_best == 1).all()  # each text has one line: nothing ranked across texts
    assert "**Scored on different text** (--mix): scored tokens (2048 in" in (tmp_path / "out/report.md").read_text()

    test = rows("rope", 0, {32: 11.0, 64: 12.0}, chash="h2").assign(split="test")
    c = write_run(tmp_path / "c", test)
    with pytest.raises(PosbenchError, match=rf"eval.split \(validation in {a}, test in {c}\)"):
        report([a, c], tmp_path / "out2")
    vocab = with_config(write_run(tmp_path / "d", rows("rope", 0, {32: 11.0, 64: 12.0}, chash="h3")),
                        data={"vocab_size": 1024})
    with_config(a, data={"vocab_size": 8192})
    with pytest.raises(PosbenchError, match=rf"data.vocab_size \(8192 in {a}, 1024 in {vocab}\)"):
        report([a, vocab], tmp_path / "out3")


def test_runs_of_other_sizes_lengths_and_budgets_on_one_text_stay_together_and_the_header_says_so(tmp_path):
    small = with_config(write_run(tmp_path / "small", rows("alibi", 0, {32: 10.0, 64: 10.5})),
                        model={"d_model": 64}, train={"batch_size": 8})
    large = with_config(write_run(tmp_path / "large", rows("alibi", 0, {64: 9.0, 128: 9.2}, train_len=64,
                                                          chash="h2").assign(steps=40)),
                        model={"d_model": 256}, train={"batch_size": 8})
    done = report([small, large], tmp_path / "out", reference=None)
    assert done.header == ("The runs differ in model.d_model (64/256), train_len (32/64), train.steps (10/40), "
                           "training tokens (2,560/0.0205M): each line keeps its own setup (the table's columns and "
                           "the figures' line names say which), so compare a line's ratio with the lines of its "
                           "setup. The table's bold, the range at train_len and its warning below compare every line, "
                           "across setups: there a difference is the setup's as much as the encoding's.")
    assert (tmp_path / "out/report.md").read_text().startswith(done.header + "\n\n| encoding | train_len |")
    # one setup: no header
    assert report([small], tmp_path / "one", reference=None).header == ""
    assert (tmp_path / "one/report.md").read_text().startswith("| encoding |")


def test_a_pretrained_models_bos_policies_score_one_text_and_its_tokenizer_another(tmp_path):
    """``pretrained.name`` names the model's tokenizer: ``+bos`` (bos=every) scores the same tokens
    as bos=first, so the text is the same; another model file is another text."""
    from posbench.report.collect import _text_config

    def run(name, pretrained):
        path = tmp_path / name
        path.mkdir()
        OmegaConf.save(OmegaConf.create({"pretrained": {"name": pretrained}, "data": {"name": "sotu"}}),
                       path / "config.yaml")
        return str(path)

    first, every = _text_config(run("first", "gemma-3-270m-q4_k_m")), _text_config(run("every", "gemma-3-270m-q4_k_m+bos"))
    other = _text_config(run("other", "SmolLM2-135M-Instruct.Q4_1"))
    assert first == every == {"data.name": "sotu", "pretrained.name": "gemma-3-270m-q4_k_m"}
    assert other["pretrained.name"] != first["pretrained.name"]
