"""A study file read and checked (:class:`Study`), and its stages' grid points as :class:`Sweep` s:
one a grid point, with its folder under ``out`` and ``runs``, the parent it starts from or
evaluates, or its pretrained model. The file's format is the package's docstring."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from ..config import conf_dir, split_outside_brackets
from ..errors import PosbenchError

STUDY_KEYS = ("description", "out", "runs", "results", "folder", "common", "stages", "report")
STAGE_KEYS = ("name", "grid", "overrides", "from", "eval", "pretrained", "folder")
REPORT_KEYS = ("by", "per", "dirs", "args", "tables", "contrasts", "longppl")
TABLE_KINDS = ("encodings",)  # report.tables' kinds: posbench.report.encoding_table.TABLES (torch-free here)
LONGPPL_KEYS = ("evaluator", "short", "short_stride", "long", "alpha", "beta", "sensitivity")
SENSITIVITY_KEYS = ("short", "short_stride", "long", "alpha", "beta")  # what a sensitivity may change
FOLDER = "{stage}/{point}"


@dataclass(frozen=True)
class Sweep:
    """The runs of one grid point of one stage: the same overrides, one seed each."""

    stage: str
    overrides: tuple[str, ...]  # the grid point's own, then the stage's
    seeds: tuple[int, ...]
    folder: str = ""  # its runs' folder under out and runs: out/<folder>/seed=N
    parent: str = ""  # the folder of the sweep its runs start from (a stage's ``from``), or none
    evaluates: bool = False  # an eval stage's: ``posbench eval`` on the parent's runs (folder == parent)
    pretrained: str = ""  # a pretrained stage's model (``posbench eval pretrained=...``; its rows go to out/<folder>)

    @property
    def name(self) -> str:
        return ",".join(o for o in self.overrides if "=" in o).replace("/", "_") or "default"


@dataclass
class Study:
    name: str
    description: str
    out: Path
    runs: Path
    results: Path
    common: list[str]
    stages: list[dict]
    report: dict = field(default_factory=dict)
    folder: str = FOLDER
    config_dirs: list[Path] = field(default_factory=list)  # --config-dir: passed to every run


def study_files(config_dirs: list[Path]) -> dict[str, Path]:
    """Study name -> file, the user's config dirs first (a user's study of a built-in's name wins)."""
    found: dict[str, Path] = {}
    for base in [*config_dirs, conf_dir()]:
        for path in sorted((Path(base) / "study").glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def _unknown(where: str, data: dict, valid: tuple[str, ...]) -> None:
    bad = [k for k in data if k not in valid]
    if bad:
        raise PosbenchError(f"study: {where} has an unknown key {bad[0]!r}; valid keys: {', '.join(valid)}")


# the type each key of a study file holds: checked for the whole file before anything runs
STR, BOOL, STRS, MAP, SCALAR = "a string", "true or false", "a list of strings", "a mapping", "a number or string"
STUDY_TYPES = {"description": STR, "out": STR, "runs": STR, "results": STR, "folder": STR, "common": STRS,
               "stages": "a list of stages (mappings)", "report": MAP}
STAGE_TYPES = {"name": STR, "grid": MAP, "overrides": STRS, "from": STR, "eval": BOOL, "pretrained": STR,
               "folder": STR}
REPORT_TYPES = {"by": STRS, "per": STRS, "dirs": STRS, "args": STRS, "tables": MAP,
                "contrasts": "a list of [line, line] pairs (a line: its label, or its key, a mapping such as "
                             "{encoding: rope, qk_norm: True}) or 'line/line' strings", "longppl": MAP}


def _is(value, kind: str) -> bool:
    """Whether ``value`` (as YAML read it) is of ``kind`` (:data:`STUDY_TYPES` and the like)."""
    scalar = isinstance(value, (str, int, float)) and not isinstance(value, bool)
    checks = {STR: isinstance(value, str) or (scalar and not isinstance(value, str)),  # 2026 names a folder too
              BOOL: isinstance(value, bool), MAP: isinstance(value, dict), SCALAR: scalar,
              STRS: isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                                    for v in value),
              STUDY_TYPES["stages"]: isinstance(value, list) and all(isinstance(v, dict) for v in value),
              REPORT_TYPES["contrasts"]: isinstance(value, list) and all(
                  isinstance(v, str) or (isinstance(v, list) and len(v) == 2 and all(
                      isinstance(x, str) or (isinstance(x, dict) and x) for x in v))
                  for v in value)}
    return checks[kind]


