"""A line named by its data (posbench.report.keys): what a study's contrasts name lines by."""

from __future__ import annotations

import pandas as pd
import pytest

from posbench.errors import PosbenchError
from posbench.report.keys import key_text, parse_key, resolve
from posbench.report.verdicts import contrast_sides, line_name, split_contrast
from posbench.study.run import contrast_text
from posbench.study.spec import REPORT_TYPES, _is


def lines(*specs) -> pd.DataFrame:
    """A report's lines: (label, encoding, scaling, method, {by key: value or None})."""
    rows = []
    for label, encoding, scaling, method, by in specs:
        rows.append({"label": label, "encoding": encoding, "scaling": scaling, "method": method,
                     "mode": "nonoverlapping", **{f"by:{k}": v for k, v in by.items()}})
    return pd.DataFrame(rows)


ZOO = lines(
    ("rope [qk_norm=False, window=0]", "rope", "none", "none", {"model.qk_norm": "False", "model.window": "0"}),
    ("rope [qk_norm=True, window=0]", "rope", "none", "none", {"model.qk_norm": "True", "model.window": "0"}),
    ("rope [qk_norm=False, window=128]", "rope", "none", "none", {"model.qk_norm": "False", "model.window": "128"}),
    ("hope [qk_norm=False, window=0]", "hope", "none", "none", {"model.qk_norm": "False", "model.window": "0"}),
    ("rope+yarn [qk_norm=False, window=0]", "rope", "yarn", "none", {"model.qk_norm": "False", "model.window": "0"}),
    ("alibi [qk_norm=False, window=0]", "alibi", "none", "none", {"model.qk_norm": "False", "model.window": "0"}),
)


def test_a_key_names_the_line_with_its_values_and_the_shared_ones_it_leaves_out():
    assert resolve({"encoding": "rope"}, ZOO) == "rope [qk_norm=False, window=0]"  # as trained, shared values
    assert resolve({"encoding": "rope", "qk_norm": True}, ZOO) == "rope [qk_norm=True, window=0]"  # YAML's bool
    assert resolve({"encoding": "rope", "model.window": 128}, ZOO) == "rope [qk_norm=False, window=128]"
    assert resolve({"encoding": "rope", "scaling": "yarn"}, ZOO) == "rope+yarn [qk_norm=False, window=0]"
    assert resolve({"encoding": "hope"}, ZOO) == "hope [qk_norm=False, window=0]"


def test_a_key_left_out_that_some_lines_lack_names_the_line_without_it():
    """PoSE's option beside plain runs: {encoding: rope} is the rope run without it."""
    pose = lines(("rope [pose_target=2048]", "rope", "none", "none", {"train.pose_target": "2048"}),
                 ("rope", "rope", "none", "none", {"train.pose_target": None}),
                 ("alibi", "alibi", "none", "none", {"train.pose_target": None}))
    assert resolve({"encoding": "rope"}, pose) == "rope"
    assert resolve({"encoding": "rope", "pose_target": 2048}, pose) == "rope [pose_target=2048]"


@pytest.mark.parametrize("key, message", [
    ({"encoding": "rop"}, "report: line key {encoding: rop} names no line; valid: a key of one line of rope "),
    ({"encoding": "rope", "colour": "red"}, "report: line key field 'colour' is not a field of this report's "
                                            "lines; valid: encoding, scaling, method, mode, model.qk_norm, model.window"),
    ({"encoding": "rope", "qk_norm": "maybe"}, "names no line"),
])
def test_a_key_that_names_no_one_line_is_one_line(key, message):
    with pytest.raises(PosbenchError) as e:
        resolve(key, ZOO)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_key_that_names_several_lines_names_them():
    two = lines(("rope [seed_group=a]", "rope", "none", "none", {"x.seed_group": "a"}),
                ("rope [seed_group=b]", "rope", "none", "none", {"x.seed_group": "b"}))
    with pytest.raises(PosbenchError, match=r"names 2 lines \(rope \[seed_group=a\], rope \[seed_group=b\]\)"):
        resolve({"encoding": "rope"}, two)


def test_keys_as_text_on_the_command_line_and_in_a_study():
    assert parse_key("{encoding: rope, qk_norm: True}") == {"encoding": "rope", "qk_norm": True}
    assert parse_key("rope [qk_norm=True, window=0]") is None and parse_key("alibi sliding/16") is None
    with pytest.raises(PosbenchError, match="is not a YAML mapping"):
        parse_key("{encoding: [rope}")
    assert key_text({"encoding": "rope", "qk_norm": True, "window": 128}) == "{encoding: rope, qk_norm: true, window: 128}"
    assert parse_key(key_text({"encoding": "rope", "qk_norm": True})) == {"encoding": "rope", "qk_norm": True}
    text = contrast_text([{"encoding": "hope"}, {"encoding": "rope", "window": 128}])
    assert text == "{encoding: hope}/{encoding: rope, window: 128}"
    assert split_contrast(text, set()) == ("{encoding: hope}", "{encoding: rope, window: 128}")
    assert split_contrast("alibi sliding/16/{encoding: rope}", set()) == ("alibi sliding/16", "{encoding: rope}")
    assert contrast_text(["rope", {"encoding": "alibi"}]) == "rope/{encoding: alibi}"
    assert _is([[{"encoding": "hope"}, "rope"], "a/b"], REPORT_TYPES["contrasts"])
    assert not _is([[{}, "rope"]], REPORT_TYPES["contrasts"])
    sides = [line_name(s, ZOO) for s in contrast_sides(text, set(ZOO.label))]
    assert sides == ["hope [qk_norm=False, window=0]", "rope [qk_norm=False, window=128]"]
    # a study's key that names no line (a study reported before its runs exist) stays its text
    assert line_name("{encoding: fope}", ZOO) == "{encoding: fope}"
    with pytest.raises(PosbenchError, match="names no line"):
        line_name("{encoding: fope}", ZOO, strict=True)
