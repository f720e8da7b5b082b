// orch ui: a search's page (#/sweep/ID of `orch sweep --trials N`): its trials ranked, as `orch sweep show`
// ranks them, parallel coordinates (one line per ended trial across the searched parameters, the objective on
// the last axis, pruned trials grey, the best red) and a scatter of the objective against each parameter. The
// places come from `orch sweep show --json`'s coordinates, the same `orch sweep plot` draws as an image. Every
// element a test reads carries data- attributes: data-trial, data-state, data-objective, data-axis.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const SEARCH_COLOURS = { complete: "#2463eb", pruned: "#b8b8b8", best: "#e4572e" };

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// the objective of a trial, by its number (the lines carry places from 0 to 1, not values)
function objectives(rows) {
  return Object.fromEntries(rows.map(r => [r.trial, r.objective]));
}

function parallelCoordinates(c, rows) {
  const W = 960, H = 340, left = 70, right = 70, top = 24, bottom = 48;
  const n = c.axes.length, span = H - top - bottom;
  const x = i => n > 1 ? left + i * (W - left - right) / (n - 1) : W / 2;
  const y = v => top + (1 - v) * span;  // 0 at the bottom: the best objective (the coordinates put it at 0)
  const objective = objectives(rows);
  const bestTrial = c.best ? c.best.trial : null;
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", "data-chart": "parallel", "data-lines": c.lines.length, role: "img" });
  c.axes.forEach((name, i) => {
    const [lo, hi] = c.ticks[i];
    chart.append(svg("g", { "data-axis": name, "data-last": i === n - 1 ? "1" : null },
      svg("line", { x1: x(i), x2: x(i), y1: top, y2: top + span, stroke: "#444", "stroke-width": 1 }),
      svg("text", { x: x(i), y: H - 26, "text-anchor": "middle", "font-size": 12, "font-weight": i === n - 1 ? "bold" : null }, name),
      svg("text", { x: x(i) + 4, y: top + span - 2, "font-size": 10, fill: "#666" }, lo),
      svg("text", { x: x(i) + 4, y: top + 10, "font-size": 10, fill: "#666" }, hi)));
  });
  // the pruned first, the kept over them, the best on top
  const order = [...c.lines].sort((a, b) => (a.state === "pruned" ? 0 : a.trial === bestTrial ? 2 : 1) - (b.state === "pruned" ? 0 : b.trial === bestTrial ? 2 : 1));
  for (const line of order) {
    const best = line.trial === bestTrial;
    const colour = best ? SEARCH_COLOURS.best : SEARCH_COLOURS[line.state] || SEARCH_COLOURS.complete;
    const el = svg("polyline", { points: line.y.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" "),
      fill: "none", stroke: colour, "stroke-width": best ? 2.6 : line.state === "pruned" ? 1 : 1.6, opacity: 0.85,
      "data-trial": line.trial, "data-state": line.state, "data-best": best ? "1" : null,
      "data-objective": objective[line.trial], "data-colour": colour },
      svg("title", {}, `trial ${line.trial} (${line.state}): ${sig3(objective[line.trial])}`));
    chart.append(el);
  }
  return chart;
}

