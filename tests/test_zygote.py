"""The tests' warm interpreter (tests/zygote.py) runs a command as a fresh interpreter would."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import conftest
from conftest import fresh_posbench as fresh
from conftest import posbench


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here: every command runs in a fresh interpreter")
@pytest.mark.parametrize("args", [["encodings"], ["nonsense"], ["report", "no/such/dir"], ["train", "encoding=nope_x"],
                                  ["train", "--cfg", "job", "encoding=alibi", "hydra.run.dir=run"]])
def test_a_forked_command_prints_and_exits_as_a_fresh_interpreter_does(args, tmp_path):
    forked = posbench(*args, cwd=tmp_path, check=False)
    assert conftest._ZYGOTE and conftest._ZYGOTE[0].ready  # it did run in the warm interpreter
    expected = fresh(*args, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (expected.returncode, expected.stdout, expected.stderr)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here: every command runs in a fresh interpreter")
def test_torch_compile_in_a_worker_keeps_its_commands_forked():
    """Inductor, at its import, sets TORCHINDUCTOR_CACHE_DIR in the process environment where it is
    unset; conftest sets it first, so a worker that compiled (tests/test_compile.py) still matches
    its zygote's import-time environment and keeps forking its commands."""
    code = ("import os, conftest, zygote; before = zygote.import_time_env(os.environ); "
            "import torch._inductor.config; from torch._inductor.runtime.cache_dir_utils import cache_dir; "
            "cache_dir(); print(zygote.import_time_env(os.environ) == before)")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(conftest.__file__).parent, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["True"], done.stderr[-2000:]


def test_a_fork_sees_the_working_directory_and_pythonpath_of_its_command(tmp_path):
    """`python -m` puts the working directory first on sys.path, then PYTHONPATH: a module in
    either is importable by a `_target_` of the command's config dir, as in a fresh interpreter."""
    (tmp_path / "here").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "here" / "mod_here.py").write_text("")
    (tmp_path / "lib" / "mod_lib.py").write_text("")
    probe = [sys.executable, "-c", "import mod_here, mod_lib"]  # the reference: a fresh interpreter
    assert subprocess.run(probe, cwd=tmp_path / "here", env={**os.environ, "PYTHONPATH": str(tmp_path / "lib")}).returncode == 0
    errors = {}
    for module in ("mod_here", "mod_lib"):
        for env in ({"PYTHONPATH": str(tmp_path / "lib")}, {}):
            forked = posbench("check", f"{module}:Nothing", cwd=tmp_path / "here", env=env, check=False)
            expected = fresh("check", f"{module}:Nothing", cwd=tmp_path / "here", env=env)
            assert (forked.returncode, forked.stderr) == (expected.returncode, expected.stderr)
            errors[module, bool(env)] = forked.stderr
    assert errors["mod_here", True] == errors["mod_here", False]  # the working directory: found either way
    assert errors["mod_lib", True] != errors["mod_lib", False]  # found with PYTHONPATH only
    assert errors["mod_lib", True].replace("mod_lib", "mod_here") == errors["mod_here", True]
