// orch ui's charts: one chart per metric, for one run or several (overlaid, or grouped by a setting into a mean
// line and a min–max band), drawn with uPlot. The controls of a view (which metrics, log scale, smoothing, the
// x-axis, grouping) are shared by its charts and said on each chart as data- attributes:
//   data-series (the metric), data-points (the points it holds), data-scale (linear/log), data-smoothing (the EMA
//   weight, 0 = raw), data-x (step/time/tokens), data-group (the setting grouped by, "" for none), data-xmin and
//   data-xmax (the x range on view: a drag across a chart zooms in, a double-click shows all).
"use strict";

const COLORS = ["#2463eb", "#e4572e", "#17a398", "#f3a712", "#8e44ad", "#6b7280", "#c2185b", "#2e7d32"];
const CHART_ORDER = ["loss", "eval_loss", "val_loss", "test_loss", "tok_s", "steps_s", "samples_s", "lr", "grad_norm"];
const DEFAULT_CHARTS = 6;  // a run printing more series shows these first; the picker adds any other
const TITLES = { loss: "loss", eval_loss: "eval loss", val_loss: "eval loss (val_loss)", tok_s: "throughput (tok/s)",
                 steps_s: "throughput (steps/s)", lr: "learning rate", grad_norm: "grad norm" };
const X_LABELS = { step: "step", time: "minutes since start", tokens: "tokens" };

// A stable order, whatever order the series arrived in: the known ones first, then eval ones, then by name.
function chartOrder(names) {
  const rank = n => { const i = CHART_ORDER.indexOf(n); return i < 0 ? 100 + (/eval|val|test/.test(n) ? 0 : 1) : i; };
  return [...names].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

// Three significant digits, the exponent form outside 0.001–10,000: 6.36e-4, 0.333, 2.35, 1230, 1.52e4.
function sig3(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "-";
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a < 1e-3 || a >= 1e5) return v.toExponential(2).replace("e+", "e");
  if (a >= 1e3) return String(Math.round(Number(v.toPrecision(3))));
  return Number(v).toPrecision(3).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
}

// 150000 -> "150k", 0.0003 -> "3e-4": short enough for an axis
function axisNumber(v) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  if (a >= 1e6) return `${+(v / 1e6).toPrecision(3)}M`;
  if (a >= 1e4) return `${+(v / 1e3).toPrecision(3)}k`;
  if (a > 0 && a < 1e-3) return v.toExponential(0);
  return `${+v.toPrecision(4)}`;
}

// step -> time or tokens, piecewise linear through a run's anchors ([[step, value], ...]), on past the ends at
// the nearest segment's rate; null where nothing is known
function mapper(anchors) {
  const pts = [];
  for (const [x, v] of [...(anchors || [])].sort((a, b) => a[0] - b[0])) {
    if (pts.length && x === pts[pts.length - 1][0]) pts[pts.length - 1] = [x, v];
    else if (!pts.length || v >= pts[pts.length - 1][1]) pts.push([x, v]);
  }
  if (!pts.length) return null;
  if (pts.length === 1) { const [x0, v0] = pts[0]; return x0 > 0 ? x => x * v0 / x0 : null; }
  return x => {
    let i = 1;
    while (i < pts.length - 1 && x > pts[i][0]) i++;
    const [xa, va] = pts[i - 1], [xb, vb] = pts[i];
    return va + (x - xa) * (vb - va) / (xb - xa);
  };
}

// TensorBoard's smoothing: an exponential moving average, debiased so the first points are not pulled to 0
function ema(ys, weight) {
  if (!weight) return ys;
  let last = 0, n = 0;
  return ys.map(y => {
    if (y === null || !Number.isFinite(y)) return y;
    n++;
    last = last * weight + (1 - weight) * y;
    return last / (1 - Math.pow(weight, n));
  });
}

