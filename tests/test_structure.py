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


def test_a_run_config_is_typed_where_torch_cannot_be_imported():
    """With torch unimportable, posbench.config still types and hashes a composed train config."""
    code = """import sys
sys.modules["torch"] = None  # any import of torch fails
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
import posbench.config as c
OmegaConf.register_new_resolver("run_name", c.run_name)
with initialize_config_dir(config_dir=str(c.conf_dir()), version_base=None):
    cfg = compose("app_train", overrides=["encoding=rope", "task=copy"])
rc = c.run_config(cfg)
assert rc.encoding == "rope" and rc.task.name == "copy" and rc.tree is cfg and len(rc.config_hash) == 12
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """posbench modules that ``path`` imports, at top level or inside a function alike."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


def test_import_graph_sees_known_edges():
    graph = import_graph()
    assert "posbench.config" in graph["posbench.train.loop"]
    assert "posbench.eval.results" in graph["posbench.report.collect"]
    assert "posbench.encodings.base" in graph["posbench.encodings.rotary"]  # relative imports resolved


def test_no_import_cycles():
    """Data flows one way (config -> data -> model -> train -> evaluate -> results -> report); an
    import inside a function counts like one at the top of the module. A package's modules may
    import the package's ``__init__`` (the encodings registry imports its modules to register them)."""
    graph = import_graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if module.startswith(dep + ".") or dep.startswith(module + "."):
                continue  # a package and its own modules
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_every_module_imports():
    for module in sorted(import_graph()):
        __import__(module)