def _types(where: str, data: dict, types: dict[str, str]) -> None:
    """One line for the first key of ``data`` whose value is not of its type, naming both."""
    for key, kind in types.items():
        if key in data and data[key] is not None and not _is(data[key], kind):
            raise PosbenchError(f"study: {where} {key} is {data[key]!r} ({type(data[key]).__name__}); valid: {kind}")


def read_study_file(path: Path) -> dict:
    """A study file parsed as YAML, a mapping; one line naming the file and line where it is not."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise PosbenchError(f"study: {path}{where}: {problem} (not valid YAML); valid: a YAML mapping of "
                            f"{', '.join(STUDY_KEYS)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PosbenchError(f"study: {path} cannot be read ({type(e).__name__}: {e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PosbenchError(f"study: {path} holds {type(data).__name__}, not a mapping; valid: a YAML mapping of "
                            f"{', '.join(STUDY_KEYS)}")
    return data


def describe_study(path: Path) -> str:
    """A study's description for ``posbench study``'s listing, or 'broken: <why>' for a file that
    does not load (the listing goes on with the others)."""
    try:
        return str(_checked(path).get("description", ""))
    except PosbenchError as e:
        return f"broken: {str(e).removeprefix('study: ')}"


def load_study(name: str, config_dirs: list[Path] = ()) -> Study:
    files = study_files(list(config_dirs))
    if name not in files:
        raise PosbenchError(f"study {name!r} is not known; valid choices: {', '.join(sorted(files)) or 'none'} "
                            "(conf/study/*.yaml, or --config-dir DIR with DIR/study/<name>.yaml)")
    data = _checked(files[name])
    return Study(name, data.get("description", ""), Path(data["out"]), Path(data["runs"]), Path(data["results"]),
                 list(data.get("common") or []), list(data["stages"]), dict(data.get("report") or {}),
                 str(data.get("folder") or FOLDER))


def _checked(path: Path) -> dict:
    """A study file read and checked whole (keys, types, the rules between them) -> its data."""
    files, name = {path.stem: path}, path.stem
    data = read_study_file(path)
    _unknown(str(files[name]), data, STUDY_KEYS)
    _types(str(path), data, STUDY_TYPES)
    for i, stage in enumerate(data.get("stages") or []):
        _unknown(f"{path} stage {i}", stage, STAGE_KEYS)
        _types(f"{path} stage {stage.get('name', i)}", stage, STAGE_TYPES)
        for key, values in (stage.get("grid") or {}).items():
            listed = values if isinstance(values, list) else [values]
            if not all(_is(v, SCALAR) or isinstance(v, bool) or _is(v, STRS) for v in listed):
                raise PosbenchError(f"study: {path} stage {stage.get('name', i)} grid {key} is {values!r}; valid: "
                                    "a value or a list of values (numbers, strings, true/false, or lists of them)")
    _types(f"{path} report", data.get("report") or {}, REPORT_TYPES)
    for key in ("out", "runs", "results", "stages"):
        if not data.get(key):
            raise PosbenchError(f"study: {files[name]} lacks {key!r}; a study says out, runs, results and stages")
    for i, stage in enumerate(data["stages"]):
        _unknown(f"{files[name]} stage {i}", stage, STAGE_KEYS)
        if not stage.get("name") or not isinstance(stage.get("grid"), dict):
            raise PosbenchError(f"study: {files[name]} stage {i} needs a name and a grid (key: [values])")
        if stage.get("eval") and not stage.get("from"):
            raise PosbenchError(f"study: {files[name]} stage {stage['name']} has eval: true and no from:; an eval "
                                "stage evaluates the runs of the earlier stage its from: names")
        if stage.get("pretrained"):
            _check_pretrained_stage(files[name], stage)
    _unknown(f"{files[name]} report", data.get("report") or {}, REPORT_KEYS)
    for file, kind in ((data.get("report") or {}).get("tables") or {}).items():
        if kind not in TABLE_KINDS and not str(kind).endswith(".py"):
            raise PosbenchError(f"study: {files[name]} report.tables {file}: {kind!r} is not a table; valid: "
                                f"{', '.join(TABLE_KINDS)}, or a script (FILE.py) run on report.csv")
    longppl = (data.get("report") or {}).get("longppl")
    _unknown(f"{files[name]} report.longppl", longppl or {}, LONGPPL_KEYS)
    if longppl and not longppl.get("evaluator"):
        raise PosbenchError(f"study: {files[name]} report.longppl has no evaluator; valid: the folder under out whose "
                            "rows choose the key tokens, e.g. {evaluator: gemma3-270m/bos=first, short: 4096}")
    _check_sensitivity(files[name], (longppl or {}).get("sensitivity"))
    return data


def _check_sensitivity(path: Path, sensitivity) -> None:
    """report.longppl.sensitivity: {NAME: {key: value}}, each NAME a file name's part (the rows go to
    runs/longppl_NAME.csv), each a change of some of :data:`SENSITIVITY_KEYS`."""
    if sensitivity is None:
        return
    if not isinstance(sensitivity, dict) or not sensitivity:
        raise PosbenchError(f"study: {path} report.longppl.sensitivity is {sensitivity!r}; valid: NAME: "
                            "{key: value}, e.g. {alpha0.5: {alpha: 0.5}}")
    for label, change in sensitivity.items():
        if not re.fullmatch(r"[A-Za-z0-9._-]+", str(label)):
            raise PosbenchError(f"study: {path} report.longppl.sensitivity name {label!r} is not valid; valid: "
                                "letters, digits, '.', '_' and '-' (it names the file runs/longppl_NAME.csv)")
        if not isinstance(change, dict) or not change:
            raise PosbenchError(f"study: {path} report.longppl.sensitivity {label} is {change!r}; valid: a mapping of "
                                f"some of {', '.join(SENSITIVITY_KEYS)}")
        _unknown(f"{path} report.longppl.sensitivity {label}", change, SENSITIVITY_KEYS)


def _check_pretrained_stage(path: Path, stage: dict) -> None:
    """A pretrained stage evaluates one model: no seeds, no parent stage."""
    for key in ("from", "eval"):
        if stage.get(key):
            raise PosbenchError(f"study: {path} stage {stage['name']} has pretrained: and {key}:; valid: a "
                                "pretrained stage evaluates its model by itself (no from:, no eval:)")
    if "seed" in stage["grid"]:
        raise PosbenchError(f"study: {path} stage {stage['name']} has pretrained: and a seed in its grid; valid: "
                            "grid keys of posbench eval (eval.rope_scaling, bos, ...): a pretrained model has one seed")


def sweeps(study: Study, only: list[str] | None = None) -> list[Sweep]:
    """Every grid point of the chosen stages (all by default), in the file's order."""
    names = [s["name"] for s in study.stages]
    for n in only or []:
        if n not in names:
            raise PosbenchError(f"study {study.name}: --only {n!r} is not one of its stages; valid choices: "
                                f"{', '.join(names)}")
    out, folders, shared = [], {}, set()  # shared: the pretrained stages' folders
    points: dict[str, list[tuple[dict, str]]] = {}  # stage -> (grid point, folder) of each of its sweeps
    for stage in study.stages:
        grid = {k: (v if isinstance(v, list) else [v]) for k, v in stage["grid"].items()}
        seeds = tuple(int(s) for s in grid.pop("seed", [0]))
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            if stage.get("pretrained"):  # its folder may be shared: every method's rows in one run dir
                sweep = _pretrained_sweep(study, stage, dict(zip(keys, values)))
                if sweep.folder in folders:
                    raise PosbenchError(f"study {study.name}: {folders[sweep.folder]} and pretrained stage "
                                        f"{sweep.stage} share the folder {sweep.folder!r}; put more grid keys in "
                                        "its folder")
                shared.add(sweep.folder)
                if not only or stage["name"] in only:
                    out.append(sweep)
                continue
            if stage.get("eval"):  # no folder of its own: its runs are its parent's
                sweep = _eval_sweep(study, stage, dict(zip(keys, values)), seeds, points)
                points.setdefault(stage["name"], []).append((dict(zip(keys, values)), sweep.folder))
                if not only or stage["name"] in only:
                    out.append(sweep)
                continue
            point = tuple(f"{k}={_value(v)}" for k, v in zip(keys, values))
            sweep = Sweep(stage["name"], point + tuple(stage.get("overrides") or []), seeds)
            sweep = replace(sweep, folder=_folder(study, sweep, dict(zip(keys, values)), stage.get("folder")))
            points.setdefault(stage["name"], []).append((dict(zip(keys, values)), sweep.folder))
            if stage.get("from"):
                sweep = _with_parent(study, sweep, stage, dict(zip(keys, values)), points)
            if sweep.folder in folders or sweep.folder in shared:  # over every stage: --only hides no clash
                other = folders.get(sweep.folder, "a pretrained stage")
                raise PosbenchError(f"study {study.name}: {other} and {sweep.stage} {sweep.name} share the folder "
                                    f"{sweep.folder!r}; put more grid keys in its folder")
            folders[sweep.folder] = f"{sweep.stage} {sweep.name}"
            if not only or stage["name"] in only:
                out.append(sweep)
    return out