// One view's settings, shared by its charts; ``on(fn)`` is told of each change.
class ChartView {
  constructor(key, defaults) {
    this.key = `orch-ui-${key}`;
    let saved = {};
    try { saved = JSON.parse(localStorage.getItem(this.key) || "{}"); } catch (e) { saved = {}; }
    this.s = { logy: false, smoothing: 0, x: "step", group: "", ...defaults, ...saved };
    this.listeners = [];
  }
  set(k, v) {
    this.s[k] = v;
    try { localStorage.setItem(this.key, JSON.stringify({ logy: this.s.logy, smoothing: this.s.smoothing, x: this.s.x })); } catch (e) { /* private mode */ }
    for (const fn of this.listeners) fn(k);
  }
  on(fn) { this.listeners.push(fn); }
}

// The controls row: a metric picker (one option per series; choosing one adds its chart), log scale, smoothing,
// x-axis and, given setting keys, grouping. ``add(name)`` adds a chart; ``names()`` are the series known so far.
function chartControls(view, names, add, opts = {}) {
  const picker = h("select", { "data-control": "metric", title: "add a chart of any metric the run printed",
                               onchange: e => { if (e.target.value) add(e.target.value); e.target.selectedIndex = -1; } });
  const fill = () => {
    const have = new Set([...picker.options].map(o => o.value));
    for (const n of chartOrder(names())) if (!have.has(n)) picker.append(h("option", { value: n }, n));
    // kept in the stable order: a series that appears later slots in where it belongs
    const want = chartOrder([...picker.options].map(o => o.value));
    if ([...picker.options].some((o, i) => o.value !== want[i])) {
      const byName = Object.fromEntries([...picker.options].map(o => [o.value, o]));
      picker.replaceChildren(...want.map(n => byName[n]));
    }
    picker.selectedIndex = -1;
  };
  fill();
  const logy = h("input", { type: "checkbox", "data-control": "logy", checked: view.s.logy,
                            onchange: e => view.set("logy", e.target.checked) });
  const shown = h("span", { class: "muted" }, String(view.s.smoothing));
  const smooth = h("input", { type: "range", "data-control": "smoothing", min: 0, max: 0.99, step: 0.01, value: view.s.smoothing,
                              title: "exponential moving average: 0 draws the raw points" });
  smooth.oninput = smooth.onchange = e => { shown.textContent = e.target.value; view.set("smoothing", Number(e.target.value)); };
  const xaxis = h("select", { "data-control": "xaxis", onchange: e => view.set("x", e.target.value) },
    ...["step", "time", "tokens"].map(x => h("option", { value: x, selected: view.s.x === x }, x)));
  const parts = [h("label", {}, "add a chart ", picker), h("label", {}, logy, " log scale"),
                 h("label", {}, "smoothing ", smooth, " ", shown), h("label", {}, "x-axis ", xaxis)];
  if (opts.groupKeys) {
    const group = h("select", { "data-control": "group", onchange: e => view.set("group", e.target.value) },
      h("option", { value: "" }, "none (each run)"),
      ...opts.groupKeys.map(k => h("option", { value: k, selected: view.s.group === k }, k)));
    parts.push(h("label", {}, "group by ", group));
  }
  const el = h("div", { class: "controls" }, ...parts);
  return { el, fill };
}