def test_no_function_longer_than_80_lines():
    """Functions short enough to read at once (the trainer is split into setup, step, loop, finish)."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


# The pipeline's stages in the order data flows through them (see posbench/__init__.py).
# A module may import modules of its own stage or an earlier one, never a later one. The stages
# are folders, but for the shared base (a few torch-free modules) and the entry points; the
# package's own ``posbench/__init__.py`` is named exactly, so no entry is a catch-all.
ROOT = "posbench"
STAGES = {
    "base": (ROOT, "posbench.errors", "posbench.config", "posbench.intervals", "posbench.plugins", "posbench.runs"),
    "data": ("posbench.data",),
    "model": ("posbench.methods", "posbench.encodings", "posbench.model"),
    "eval": ("posbench.eval",),
    "train": ("posbench.train",),
    "report": ("posbench.report",),
    # the commands, and posbench.testing: the documented import of the conformance checks
    "app": ("posbench.cli", "posbench.bench", "posbench.convert", "posbench.study", "posbench.testing"),
}


def stage_of(module: str) -> int | None:
    """Index in STAGES of the longest prefix that names ``module`` or a package above it (the root
    package names itself only); None for a module in no stage."""
    best, index = "", None
    for i, prefixes in enumerate(STAGES.values()):
        for prefix in prefixes:
            below = prefix != ROOT and module.startswith(prefix + ".")
            if (module == prefix or below) and len(prefix) > len(best):
                best, index = prefix, i
    return index


def test_stage_of_names_a_stray_module():
    """The stage test can fail: a new top-level module belongs to no stage until STAGES says so."""
    assert stage_of("posbench.stray") is None and stage_of("posbench.model.stray") == 2
    assert stage_of(ROOT) == 0 and stage_of("posbench.runs.lock") == 0


def test_top_level_modules_are_entry_points_or_the_base():
    """Every other module sits in a stage folder (the model stage's too: posbench/model/; the
    commands' dispatch, verbs, validation and failure policy: posbench/cli/)."""
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert top == {"errors", "config", "intervals", "plugins", "convert", "testing"}
    assert (PACKAGE / "bench" / "__main__.py").is_file() and stage_of("posbench.bench.children") == len(STAGES) - 1
    assert (PACKAGE / "cli" / "__init__.py").is_file() and stage_of("posbench.cli.validate") == len(STAGES) - 1


def test_every_module_has_a_stage():
    assert [m for m in import_graph() if stage_of(m) is None] == []


def test_no_import_from_a_later_stage():
    """Data flows one way: config -> data -> model -> eval -> train -> report -> commands.
    Drawing is called last by the command that asked for it, never by train or eval."""
    names = list(STAGES)
    backward = [f"{m} ({names[stage_of(m)]}) imports {d} ({names[stage_of(d)]})"
                for m, deps in sorted(import_graph().items()) for d in sorted(deps)
                if d != "posbench" and stage_of(d) > stage_of(m)]
    assert backward == []


def test_a_method_module_is_imported_by_the_registry_alone():
    """Inference-time methods are classes of posbench/methods/, registered by name: only the registry
    (posbench.methods) imports a method's module (it imports every module of its package by
    scanning it, so a new method names itself nowhere else); the rest of posbench asks the registry.
    Each built-in method has its conf/method/NAME.yaml, whose keys are the method's options."""
    import yaml

    from posbench.methods import methods

    graph = import_graph()
    modules = {m for m in graph if m.startswith("posbench.methods.") and m != "posbench.methods.base"}
    assert modules >= {"posbench.methods.regroup", "posbench.methods.scaled", "posbench.methods.parts"}
    importers = {m: sorted(n for n, deps in graph.items() if m in deps) for m in modules}
    assert all(set(found) <= {"posbench.methods"} for found in importers.values()), importers
    found = {cls.__module__ for cls in methods().values()}
    assert found >= {"posbench.methods.regroup", "posbench.methods.scaled", "posbench.methods.parts"}
    conf = PACKAGE.parent / "conf" / "method"
    built_in = {name: cls for name, cls in methods().items() if cls.__module__.startswith("posbench.methods")}
    assert {p.stem for p in conf.glob("*.yaml")} == set(built_in)
    for name, cls in built_in.items():
        options = yaml.safe_load((conf / f"{name}.yaml").read_text())
        assert options == {"name": name, **{option: None for option in cls.option_fields()}}, name


def test_eval_asks_the_model_and_never_branches_on_its_type():
    """The ladder and probes score a posbench model and a pretrained one through the methods both
    have (check_method, encoding.reference_len, ...): no isinstance on a model class in eval/, and
    only the opening of a subject (eval.subject) imports posbench.model.pretrained."""
    models = {"LanguageModel", "PretrainedLM"}
    branches = []
    for path in sorted((PACKAGE / "eval").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                named = {getattr(n, "id", getattr(n, "attr", None)) for n in ast.walk(node.args[1])}
                if named & models:
                    branches.append(f"{path.name}:{node.lineno}")
    assert branches == []
    importers = sorted(m for m, deps in import_graph().items() if "posbench.model.pretrained" in deps
                       and m.startswith("posbench.eval"))
    assert importers == ["posbench.eval.subject"]


def test_code_version_says_when_the_checkout_differs_from_its_commit(tmp_path):
    """A results row's code_version names the commit, and '.dirty' where posbench's tracked files
    were changed since it: rows from a modified checkout do not claim a commit they did not run."""
    import shutil

    copy = tmp_path / "posbench"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "posbench"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    code = "import posbench.config as c; print(c.code_version())"
    read = lambda: subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                                  check=True).stdout.strip()
    clean = read()
    assert clean.startswith("0.1.0+") and not clean.endswith(".dirty")
    (copy / "errors.py").write_text((copy / "errors.py").read_text() + "\n# changed\n")
    assert read() == clean + ".dirty"


def test_ruff_finds_nothing():
    """``ruff check posbench`` passes with the rules pyproject.toml selects, so style is never a review topic."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e .[test] installs it)")
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "posbench"]
    found = subprocess.run(command, cwd=PACKAGE.parent, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr


def test_every_csv_the_package_reads_keeps_its_identifiers_as_text():
    """posbench reads its CSV files through posbench.eval.results.read_table only, which reads
    config hashes, code versions and --by values as text (a hash such as "28586650e810" is not a
    number; a window of 64 beside a run without one is not 64.0)."""
    def calls(node: ast.AST, where: str):
        """'path:function' of each read_csv call under ``node``, by the function that holds it."""
        for child in ast.iter_child_nodes(node):
            inside = f"{where.split(':')[0]}:{child.name}" if isinstance(child, ast.FunctionDef) else where
            if isinstance(child, ast.Call) and getattr(child.func, "attr", getattr(child.func, "id", "")) == "read_csv":
                yield inside
            yield from calls(child, inside)

    found = [c for path in sorted(PACKAGE.rglob("*.py"))
             for c in calls(ast.parse(path.read_text()), f"{path.relative_to(PACKAGE.parent)}:")]
    assert set(found) == {"posbench/eval/results.py:read_table"}, found


def test_the_study_runner_names_no_derived_metric():
    """LongPPL is one derived metric of posbench.study.derived, asked by the runner through the same
    three calls as any (after a sweep, before the report, after it): the runner never names it."""
    from posbench.study.derived import DERIVED, Derived

    assert "longppl" not in (PACKAGE / "study" / "run.py").read_text().lower()
    assert DERIVED and all(isinstance(m, Derived) and m.key for m in DERIVED)


def test_report_and_study_code_read_a_line_s_parts_from_data_not_from_its_label():
    """A line's --by values are columns (by:KEY) that every reader takes them from; no report or
    study module splits, partitions or matches a label to get them back (the ways it once did)."""
    patterns = ('split(" [")', 'partition(" [")', "label_parts", "split_variant", 'str.replace(r" \\(')
    found = [f"{path.relative_to(PACKAGE.parent)}: {p}" for folder in ("report", "study")
             for path in sorted((PACKAGE / folder).glob("*.py")) for p in patterns if p in path.read_text()]
    assert found == []
