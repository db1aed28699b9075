"""A line named by its data: the key a study's contrasts (and ``--contrast``) name lines by.

A report's line is what its rows share: the encoding, what ran at inference (the RoPE scaling, the
method and its parameters: :class:`posbench.methods.Applied`), the protocol (mode, stride) and the
``--by`` values of its run's config. Its label (``rope [qk_norm=True, window=0]``) is that data
rendered for a person; a key is the data itself, as a mapping: ``{encoding: rope, qk_norm: True}``.

A key names the line whose values equal the key's. What a key leaves out takes the value that
names the line a reader would mean by it: the model as trained (no scaling, no method), the
non-overlapping protocol, and for each ``--by`` key the value most lines share (the value
:func:`posbench.eval.results.compact_names` leaves out of the names), or, for a key some lines'
configs lack (PoSE's ``pose_target`` beside plain runs), a line without it. So in the zoo
``{encoding: rope}`` is RoPE with every option at the zoo's own value, and ``{encoding: rope,
qk_norm: True}`` the line that differs there. A key that names no line, or several, is one line
naming the key and the lines there are.

On the command line a key is written as a YAML flow mapping, ``--contrast '{encoding: hope}/{encoding:
rope}'``; a study writes it as a mapping (conf/study/zoo.yaml).
"""

from __future__ import annotations

import json

import pandas as pd
import yaml

from ..errors import PosbenchError
from ..eval.results import BY, by_columns, shared_value

#: The fields of a key that are not ``--by`` keys, each with the value a key that leaves it out means.
FIELDS = {"encoding": None, "scaling": "none", "method": "none", "method_window": None, "method_group": None,
          "mode": "nonoverlapping", "stride": None}


def key_text(key: dict) -> str:
    """A key as the report and the command line write it (a flow mapping, one line)."""
    return "{" + ", ".join(f"{k}: {json.dumps(v) if not isinstance(v, str) else v}" for k, v in key.items()) + "}"


def parse_key(text: str) -> dict | None:
    """``'{encoding: rope, qk_norm: True}'`` -> the mapping; None for a text that is not a key (a label)."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PosbenchError(f"report: line key {text!r} is not a YAML mapping ({str(e).splitlines()[0]}); "
                            "valid: {encoding: rope, qk_norm: True}") from None
    if not isinstance(value, dict) or not value:
        raise PosbenchError(f"report: line key {text!r} is not a mapping of fields; valid: {{encoding: rope}}")
    return value


def _text(value) -> str:
    """A value as rows hold it (``by:`` values are text: 'True', '0', 'none')."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _column(field: str, lines: pd.DataFrame, by: list[str]) -> str:
    """The column of ``lines`` a key's ``field`` names: a fixed field, a ``--by`` key by its dotted
    name (``model.qk_norm``) or its last part where that names one (``qk_norm``)."""
    if field in FIELDS and field in lines:
        return field
    if BY + field in by:
        return BY + field
    matches = [c for c in by if c[len(BY):].rsplit(".", 1)[-1] == field]
    if len(matches) == 1:
        return matches[0]
    valid = [f for f in FIELDS if f in lines] + [c[len(BY):] for c in by]
    raise PosbenchError(f"report: line key field {field!r} is not a field of this report's lines; valid: "
                        + ", ".join(valid))


def resolve(key: dict, summary: pd.DataFrame, ignore=()) -> str:
    """The label of the one line of ``summary`` (a report's rows: ``label``, the fixed fields and
    ``by:`` columns) that ``key`` names (module docstring); one line if none or several.
    ``ignore``: ``--by`` keys that split setups, not lines (``--per``), which a key cannot name."""
    lines = summary.drop_duplicates("label").reset_index(drop=True)
    by = [c for c in by_columns(lines) if c[len(BY):] not in set(ignore)]
    given = {_column(f, lines, by): _text(v) for f, v in key.items()}
    left = [c for c in [*FIELDS, *by] if c in lines and c not in given]
    text = {c: lines[c].map(lambda x: _text(x) if pd.notna(x) else None) for c in [*given, *left]}
    found = lines
    for col, value in given.items():
        found = found[text[col][found.index] == value]
    for col in left:  # each left out: its preferred value, where a found line has it
        if len(found) <= 1:
            break
        values = text[col][found.index]
        if col in FIELDS:
            keep = values == FIELDS[col]
        elif lines[col].notna().all():
            keep = values == shared_value(text[col])
        else:  # a key some lines' configs lack (an option of PoSE's): the lines without it
            keep = values.isna()
        found = found[keep] if keep.any() else found
    if len(found) == 1:
        return found.label.iloc[0]
    what = "names no line" if found.empty else f"names {len(found)} lines ({', '.join(found.label)})"
    raise PosbenchError(f"report: line key {key_text(key)} {what}; valid: a key of one line of "
                        + ", ".join(lines.label))