function scatter(c, name, metric) {
  const W = 300, H = 220, left = 52, right = 12, top = 12, bottom = 40;
  const pts = c.scatter[name];
  const categorical = pts.some(p => typeof p[0] === "string");
  const cats = categorical ? [...new Set(pts.map(p => String(p[0])))] : [];
  const log = !!c.log[name];
  const xv = p => categorical ? cats.indexOf(String(p[0])) : log ? Math.log10(p[0]) : p[0];
  const xs = pts.map(xv), ys = pts.map(p => p[1]);
  const lo = Math.min(...xs), hi = Math.max(...xs), ylo = Math.min(...ys), yhi = Math.max(...ys);
  const px = v => left + (hi > lo ? (v - lo) / (hi - lo) : 0.5) * (W - left - right);
  const py = v => top + (yhi > ylo ? 1 - (v - ylo) / (yhi - ylo) : 0.5) * (H - top - bottom);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, "data-chart": "scatter", "data-param": name, "data-points": pts.length, role: "img" },
    svg("line", { x1: left, x2: W - right, y1: H - bottom, y2: H - bottom, stroke: "#444" }),
    svg("line", { x1: left, x2: left, y1: top, y2: H - bottom, stroke: "#444" }),
    svg("text", { x: (left + W - right) / 2, y: H - 6, "text-anchor": "middle", "font-size": 12 }, name + (log ? " (log)" : "")),
    svg("text", { x: 4, y: top + 8, "font-size": 10, fill: "#666" }, sig3(yhi)),
    svg("text", { x: 4, y: H - bottom, "font-size": 10, fill: "#666" }, sig3(ylo)),
    svg("text", { x: left, y: H - bottom + 14, "font-size": 10, fill: "#666" }, categorical ? cats[0] : sig3(log ? 10 ** lo : lo)),
    svg("text", { x: W - right, y: H - bottom + 14, "font-size": 10, fill: "#666", "text-anchor": "end" }, categorical ? cats[cats.length - 1] : sig3(log ? 10 ** hi : hi)));
  pts.forEach((p, k) => chart.append(svg("circle", { cx: px(xs[k]).toFixed(1), cy: py(p[1]).toFixed(1), r: 4,
    fill: SEARCH_COLOURS[p[2]] || SEARCH_COLOURS.complete, "data-state": p[2], "data-x": p[0], "data-y": p[1] },
    svg("title", {}, `${name} ${p[0]}: ${metric} ${sig3(p[1])} (${p[2]})`))));
  return chart;
}

function searchView(s, charts) {
  const c = s.coordinates;
  const keys = s.keys;
  const stopBtn = h("button", { class: "danger", "data-action": "sweep-stop", onclick: async () => {
    if (!await confirmDialog(`Stop sweep ${s.sweep}?`, ["Its conductor ends first (no new trial is asked), then its queued trials are taken out of the queues and its running ones stopped (as orch sweep stop)."])) return;
    try { const r = await post(`/api/sweeps/${encodeURIComponent(s.sweep)}/stop`); toast(`sweep ${s.sweep}: ${r.dequeued.length} dequeued, ${r.stopped.length} stopped`); }
    catch (e) { toast(e.message, true); }
  } }, "Stop sweep");
  const said = `${s.trials_asked}/${s.trials} trials, ${s.sampler} sampler, pruning ${s.prune}, objective ${s.metric} (${s.mode})` +
    (s.saved !== null && s.saved !== undefined ? ` · pruning saved ${Math.round(100 * s.saved)}% of the steps` : "") +
    (s.error ? ` · ended: ${s.error}` : "");
  view.replaceChildren(
    h("h2", {}, `Sweep ${s.sweep}`),
    h("div", { class: "actions" }, stopBtn),
    h("p", { class: "muted", "data-search": s.sweep }, said),
    h("h3", {}, "Parallel coordinates"),
    c.lines.length ? h("div", { class: "search-plot" }, parallelCoordinates(c, s.rows),
      h("p", { class: "muted" }, `one line per ended trial; ${s.metric} on the last axis, the best at the bottom (red); pruned trials grey, at the value they were pruned with`))
      : h("p", { class: "muted" }, "no trial has ended yet"),
    c.lines.length ? h("div", { class: "search-scatter" }, ...c.axes.slice(0, -1).map(name => scatter(c, name, s.metric))) : null,
    h("h3", {}, "Trials"),
    h("table", { id: "search" }, h("thead", {}, h("tr", {}, ...["", "trial", "exp", "state", ...keys, s.metric, "rung", "threshold", "steps"].map(k => h("th", {}, k)))),
      h("tbody", {}, ...s.rows.map(r => h("tr", { "data-trial": r.trial, "data-state": r.state, onclick: r.experiment ? () => { location.hash = `#/exp/${r.experiment}`; } : null },
        h("td", { class: "best" }, r.best ? "best" : ""), h("td", {}, r.trial), h("td", {}, r.experiment ?? "-"),
        h("td", {}, state(r.state), r.resumed ? ` (resumed: exp ${r.resumed})` : ""),
        ...keys.map(k => h("td", { class: "num" }, typeof r.params[k] === "number" ? sig3(r.params[k]) : r.params[k] ?? "-")),
        h("td", { class: "num" }, sig3(r.objective)), h("td", { class: "num" }, r.rung ?? "-"),
        h("td", { class: "num" }, sig3(r.threshold)), h("td", { class: "num" }, sig3(r.steps)))))),
    h("h3", {}, "Curves"), charts);
}
