"""report.html: the report as one self-contained page to explore in a browser, offline.

Every line's perplexity and its ratio to train_len against the extrapolation factor (log2 x),
each with its 95% interval as a band; a checkbox per line and per group (the encoding, and the
setup: model, data, train_len), so lines are shown or hidden by name or by group; log or linear y;
each point's values on hover; the verdicts and the extrapolation summary beside the figures. The
view lives in the address (``report.html#scale=linear&hide=nope|sinusoidal``), so it can be
bookmarked or sent.

The page is plain HTML, an SVG the page's own script draws, and the rows as JSON in the page:
nothing is loaded from a network and no library is needed (a few KiB of JavaScript), so the file
works where it is copied, mailed or opened from a results folder. The SVG elements carry
``data-line`` attributes and the verdicts are list items, which the tests read back from the DOM
a headless Chromium builds (tests/test_html_report.py).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import pandas as pd

from ..eval.results import line_names
from ..runs.rundir import atomic_write_text

SETUP = ("model", "data", "train_len")  # a line's setup group: the LINE columns besides its label


def _number(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) or pd.isna(x) else float(x)


def page_data(summary: pd.DataFrame) -> list[dict]:
    """One entry per line of the report's summary: its name, groups and points (the eval length,
    its multiple of train_len, ppl with its interval, the ratio with its interval, the seeds)."""
    summary = summary.assign(name=line_names(summary))
    lines = []
    for name, g in summary.groupby("name", sort=False):
        g = g.sort_values("eval_len")
        first = g.iloc[0]
        setup = ", ".join(f"{c}={first[c]}" for c in SETUP if c in g)
        points = [{"L": int(r.eval_len), "x": float(r.eval_len) / float(r.train_len),
                   "ppl": _number(r.ppl_mean), "lo": _number(getattr(r, "ppl_ci_low", None)),
                   "hi": _number(getattr(r, "ppl_ci_high", None)), "ratio": _number(getattr(r, "ratio_mean", None)),
                   "rlo": _number(getattr(r, "ratio_ci_low", None)), "rhi": _number(getattr(r, "ratio_ci_high", None)),
                   "seeds": int(r.n_ok) if "n_ok" in g and not pd.isna(r.n_ok) else None}
                  for r in g.itertuples()]
        lines.append({"name": str(name), "encoding": str(first.encoding), "setup": setup, "points": points})
    return lines


def write_html(path: Path, summary: pd.DataFrame, title: str, summary_lines: list[str], verdicts: list[str],
               header: str = "") -> Path:
    """report.html at ``path`` (module docstring); ``summary_lines``: the extrapolation summary,
    ``verdicts``: the verdict lines, ``header``: how the runs' setups differ."""
    data = json.dumps(page_data(summary), separators=(",", ":")).replace("</", "<\\/")
    items = "".join(f"<li>{html.escape(line.strip())}</li>" for line in summary_lines)
    said = "".join(f'<li class="verdict">{html.escape(line)}</li>' for line in verdicts)
    page = (PAGE.replace("@TITLE@", html.escape(title)).replace("@HEADER@", html.escape(header))
            .replace("@SUMMARY@", items).replace("@VERDICTS@", said or "<li>none</li>").replace("@DATA@", data)
            .replace("@SCRIPT@", SCRIPT))
    atomic_write_text(path, page)
    return path


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>@TITLE@</title>
<style>
body{font-family:system-ui,sans-serif;margin:1em;color:#222}
#layout{display:flex;gap:1.5em;align-items:flex-start;flex-wrap:wrap}
#controls{min-width:14em;max-width:22em;font-size:13px}
#controls label{display:block;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
#figures svg{border:1px solid #ddd;margin:0 0 1em 0;background:#fff}
#tip{position:fixed;pointer-events:none;background:#fffbe6;border:1px solid #aaa;padding:4px 6px;font-size:12px;
display:none;white-space:pre}
.axis text{font-size:11px}.axis line,.axis path{stroke:#888}
#text{max-width:60em;font-size:13px}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px}
.warning{background:#fff3cd;border:1px solid #d39e00;border-left:6px solid #d39e00;padding:.6em .9em;max-width:60em}
</style></head><body>
<h1>@TITLE@</h1><p>@HEADER@</p>
<div id="layout">
<div id="controls">
<fieldset><legend>y axis</legend>
<label><input type="radio" name="scale" value="log" checked> log</label>
<label><input type="radio" name="scale" value="linear"> linear</label></fieldset>
<fieldset><legend>groups</legend><div id="groups"></div></fieldset>
<fieldset><legend>lines</legend><div id="lines"></div></fieldset>
</div>
<div id="figures"><svg id="ppl" width="640" height="380"></svg><svg id="ratio" width="640" height="380"></svg></div>
</div>
<div id="text"><h2>Length extrapolation</h2><ul id="summary">@SUMMARY@</ul>
<h2>Verdicts</h2><ul id="verdicts">@VERDICTS@</ul></div>
<div id="tip"></div>
<script type="application/json" id="data">@DATA@</script>
<script>@SCRIPT@</script>
</body></html>
"""

SCRIPT = r"""
(function () {
  const lines = JSON.parse(document.getElementById("data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const colours = ["#1f77b4","#ff7f0e","#2ca02c","#d62728","#9467bd","#8c564b","#e377c2","#7f7f7f","#bcbd22",
                   "#17becf"];
  const shown = new Map(lines.map(l => [l.name, true]));
  const colour = new Map(lines.map((l, i) => [l.name, colours[i % colours.length]]));
  let scale = "log";
  const tip = document.getElementById("tip");

  function el(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(v) { return v === null ? "n/a" : (Math.abs(v) >= 100 ? v.toFixed(1) : v.toFixed(3)); }

  function draw(id, key, lo, hi, label) {
    const svg = document.getElementById(id);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const W = +svg.getAttribute("width"), H = +svg.getAttribute("height"), m = {l: 60, r: 10, t: 24, b: 40};
    const visible = lines.filter(l => shown.get(l.name));
    const pts = visible.flatMap(l => l.points.filter(p => p[key] !== null));
    el("text", {x: m.l, y: 16, "font-size": 13}, svg).textContent = label;
    if (!pts.length) return;
    const xs = pts.map(p => Math.log2(p.x));
    const ys = pts.flatMap(p => [p[key], p[lo] === null ? p[key] : p[lo], p[hi] === null ? p[key] : p[hi]])
      .filter(v => v > 0 || scale === "linear");
    const ty = v => scale === "log" ? Math.log10(v) : v;
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys.map(ty)), y1 = Math.max(...ys.map(ty));
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const X = v => m.l + (Math.log2(v) - x0) / (x1 - x0) * (W - m.l - m.r);
    const Y = v => H - m.b - (ty(v) - y0) / (y1 - y0) * (H - m.t - m.b);
    const axis = el("g", {class: "axis"}, svg);
    el("line", {x1: m.l, y1: H - m.b, x2: W - m.r, y2: H - m.b}, axis);
    el("line", {x1: m.l, y1: m.t, x2: m.l, y2: H - m.b}, axis);
    for (let k = Math.ceil(x0); k <= Math.floor(x1); k++) {
      const x = X(2 ** k);
      el("line", {x1: x, y1: H - m.b, x2: x, y2: H - m.b + 4}, axis);
      el("text", {x: x, y: H - m.b + 16, "text-anchor": "middle"}, axis).textContent = (2 ** k) + "x";
    }
    el("text", {x: (W + m.l) / 2, y: H - 6, "text-anchor": "middle"}, axis).textContent =
      "evaluation length / train length";
    for (let i = 0; i <= 4; i++) {
      const t = y0 + (y1 - y0) * i / 4, v = scale === "log" ? 10 ** t : t, y = H - m.b - i / 4 * (H - m.t - m.b);
      el("line", {x1: m.l - 4, y1: y, x2: m.l, y2: y}, axis);
      el("text", {x: m.l - 6, y: y + 4, "text-anchor": "end"}, axis).textContent = fmt(v);
    }
    if (key === "ratio" && y0 < ty(1) && ty(1) < y1)
      el("line", {x1: m.l, y1: Y(1), x2: W - m.r, y2: Y(1), stroke: "#999", "stroke-dasharray": "4 3"}, svg);
    for (const l of visible) {
      const g = el("g", {class: "line", "data-line": l.name, "data-panel": id}, svg);
      const c = colour.get(l.name), ps = l.points.filter(p => p[key] !== null && (scale === "linear" || p[key] > 0));
      const band = ps.filter(p => p[lo] !== null && p[hi] !== null && (scale === "linear" || p[lo] > 0));
      if (band.length > 1) {
        const up = band.map(p => X(p.x) + "," + Y(p[hi]));
        const down = band.slice().reverse().map(p => X(p.x) + "," + Y(p[lo]));
        el("polygon", {points: up.concat(down).join(" "), fill: c, opacity: 0.15, class: "band"}, g);
      }
      el("polyline", {points: ps.map(p => X(p.x) + "," + Y(p[key])).join(" "), fill: "none", stroke: c,
                      "stroke-width": 2}, g);
      for (const p of ps) {
        const dot = el("circle", {cx: X(p.x), cy: Y(p[key]), r: 4, fill: c, class: "point"}, g);
        const text = l.name + "\nL=" + p.L + " (" + p.x + "x)\n" + (key === "ppl" ? "ppl " : "ratio ") + fmt(p[key]) +
          (p[lo] === null ? " [no interval]" : " [" + fmt(p[lo]) + ", " + fmt(p[hi]) + "]") +
          (p.seeds === null ? "" : "\nseeds " + p.seeds);
        el("title", {}, dot).textContent = text;
        dot.addEventListener("mousemove", e => { tip.style.display = "block"; tip.textContent = text;
          tip.style.left = (e.clientX + 12) + "px"; tip.style.top = (e.clientY + 12) + "px"; });
        dot.addEventListener("mouseleave", () => { tip.style.display = "none"; });
      }
    }
  }

  // the view in the address: #scale=linear&hide=name1|name2, so a view can be bookmarked or sent
  const view = new URLSearchParams(location.hash.slice(1));
  if (view.get("scale") === "linear") scale = "linear";
  for (const name of (view.get("hide") || "").split("|")) if (shown.has(name)) shown.set(name, false);
  for (const r of document.querySelectorAll('input[name="scale"]')) r.checked = r.value === scale;

  function redraw() {
    const hidden = lines.filter(l => !shown.get(l.name)).map(l => l.name);
    const state = new URLSearchParams();
    if (scale !== "log") state.set("scale", scale);
    if (hidden.length) state.set("hide", hidden.join("|"));
    history.replaceState(null, "", state.toString() ? "#" + state.toString() : location.pathname);
    document.body.setAttribute("data-scale", scale);
    draw("ppl", "ppl", "lo", "hi", "perplexity (95% interval: seeds and text)");
    draw("ratio", "ratio", "rlo", "rhi", "ppl(L) / ppl(train_len)");
    for (const box of document.querySelectorAll("#lines input")) box.checked = shown.get(box.value);
    for (const box of document.querySelectorAll("#groups input")) {
      const members = lines.filter(l => l[box.dataset.kind] === box.value);
      box.checked = members.every(l => shown.get(l.name));
      box.indeterminate = !box.checked && members.some(l => shown.get(l.name));
    }
  }

  const list = document.getElementById("lines");
  for (const l of lines) {
    const label = document.createElement("label");
    label.innerHTML = '<input type="checkbox" class="line-toggle"> <span class="swatch"></span>';
    label.firstChild.value = l.name;
    label.querySelector(".swatch").style.background = colour.get(l.name);
    label.appendChild(document.createTextNode(l.name));
    label.firstChild.addEventListener("change", e => { shown.set(l.name, e.target.checked); redraw(); });
    list.appendChild(label);
  }
  const groups = document.getElementById("groups");
  for (const kind of ["encoding", "setup"]) {
    const values = [...new Set(lines.map(l => l[kind]))];
    if (values.length < 2) continue;
    for (const v of values) {
      const label = document.createElement("label");
      label.innerHTML = '<input type="checkbox" class="group-toggle"> ';
      const box = label.firstChild;
      box.value = v; box.dataset.kind = kind;
      label.appendChild(document.createTextNode(kind + ": " + v));
      box.addEventListener("change", e => {
        for (const l of lines) if (l[kind] === v) shown.set(l.name, e.target.checked);
        redraw();
      });
      groups.appendChild(label);
    }
  }
  for (const r of document.querySelectorAll('input[name="scale"]'))
    r.addEventListener("change", e => { scale = e.target.value; redraw(); });
  redraw();
  document.body.setAttribute("data-ready", "yes");
})();
"""
