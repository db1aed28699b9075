"""The package's shape: a torch-free config module, no import cycles, short functions."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "posbench"


def test_config_imports_no_torch():
    """The config module is importable where torch is not wanted (CLI checks, reports, tools)."""
    code = "import posbench.config, sys; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    subprocess.run([sys.executable, "-c", code], check=True)
