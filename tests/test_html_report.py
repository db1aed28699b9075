"""report.html read back by a real headless browser: Debian's Chromium builds the page's DOM (its
script draws every line and the view in the address hides some), and the test reads the DOM it
dumps. .ci/run installs Chromium, so under CI=true a missing browser fails; elsewhere it skips."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from posbench.eval.results import line_names, with_labels
from posbench.report.build import report

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000", "--dump-dom"]


def browser() -> str:
    found = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no headless browser found (chromium); .ci/run installs Debian's chromium")
        pytest.skip("no headless browser here (apt-get install chromium)")
    return found


def dom(page: Path, tmp_path: Path, fragment: str = "") -> str:
    """The DOM Chromium builds from ``page`` (its scripts run), as it dumps it."""
    profile = tmp_path / f"profile{len(list(tmp_path.glob('profile*')))}"
    proc = subprocess.run([browser(), *FLAGS, f"--user-data-dir={profile}", page.resolve().as_uri() + fragment],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


def drawn(text: str, panel: str) -> set[str]:
    return {m.replace("&amp;", "&") for m in re.findall(rf'data-line="([^"]*)" data-panel="{panel}"', text)}


def test_the_html_report_draws_every_line_and_lists_every_verdict_in_a_real_browser(tmp_path):
    out = tmp_path / "report"
    report([ROOT / "results" / "baselines" / "headline"], out)
    summary = with_labels(pd.read_csv(out / "report.csv"))
    names = set(line_names(summary))
    assert len(names) == 5
    verdicts = [line[2:] for line in (out / "report.md").read_text().splitlines() if line.startswith("- verdict: ")]
    assert verdicts

    text = dom(out / "report.html", tmp_path)
    assert 'data-ready="yes"' in text and 'data-scale="log"' in text  # the script ran to its end
    assert drawn(text, "ppl") == names and drawn(text, "ratio") == names
    listed = [re.sub(r"<[^>]+>", "", m) for m in re.findall(r'<li class="verdict">(.*?)</li>', text)]
    assert [v.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") for v in listed] == verdicts
    assert text.count('class="point"') == 2 * len(summary.dropna(subset=["ppl_mean"]))  # a point a cell, two panels
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")  # nothing loaded from a network

    hidden = dom(out / "report.html", tmp_path, "#scale=linear&hide=sinusoidal|nope")
    assert 'data-scale="linear"' in hidden
    assert drawn(hidden, "ppl") == names - {"sinusoidal", "nope"} == drawn(hidden, "ratio")