def _with_parent(study: Study, sweep: Sweep, stage: dict, point: dict, points: dict) -> Sweep:
    """``sweep`` with ``{from}`` in its overrides made the run dir of the same grid point's run in
    the stage it starts from (an earlier stage of the file)."""
    parent = stage["from"]
    if parent not in points or parent == stage["name"]:
        earlier = [n for n in points if n != stage["name"]]
        raise PosbenchError(f"study {study.name}: stage {stage['name']} has from: {parent!r}, which is not an "
                            f"earlier stage; valid choices: {', '.join(earlier) or 'none'}")
    found = [folder for p, folder in points[parent] if all(p[k] == v for k, v in point.items() if k in p)]
    if len(found) != 1:
        raise PosbenchError(f"study {study.name}: stage {stage['name']} point {sweep.name} matches {len(found)} "
                            f"sweeps of stage {parent}; the grid keys they share must name one")
    run = f"'{study.out / found[0]}/seed=${{seed}}'"  # quoted: Hydra reads '=' in a value only so
    overrides = tuple(o.replace("{from}", run) for o in sweep.overrides)
    return replace(sweep, overrides=overrides, parent=found[0])


def _eval_sweep(study: Study, stage: dict, point: dict, seeds: tuple[int, ...], points: dict) -> Sweep:
    """An eval stage's grid point: the grid keys its parent stage has pick the parent's sweep (its
    folder, run dirs and exports are this sweep's); the other keys (``eval.rope_scaling``, ...) and
    the stage's overrides are the ``posbench eval`` overrides."""
    parent = next((s for s in study.stages if s["name"] == stage["from"]), None)
    shared = set(parent["grid"]) - {"seed"} if parent else set()
    own = tuple(f"{k}={_value(v)}" for k, v in point.items() if k not in shared)
    sweep = Sweep(stage["name"], own + tuple(stage.get("overrides") or []), seeds, evaluates=True)
    sweep = _with_parent(study, sweep, stage, {k: v for k, v in point.items() if k in shared}, points)
    return replace(sweep, folder=sweep.parent)