// One chart of one metric for one or several runs. ``runs``: [{label, axes: {time, tokens}, setting}], ``set``
// and ``add`` give run i's [[step, y], ...] points.
class Chart {
  constructor(parent, metric, runs, view, opts = {}) {
    this.metric = metric;
    this.runs = runs;
    this.view = view;
    this.better = opts.better;
    this.curves = runs.map(() => []);
    this.received = 0;
    this.el = h("div", { class: "chart", "data-series": metric, "data-points": 0 },
                h("div", { class: "title" }, TITLES[metric] || metric, this.better ? h("span", { class: "muted" }, ` (${this.better === "max" ? "higher" : "lower"} is better)`) : null,
                  opts.removable ? h("button", { class: "close", title: "remove this chart", onclick: () => opts.onRemove(this) }, "×") : null));
    this.plotEl = h("div");
    this.el.append(this.plotEl);
    parent.append(this.el);
    this.plot = null;
    this.pending = false;
  }
  set(i, points) { this.curves[i] = points.slice(); this.draw(); }
  add(i, points) { for (const p of points) this.curves[i].push(p); this.draw(); }
  count() { return this.curves.reduce((n, c) => n + c.length, 0); }
  draw(rebuild) {
    if (rebuild && this.plot) { this.plot.destroy(); this.plot = null; }
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.render(); });
  }
  // run i's points on the view's x-axis, deduplicated by x (the last value wins), sorted, smoothed
  line(i) {
    const x = this.view.s.x;
    const f = x === "step" ? (s => s) : mapper((this.runs[i].axes || {})[x]);
    if (!f) return { xs: [], raw: [], smooth: [] };
    const byX = new Map();
    for (const [s, y] of this.curves[i]) {
      let v = y;
      if (this.view.s.logy && !(v > 0)) v = null;  // a log scale has no place for 0 or less
      byX.set(x === "time" ? f(s) / 60 : f(s), v);
    }
    const xs = [...byX.keys()].sort((a, b) => a - b);
    const raw = xs.map(k => byX.get(k));
    return { xs, raw, smooth: ema(raw, this.view.s.smoothing) };
  }
  // the groups of runs by the view's setting: [{label, members: [run index]}]
  groups() {
    const key = this.view.s.group;
    const out = new Map();
    this.runs.forEach((r, i) => {
      const v = key ? ((r.settings || {})[key] ?? "(unset)") : null;
      if (!out.has(v)) out.set(v, []);
      out.get(v).push(i);
    });
    return [...out.entries()].map(([v, members]) => ({ label: `${key}=${v} (${members.length} run${members.length > 1 ? "s" : ""})`, members }));
  }
  series() {
    const smoothing = this.view.s.smoothing;
    const lines = [], specs = [], bands = [];
    const few = n => n <= 1 ? 6 : n <= 40 ? 4 : 0;  // a single point (an eval run once) is drawn as a point
    const value = (u, v) => v === null || v === undefined ? "-" : sig3(v);
    if (this.view.s.group && this.runs.length > 1) {
      this.groups().forEach((g, k) => {
        const color = COLORS[k % COLORS.length];
        const each = g.members.map(i => this.line(i)).filter(l => l.xs.length);
        const xs = [...new Set(each.flatMap(l => l.xs))].sort((a, b) => a - b);
        const at = (l, x) => {  // run l's (smoothed) value at x, between its own points; none outside them
          const ys = l.smooth;
          if (x < l.xs[0] || x > l.xs[l.xs.length - 1]) return null;
          let j = l.xs.findIndex(v => v >= x);
          if (l.xs[j] === x || j === 0) return ys[j];
          const [xa, xb, ya, yb] = [l.xs[j - 1], l.xs[j], ys[j - 1], ys[j]];
          return ya === null || yb === null ? null : ya + (x - xa) * (yb - ya) / (xb - xa);
        };
        const mean = [], lo = [], hi = [];
        for (const x of xs) {
          const vals = each.map(l => at(l, x)).filter(v => v !== null && Number.isFinite(v));
          mean.push(vals.length ? vals.reduce((a, b) => a + b, 0) / vals.length : null);
          lo.push(vals.length ? Math.min(...vals) : null);
          hi.push(vals.length ? Math.max(...vals) : null);
        }
        const base = specs.length + 1;
        lines.push([xs, hi], [xs, lo], [xs, mean]);
        specs.push({ label: `max`, stroke: color + "55", width: 0.8, spanGaps: true, points: { show: false }, value },
                   { label: `min`, stroke: color + "55", width: 0.8, spanGaps: true, points: { show: false }, value },
                   { label: `mean of ${g.label}`, stroke: color, width: 2, spanGaps: true, points: { show: xs.length <= 1, size: 6 }, value });
        bands.push({ series: [base, base + 1], fill: color + "22" });
      });
    } else {
      this.runs.forEach((r, i) => {
        const l = this.line(i);
        const color = COLORS[i % COLORS.length];
        const n = l.xs.length;
        if (smoothing) {  // the raw line kept, faint, under the smoothed one
          lines.push([l.xs, l.raw]);
          specs.push({ label: `${r.label} (raw)`, stroke: color + "40", width: 1, spanGaps: true, points: { show: false }, value });
        }
        lines.push([l.xs, smoothing ? l.smooth : l.raw]);
        specs.push({ label: r.label, stroke: color, width: 1.6, spanGaps: true, points: { show: few(n) > 0, size: few(n) }, value });
      });
    }
    return { lines, specs, bands };
  }
  render() {
    const s = this.view.s;
    const { lines, specs, bands } = this.series();
    const data = lines.length === 1 ? lines[0] : lines.length ? uPlot.join(lines) : [[]];
    const shape = JSON.stringify([specs.map(x => x.label), s.logy, bands.length]);
    if (this.plot && this.shape !== shape) { this.plot.destroy(); this.plot = null; }
    this.shape = shape;
    if (!this.plot) {
      const width = Math.max(300, this.el.clientWidth - 16);
      const opts = {
        width, height: 220, legend: { show: true, live: true },
        cursor: { sync: { key: this.view.key }, drag: { x: true, y: false } },  // drag to zoom, double-click: all
        scales: { x: { time: false }, y: s.logy ? { distr: 3 } : {} },
        axes: [{ label: X_LABELS[s.x], size: 36, values: (u, vals) => vals.map(axisNumber) },
               { size: 56, values: (u, vals) => vals.map(axisNumber) }],
        series: [{ label: X_LABELS[s.x], value: (u, v) => v === null || v === undefined ? "-" : sig3(v) }, ...specs],
        bands,
        // the x range on view (a drag zooms it, a double-click shows all), said on the chart as data-xmin/xmax
        hooks: { setScale: [(u, key) => { if (key === "x") Object.assign(this.el.dataset, { xmin: sig3(u.scales.x.min), xmax: sig3(u.scales.x.max) }); }] },
      };
      this.plot = new uPlot(opts, data, this.plotEl);
    } else {
      this.plot.setData(data);
    }
    // an axis nothing is known of (a log that printed no token count): said, rather than an empty chart
    const unknown = s.x !== "step" && this.count() > 0 && this.runs.every(r => !mapper((r.axes || {})[s.x]));
    if (unknown !== !!this.note) {
      if (unknown) { this.note = h("p", { class: "muted" }, `no ${s.x} is known for ${this.runs.length > 1 ? "these runs" : "this run"}: ` +
                                     (s.x === "tokens" ? "its log printed no token count (tokens=…)" : "it has no start time")); this.el.append(this.note); }
      else { this.note.remove(); this.note = null; }
    }
    Object.assign(this.el.dataset, { points: this.count(), scale: s.logy ? "log" : "linear", smoothing: s.smoothing,
                                     x: s.x, group: this.runs.length > 1 ? s.group : "" });
  }
}