def _pretrained_sweep(study: Study, stage: dict, point: dict) -> Sweep:
    """A pretrained stage's grid point: ``posbench eval pretrained=<model> out=<out/folder>`` with
    the point's and the stage's overrides; its folder is the study's, with ``{pretrained}`` the
    model's name (a study gives every method of one model the same folder, so a method's lengths
    that leave the model as trained reuse the unscaled rows there)."""
    own = tuple(f"{k}={_value(v)}" for k, v in point.items())
    model = str(stage["pretrained"])
    sweep = Sweep(stage["name"], own + tuple(stage.get("overrides") or []), (0,), pretrained=model)
    return replace(sweep, folder=_folder(study, sweep, {"pretrained": Path(model).stem, **point}, stage.get("folder")))


def _folder(study: Study, sweep: Sweep, point: dict, own: str | None = None) -> str:
    """The study's ``folder`` (or the stage's ``own``) for one grid point: {stage}, {point} and the
    grid's keys filled in."""
    named = replace(sweep, overrides=tuple(o for o in sweep.overrides if "{from}" not in o))  # a parent's run dir
    values = {"stage": sweep.stage, "point": named.name, **{k: _value(v).replace("/", "_") for k, v in point.items()}}
    template = own or study.folder
    folder = template
    for key, value in values.items():
        folder = folder.replace("{" + key + "}", value)
    if "{" in folder:
        raise PosbenchError(f"study {study.name}: folder {template!r} names a key stage {sweep.stage} lacks; "
                            f"valid keys: {', '.join(values)}")
    return folder