// A set of charts under one view: ``show(name)`` adds a metric's chart (kept in the stable order), ``feed``
// gives a run's points. ``runs`` as Chart's; ``points(i, name)`` is run i's points so far.
class ChartSet {
  constructor(parent, view, runs, points, better) {
    this.box = h("div", { class: "charts" });
    parent.append(this.box);
    this.view = view;
    this.runs = runs;
    this.points = points;
    this.better = better || {};
    this.charts = {};
    this.removed = new Set();  // the charts the user closed: never opened again by themselves
    view.on(() => { for (const c of Object.values(this.charts)) c.draw(true); });
  }
  show(name) {
    if (this.charts[name]) return this.charts[name];
    const c = this.charts[name] = new Chart(this.box, name, this.runs, this.view,
      { better: this.better[name], removable: true, onRemove: chart => {
        chart.plot && chart.plot.destroy(); chart.el.remove(); delete this.charts[name]; this.removed.add(name); } });
    this.removed.delete(name);
    this.runs.forEach((r, i) => c.set(i, this.points(i, name) || []));
    const order = chartOrder(Object.keys(this.charts));
    this.box.append(...order.map(n => this.charts[n].el));  // re-appended in order: the order never depends on arrival
    return c;
  }
  // the first charts of the series known so far (one that appears later, such as an eval loss, opens then)
  auto(names) { for (const n of firstCharts(names)) if (!this.removed.has(n)) this.show(n); }
  redraw() { for (const c of Object.values(this.charts)) c.draw(true); }
}

// The charts a view opens with: the known metrics first, at most DEFAULT_CHARTS of them.
function firstCharts(names) {
  const ordered = chartOrder(names);
  const known = ordered.filter(n => CHART_ORDER.includes(n));
  return (known.length ? known : ordered).slice(0, DEFAULT_CHARTS);
}