def _value(v) -> str:
    if isinstance(v, list):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return str(v).lower()
    return "null" if v is None else str(v)


def parse_where(items: list[str]) -> dict[str, set[str]]:
    """``--where KEY=V1,V2`` (repeatable) -> {KEY: {V1, V2}}; a comma inside brackets belongs to
    its value (``probe.lengths=[1024,2048]``: :func:`posbench.config.split_outside_brackets`), and
    a KEY given twice takes both lists."""
    where: dict[str, set[str]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key or not text:
            raise PosbenchError(f"study: --where {item!r} is not valid; valid: KEY=VALUE[,VALUE...], e.g. "
                                "--where encoding=alibi,rope --where seed=1")
        where.setdefault(override_key(item), set()).update(split_outside_brackets(text))
    return where


def override_key(override: str) -> str:
    """The key a Hydra override sets: ``+train.x=1`` -> ``train.x``."""
    return override.split("=", 1)[0].lstrip("+")


def _setting(sweep: Sweep, key: str) -> str | None:
    """The value a sweep's overrides give ``key`` (its grid point's or its stage's), else None."""
    found = [o.split("=", 1)[1] for o in sweep.overrides if "=" in o and override_key(o) == key]
    return found[0] if found else None


def restrict(study: Study, chosen: list[Sweep], where: dict[str, set[str]]) -> list[Sweep]:
    """The runs of ``chosen`` that ``where`` picks (:func:`parse_where`): a sweep whose overrides set
    every key to one of its values, and of its seeds those ``seed`` names (a pretrained sweep has
    seed 0; an eval stage's sweep has its parent's grid keys too). A key no sweep sets, or a value
    none has, is one line naming the valid ones: a typo never selects nothing in silence."""
    parents = {s.folder: s for s in sweeps(study) if not s.evaluates} if where else {}

    def setting(sweep: Sweep, key: str) -> str | None:
        own = _setting(sweep, key)
        return _setting(parents[sweep.folder], key) if own is None and sweep.evaluates else own

    for key, values in where.items():
        if key == "seed":
            have = {str(s) for sweep in chosen for s in sweep.seeds}
        else:
            have = {v for sweep in chosen if (v := setting(sweep, key)) is not None}
            if not have:
                keys = sorted({override_key(o) for s in chosen for o in s.overrides if "=" in o})
                raise PosbenchError(f"study {study.name}: --where {key}: no run of the chosen stages sets {key}; "
                                    f"valid keys: seed, {', '.join(keys)}")
        if values - have:
            raise PosbenchError(f"study {study.name}: --where {key}={','.join(sorted(values - have))} matches no "
                                f"run; valid values of {key}: {', '.join(sorted(have))}")
    kept = []
    for sweep in chosen:
        if any(setting(sweep, k) not in v for k, v in where.items() if k != "seed"):
            continue
        seeds = tuple(s for s in sweep.seeds if "seed" not in where or str(s) in where["seed"])
        kept += [replace(sweep, seeds=seeds)] if seeds else []
    return kept
