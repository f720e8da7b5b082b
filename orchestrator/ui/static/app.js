// orch ui: one page, a view per address (#/, #/exp/ID, #/compare?ids=..., #/sweep/ID, #/gpus, #/queue).
// Data comes from /api/ (the CLI's --json answers); a run's live view from its event stream. Every text the
// registry holds is put in the page as text, never as markup.
"use strict";

const view = document.getElementById("view");
let cleanup = [];  // what the current view must stop (event streams, timers) when the address changes

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick" || k === "oninput" || k === "onchange") el[k] = v;
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function get(path) {
  let r;
  if (path === "/api/table" && window.firstTable) {  // asked by the page itself, before this script loaded
    r = await window.firstTable;
    window.firstTable = null;
  } else r = await fetch(path, { credentials: "same-origin" });
  const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok) throw Object.assign(new Error(body.error || `HTTP ${r.status}`), { hint: body.hint });
  return body;
}

async function post(path) {
  const r = await fetch(path, { method: "POST", credentials: "same-origin", headers: { "content-type": "application/json" }, body: "{}" });
  const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok) throw Object.assign(new Error(body.error || `HTTP ${r.status}`), { hint: body.hint });
  return body;
}

function toast(text, error) {
  const t = document.getElementById("toast");
  t.textContent = text;
  t.className = error ? "error" : "";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, error ? 9000 : 5000);
}

// The browser's own confirmation (window.confirm): nothing is done unless the user presses OK. Plain text, so
// what the registry or a target says is never read as markup.
function confirmDialog(title, lines) {
  return Promise.resolve(window.confirm([title, "", ...lines].join("\n")));
}

const grouped = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });  // made once: each one is slow
const fmt = {
  num(v, digits = 4) {
    if (v === null || v === undefined) return "-";
    if (Math.abs(v) >= 1e4) return grouped.format(v);
    return Number(v).toPrecision(digits).replace(/\.?0+$/, "");
  },
  rate(t) { return t ? `${fmt.num(t.value, 3)} ${t.unit}` : "-"; },
  when(ts) {
    if (!ts) return "-";
    const d = new Date(ts * 1000);
    const pad = n => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
  },
  duration(s) {
    if (s === null || s === undefined || s < 0) return "-";
    s = Math.round(s);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
    return `${Math.floor(s / 3600)}h${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
  },
};

const state = name => h("span", { class: `state ${name}` }, name);
const LIVE = ["running", "launching", "queued", "lost"];
const FIRST_ROWS = 60;  // the table's rows painted before the first frame

// ---- charts -------------------------------------------------------------------------------------------------
const COLORS = ["#2463eb", "#e4572e", "#17a398", "#f3a712", "#8e44ad", "#6b7280", "#c2185b", "#2e7d32"];
const CHART_ORDER = ["loss", "eval_loss", "val_loss", "tok_s", "steps_s", "lr", "grad_norm"];
const TITLES = { loss: "loss", eval_loss: "eval loss", val_loss: "eval loss (val_loss)", tok_s: "throughput (tok/s)",
                 steps_s: "throughput (steps/s)", lr: "learning rate", grad_norm: "grad norm" };

function chartOrder(names) {
  const rank = n => { const i = CHART_ORDER.indexOf(n); return i < 0 ? 100 + (/eval|val/.test(n) ? 0 : 1) : i; };
  return [...names].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

// 150000 -> "150k", 0.0003 -> "3e-4": short enough for the axis
function axisNumber(v) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  if (a >= 1e6) return `${+(v / 1e6).toPrecision(3)}M`;
  if (a >= 1e4) return `${+(v / 1e3).toPrecision(3)}k`;
  if (a > 0 && a < 1e-3) return v.toExponential(0);
  return `${+v.toPrecision(4)}`;
}

// One chart of one metric, for one or several experiments (curves overlaid by step).
class Chart {
  constructor(parent, metric, labels, xLabel = "step") {
    this.xLabel = xLabel;
    this.metric = metric;
    this.labels = labels;  // one per curve
    this.curves = labels.map(() => ({ xs: [], ys: [] }));
    this.el = h("div", { class: "chart", "data-series": metric, "data-points": 0 },
                h("div", { class: "title" }, TITLES[metric] || metric));
    this.plotEl = h("div");
    this.el.append(this.plotEl);
    parent.append(this.el);
    this.plot = null;
    this.pending = false;
  }
  set(i, points) { this.curves[i] = { xs: points.map(p => p[0]), ys: points.map(p => p[1]) }; this.draw(); }
  add(i, points) { const c = this.curves[i]; for (const p of points) { c.xs.push(p[0]); c.ys.push(p[1]); } this.draw(); }
  count() { return this.curves.reduce((n, c) => n + c.ys.length, 0); }
  draw() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.render(); });
  }
  data() {
    if (this.curves.length === 1) return [this.curves[0].xs, this.curves[0].ys];
    return uPlot.join(this.curves.map(c => [c.xs, c.ys]));
  }
  render() {
    const width = Math.max(300, this.el.clientWidth - 16);
    const data = this.data();
    if (!this.plot) {
      const opts = {
        width, height: 210, legend: { show: this.curves.length > 1 },
        scales: { x: { time: false } },
        axes: [{ label: this.xLabel, size: 36 }, { size: 56, values: (u, vals) => vals.map(axisNumber) }],
        series: [{ label: this.xLabel }, ...this.labels.map((l, i) => ({
          label: l, stroke: COLORS[i % COLORS.length], width: 1.6, spanGaps: true, points: { show: false } }))],
      };
      this.plot = new uPlot(opts, data, this.plotEl);
    } else {
      this.plot.setData(data);
    }
    this.el.setAttribute("data-points", this.count());
  }
}

// ---- the experiments table ------------------------------------------------------------------------------------
const filters = { state: "", target: "", sweep: "", message: "" };

async function experimentsView() {
  const selected = new Set();
  const body = h("tbody");
  const compareBtn = h("button", { disabled: true, onclick: () => { location.hash = `#/compare?ids=${[...selected].join(",")}`; } },
                       "Compare selected");
  const input = (key, placeholder) => h("input", { placeholder, value: filters[key], "data-filter": key,
                                                   oninput: e => { filters[key] = e.target.value; paint(); } });
  const stateSel = h("select", { "data-filter": "state", onchange: e => { filters.state = e.target.value; paint(); } },
                     h("option", { value: "" }, "any state"),
                     ...["running", "queued", "finished", "crashed", "stopped", "failed", "lost", "launching"].map(
                       s => h("option", { value: s, selected: filters.state === s }, s)));
  const count = h("span", { class: "muted" });
  const sweepLink = h("a", { hidden: true }, "");
  view.replaceChildren(
    h("h2", {}, "Experiments"),
    h("div", { class: "filters" }, stateSel, input("target", "target or CT"), input("sweep", "sweep"),
      input("message", "message contains"), compareBtn, count, sweepLink),
    h("table", { id: "experiments" },
      h("colgroup", {}, ...[28, 56, 92, null, 120, 64, 96, 120, 76, 84, 150, 84].map(w => h("col", w ? { style: `width:${w}px` } : {}))),
      h("thead", {}, h("tr", {}, h("th", {}, ""), ...["id", "state", "message", "target", "GPUs", "batching",
        "throughput", "loss", "eval loss", "start", "duration"].map(c => h("th", { class: ["id", "throughput", "loss", "eval loss", "duration"].includes(c) ? "num" : "" }, c)))),
      body));
  let rows = [], now = Date.now() / 1000;
  const match = r => {
    const f = filters;
    if (f.state && r.state !== f.state) return false;
    if (f.target && !(`${r.target}`.includes(f.target) || `${r.ct ?? ""}` === f.target.trim())) return false;
    if (f.sweep && !(r.sweep || "").includes(f.sweep)) return false;
    if (f.message && !(r.message || "").toLowerCase().includes(f.message.toLowerCase())) return false;
    return true;
  };
  let painting = 0;
  function paint() {
    const shown = rows.filter(match);
    const sweep = filters.sweep.trim();
    const whole = sweep && rows.some(r => r.sweep === sweep);  // a sweep named in full: its ranked page
    sweepLink.hidden = !whole;
    if (whole) { sweepLink.href = `#/sweep/${encodeURIComponent(sweep)}`; sweepLink.textContent = `sweep ${sweep}, ranked →`; }
    count.textContent = `${shown.length} of ${rows.length}${rows.length >= 1000 ? " (the newest)" : ""}`;
    // the first screenful at once, the rest a chunk a frame: a long history never holds up the first paint
    const mine = ++painting;
    body.replaceChildren(...shown.slice(0, FIRST_ROWS).map(row));
    view.dataset.ready = "1";
    const more = from => {
      if (mine !== painting || from >= shown.length) { if (mine === painting) view.dataset.complete = "1"; return; }
      body.append(...shown.slice(from, from + 250).map(row));
      requestAnimationFrame(() => more(from + 250));
    };
    view.dataset.complete = "";
    requestAnimationFrame(() => more(FIRST_ROWS));
  }
  function row(r) {
    const box = h("input", { type: "checkbox", checked: selected.has(r.id), onclick: e => {
      e.stopPropagation();
      e.target.checked ? selected.add(r.id) : selected.delete(r.id);
      compareBtn.disabled = selected.size < 2;
    } });
    const end = r.ended || (LIVE.includes(r.state) ? now : null);
    const tr = h("tr", { "data-experiment-id": r.id, "data-state": r.state },
      h("td", {}, box), h("td", { class: "num" }, r.id), h("td", {}, state(r.state)), h("td", { class: "msg" }, r.message || ""),
      h("td", {}, r.ct ? `${r.target} (CT ${r.ct})` : r.target), h("td", {}, r.gpus.length ? r.gpus.join(",") : "-"),
      h("td", {}, r.strategy || "-"), h("td", { class: "num" }, fmt.rate(r.throughput)),
      h("td", { class: "num" }, fmt.num(r.loss)), h("td", { class: "num" }, fmt.num(r.eval_loss)),
      h("td", {}, fmt.when(r.started)), h("td", { class: "num" }, r.started && end ? fmt.duration(end - r.started) : "-"));
    tr.onclick = () => { location.hash = `#/exp/${r.id}`; };
    return tr;
  }
  let last = "";
  async function load() {
    try {
      const data = await get("/api/table");
      const same = JSON.stringify(data.rows);
      if (same === last && !data.rows.some(r => LIVE.includes(r.state))) return;  // nothing to paint again
      last = same;
      rows = data.rows; now = data.now;
      document.getElementById("project").textContent = `project ${data.project}`;
      paint();
    } catch (e) { toast(`${e.message}`, true); }
  }
  await load();
  const timer = setInterval(() => { if (!document.hidden) load(); }, 5000);
  cleanup.push(() => clearInterval(timer));
}

// ---- one experiment -------------------------------------------------------------------------------------------
function kv(obj) {
  const rows = Object.entries(obj || {}).filter(([, v]) => v !== null && v !== undefined && v !== "");
  if (!rows.length) return h("p", { class: "muted" }, "none");
  return h("table", {}, h("tbody", {}, ...rows.map(([k, v]) =>
    h("tr", {}, h("th", {}, k), h("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v))))));
}

async function act(kind, exp, run) {
  const labels = { stop: ["Stop", `Stop experiment ${exp.id}?`, [
                     `Its run on ${exp.target} is sent SIGINT, then SIGTERM, then SIGKILL (as orch stop -e ${exp.id}).`,
                     "Its checkpoints stay where they are."]],
                   "queue-remove": ["Remove", `Remove experiment ${exp.id} from the queue?`,
                     [`It is taken out of the queue on ${exp.target} and recorded as stopped before it started.`]] };
  let [yes, title, body] = labels[kind] || [];
  if (kind === "restart") {
    toast("asking the target what a restart would do…");
    let plan;
    try { plan = await get(`/api/experiments/${exp.id}/restart`); }
    catch (e) { toast(`${e.message}${e.hint ? ` (${e.hint})` : ""}`, true); return; }
    document.getElementById("toast").hidden = true;
    yes = "Restart";
    title = `Restart experiment ${exp.id}?`;
    const ck = (plan.target_state || {}).checkpoints || {};
    const files = (ck.listing || []).map(f => f.path).sort();
    const shown = files.length > 30 ? [...files.slice(0, 30), `… and ${files.length - 30} more`] : files;
    body = [`The project's running experiments on ${plan.target_label || exp.target} are stopped and experiment ${exp.id}'s ` +
            `revision ${(plan.revision || "").slice(0, 10)} relaunched as a new one (orch restart -e ${exp.id}). ` +
            "The checkpoints there are moved to the trash, never deleted " +
            "(orch checkpoints restore puts them back).", "",
            files.length ? `Moves ${files.length} file(s), ${fmt.num((ck.bytes || 0) / 1048576, 3)} MiB, from ${ck.path} to ${ck.trash}:`
                         : "No checkpoint to move.",
            ...shown.map(f => `  ${f}`), "", "The plan:", ...(plan.steps || []).map(st => `  ${st}`)];
  }
  if (!await confirmDialog(title, body)) return;
  toast(`${yes}: experiment ${exp.id}…`);
  try {
    const res = await run();
    toast(`${yes}: done`);
    return res;
  } catch (e) { toast(`${e.message}${e.hint ? ` (${e.hint})` : ""}`, true); }
}

async function experimentView(id) {
  const exp = await get(`/api/experiments/${id}`);
  const charts = {};
  const chartBox = h("div", { class: "charts" });
  const log = h("pre", { class: "log", id: "log" });
  const liveMark = h("span", { class: "muted" });
  const stateBox = h("span", {}, state(exp.orphaned ? "orphaned" : exp.status));
  const ensure = name => charts[name] || (charts[name] = new Chart(chartBox, name, [`exp ${id}`]));
  const stored = exp.series || {};
  for (const name of chartOrder(Object.keys(stored).length ? Object.keys(stored) : ["loss"])) ensure(name).set(0, stored[name] || []);

  const stopBtn = h("button", { class: "danger", "data-action": "stop", disabled: !["running", "launching", "lost"].includes(exp.status),
    onclick: async () => { if (await act("stop", exp, () => post(`/api/experiments/${id}/stop`))) refresh(); } }, "Stop");
  const restartBtn = h("button", { "data-action": "restart", disabled: exp.status === "queued" || !!(exp.nodes || []).length,
    title: "relaunch this experiment's revision and settings where it ran (orch restart -e)",
    onclick: async () => { const r = await act("restart", exp, () => post(`/api/experiments/${id}/restart`));
                           if (r && r.experiment) location.hash = `#/exp/${r.experiment.id}`; } }, "Restart…");
  const dequeueBtn = exp.status === "queued" ? h("button", { "data-action": "queue-remove",
    onclick: async () => { if (await act("queue-remove", exp, () => post(`/api/queue/${id}/remove`))) refresh(); } }, "Remove from queue") : null;

  const attempts = h("div", {}, (exp.attempts || []).length ? h("table", {},
    h("thead", {}, h("tr", {}, ...["attempt", "started", "exit code", "reason", "resumed from"].map(c => h("th", {}, c)))),
    h("tbody", {}, ...exp.attempts.map(a => h("tr", {}, h("td", {}, (a.attempt || 0) + 1), h("td", {}, fmt.when(a.started)),
      h("td", {}, a.exit_code ?? "-"), h("td", {}, a.reason || "running"), h("td", {}, a.resumed_from || "-")))))
    : h("p", { class: "muted" }, "one attempt so far"));
  const guard = h("div", {}, h("p", { class: "muted" }, "asking the target…"));
  const ckpts = h("div", {}, h("p", { class: "muted" }, "asking the target…"));
  const sweepLink = exp.sweep ? h("a", { href: `#/sweep/${encodeURIComponent(exp.sweep)}` }, `sweep ${exp.sweep}`) : null;

  view.replaceChildren(
    h("h2", {}, `Experiment ${exp.id} `, stateBox, " ", liveMark),
    h("p", {}, exp.message || h("span", { class: "muted" }, "(no message)"), " · ", exp.target, " · started ",
      fmt.when(exp.started), exp.parent ? [" · parent ", h("a", { href: `#/exp/${exp.parent}` }, `exp ${exp.parent}`)] : null,
      sweepLink ? [" · ", sweepLink] : null),
    h("div", { class: "actions" }, stopBtn, restartBtn, dequeueBtn,
      exp.parent ? h("a", { href: `#/compare?ids=${exp.parent},${exp.id}` }, h("button", {}, `Compare with exp ${exp.parent}`)) : null),
    chartBox,
    h("h3", {}, "Log"), log,
    h("div", { class: "grid2" },
      h("div", {}, h("h3", {}, "Attempts"), attempts, h("h3", {}, "On the target"), guard),
      h("div", {}, h("h3", {}, "Checkpoints and trash"), ckpts)),
    h("div", { class: "grid2" },
      h("div", {}, h("h3", {}, "Batching"), kv(exp.batching), h("h3", {}, "Batching plan"), kv(exp.batching_plan)),
      h("div", {}, h("h3", {}, "Config"), h("pre", { class: "json" }, JSON.stringify(exp.config, null, 2)))));

  async function refresh() {
    try {
      const now = await get(`/api/experiments/${id}`);
      stateBox.replaceChildren(state(now.status));
      stopBtn.disabled = !["running", "launching", "lost"].includes(now.status);
      if (now.status !== exp.status) {
        exp.status = now.status;
        loadTarget();
        if (!LIVE.includes(now.status) && liveMark.className === "live") { liveMark.textContent = ""; liveMark.className = "muted"; }
      }
    } catch (e) { /* the next refresh tries again */ }
  }

  // the log and the charts, live: the snapshot replaces what the registry had, then each batch is added
  let seq = -1;
  const source = new EventSource(`/api/experiments/${id}/events`);
  cleanup.push(() => source.close());
  const appendLog = lines => {
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent += lines.map(l => l + "\n").join("");
    if (log.textContent.length > 200000) log.textContent = log.textContent.slice(-150000);
    if (atEnd) log.scrollTop = log.scrollHeight;
  };
  source.onmessage = msg => {
    const ev = JSON.parse(msg.data);
    if (ev.type === "snapshot") {
      seq = ev.seq;
      // the log read from its first byte replaces what the registry kept (its points come again, from the log)
      if (!ev.error) for (const name of new Set([...Object.keys(charts), ...Object.keys(ev.series)])) ensure(name).set(0, ev.series[name] || []);
      log.textContent = "";
      appendLog(ev.log);
      liveMark.textContent = ev.done ? "" : "● live";
      liveMark.className = ev.done ? "muted" : "live";
      if (ev.error) { liveMark.textContent = `log not read: ${ev.error.error}`; liveMark.className = "error"; }
    } else if (ev.type === "data") {
      if (ev.seq <= seq) return;
      seq = ev.seq;
      for (const name of chartOrder(Object.keys(ev.points))) ensure(name).add(0, ev.points[name]);
      appendLog(ev.log);
    } else if (ev.type === "end") {
      source.close();
      if (ev.error) {  // the log could not be read: what the registry kept is what there is
        liveMark.textContent = `log not read: ${ev.error}`; liveMark.className = "error";
        for (const [name, pts] of Object.entries(stored)) if (!charts[name].count()) charts[name].set(0, pts);
      }
      else { liveMark.textContent = ev.state ? `(${ev.state}${ev.exit_code !== null && ev.exit_code !== undefined ? `, exit ${ev.exit_code}` : ""})` : ""; liveMark.className = "muted"; }
      refresh();
    }
  };
  const timer = setInterval(() => { if (!document.hidden && LIVE.includes(exp.status)) refresh(); }, 5000);
  cleanup.push(() => clearInterval(timer));

  // what only the target knows: its guard and its checkpoints (orch status --json, orch checkpoints list --json)
  function loadTarget() {
  get(`/api/experiments/${id}/status`).then(s => {
    if (!s || s.experiment !== exp.id) {
      guard.replaceChildren(h("p", { class: "muted" }, `the target's latest run is ${s && s.experiment ? `experiment ${s.experiment}` : "another one"}`));
      return;
    }
    const sum = s.summary || {};
    guard.replaceChildren(
      kv({ state: s.state, phase: s.phase, attempt: s.max_attempts ? `${s.attempt} of ${s.max_attempts}` : s.attempt,
           step: sum.total_steps ? `${sum.step} of ${sum.total_steps}` : sum.step, eta: sum.eta, throughput: sum.throughput,
           notes: (sum.notes || []).join("; ") || null }),
      s.guard ? [h("h3", {}, "Guard progress and verdict"), kv(s.guard)] : h("p", { class: "muted" }, "not a guarded run"));
  }).catch(e => guard.replaceChildren(h("p", { class: "error" }, e.message)));
  get(`/api/experiments/${id}/checkpoints`).then(c => {
    const files = c.listing || [];
    const trash = c.entries || [];
    ckpts.replaceChildren(
      h("p", { class: "muted" }, `${c.path} · ${c.files} file(s), ${fmt.num(c.bytes / 1048576, 3)} MiB`),
      files.length ? h("table", { id: "checkpoints" }, h("thead", {}, h("tr", {}, h("th", {}, "file"), h("th", { class: "num" }, "size"), h("th", {}, "written"))),
        h("tbody", {}, ...files.map(f => h("tr", {}, h("td", {}, f.path), h("td", { class: "num" }, `${fmt.num(f.size / 1024, 3)} KiB`), h("td", {}, fmt.when(f.mtime))))))
        : h("p", { class: "muted" }, "no checkpoints"),
      h("h3", {}, `Trash (${c.trash})`),
      trash.length ? h("table", { id: "trash" }, h("thead", {}, h("tr", {}, ...Object.keys(trash[0]).map(k => h("th", {}, k)))),
        h("tbody", {}, ...trash.map(e => h("tr", {}, ...Object.values(e).map(v => h("td", {}, typeof v === "object" && v !== null ? JSON.stringify(v) : v ?? "-"))))))
        : h("p", { class: "muted" }, "the trash is empty"));
  }).catch(e => ckpts.replaceChildren(h("p", { class: "error" }, e.message)));
  }
  loadTarget();
  view.dataset.ready = "1";
}

// ---- compare and sweeps ----------------------------------------------------------------------------------------
// Several experiments' curves, one chart a metric, by step or by time. The registry keeps each point's step, not
// its time: by time, a run's steps are spread evenly over when it ran (its start to its end), at its mean rate.
function overlay(parent, seriesById, labels, spans) {
  const ids = Object.keys(seriesById);
  const names = chartOrder(new Set(ids.flatMap(i => Object.keys(seriesById[i]))));
  const charts = h("div", { class: "charts" });
  const toMinutes = i => {
    const [t0, t1] = (spans || {})[i] || [];
    const xs = Object.values(seriesById[i]).flatMap(pts => pts.map(p => p[0]));
    if (!t0 || !t1 || !xs.length) return null;
    const lo = Math.min(...xs), hi = Math.max(...xs);
    return x => hi > lo ? (x - lo) / (hi - lo) * (t1 - t0) / 60 : 0;
  };
  const draw = byTime => {
    charts.replaceChildren();
    for (const name of names) {
      const chart = new Chart(charts, name, ids.map(i => labels[i] || `exp ${i}`), byTime ? "minutes since start" : "step");
      ids.forEach((i, k) => {
        const pts = seriesById[i][name] || [];
        const f = byTime ? toMinutes(i) : null;
        chart.set(k, byTime ? (f ? pts.map(p => [f(p[0]), p[1]]) : []) : pts);
      });
    }
    if (!names.length) charts.append(h("p", { class: "muted" }, "no metric series recorded yet (orch status reads them)"));
  };
  const step = h("button", { "data-x": "step", class: "on", onclick: () => { step.className = "on"; time.className = ""; draw(false); } }, "by step");
  const time = h("button", { "data-x": "time", title: "each run's steps spread over its start to its end (the registry keeps no time per point)",
    onclick: () => { time.className = "on"; step.className = ""; draw(true); } }, "by time");
  parent.append(h("div", { class: "actions" }, step, time), charts);
  draw(false);
}

async function compareView(ids) {
  const c = await get(`/api/compare?ids=${ids.join(",")}`);
  const charts = h("div");
  const head = h("tr", {}, h("th", {}, ""), ...c.ids.map(i => h("th", {}, h("a", { href: `#/exp/${i}` }, `exp ${i}`))));
  view.replaceChildren(
    h("h2", {}, `Compare ${c.ids.map(i => `exp ${i}`).join(", ")}`),
    h("div", { class: "grid2" },
      h("div", {}, h("h3", {}, "Differences (batching first)"),
        h("table", { id: "diff" }, h("thead", {}, head.cloneNode(true)), h("tbody", {}, ...(c.diff.length ? c.diff : [{ key: "(none)", values: [] }]).map(
          r => h("tr", { "data-key": r.key }, h("th", {}, r.key), ...r.values.map(v => h("td", {}, v))))))),
      h("div", {}, h("h3", {}, "Metrics"),
        h("table", {}, h("thead", {}, head), h("tbody", {}, ...c.metrics.map(
          r => h("tr", {}, h("th", {}, r.metric), ...r.values.map(v => h("td", {}, v)))))))),
    h("h3", {}, "Curves"), charts);
  const labels = Object.fromEntries(c.ids.map(i => [i, `exp ${i}${c.messages[i] ? `: ${c.messages[i]}` : ""}`]));
  overlay(charts, c.series, labels, c.spans);
  view.dataset.ready = "1";
}

async function sweepView(sweep) {
  const s = await get(`/api/sweeps/${encodeURIComponent(sweep)}`);
  const charts = h("div");
  const stopBtn = h("button", { class: "danger", "data-action": "sweep-stop", onclick: async () => {
    if (!await confirmDialog(`Stop sweep ${sweep}?`, ["Its queued variants are taken out of the queues first, then its running ones stopped (as orch sweep stop)."])) return;
    try { const r = await post(`/api/sweeps/${encodeURIComponent(sweep)}/stop`); toast(`sweep ${sweep}: ${r.dequeued.length} dequeued, ${r.stopped.length} stopped`); }
    catch (e) { toast(e.message, true); }
  } }, "Stop sweep");
  const unit = s.variants.length ? s.variants[0].throughput_unit : "";
  view.replaceChildren(
    h("h2", {}, `Sweep ${s.sweep}`),
    h("div", { class: "actions" }, stopBtn,
      h("a", { href: `#/compare?ids=${s.variants.map(v => v.id).join(",")}` }, h("button", {}, "Compare all"))),
    h("p", { class: "muted" }, s.window ? `ranked by throughput over steps ${fmt.num(s.window[0])}–${fmt.num(s.window[1])}` : "no metrics yet"),
    h("table", { id: "sweep" }, h("thead", {}, h("tr", {}, ...["", "id", ...s.keys, unit, "loss", "efficiency", "state"].map(c => h("th", {}, c)))),
      h("tbody", {}, ...s.variants.map(v => h("tr", { "data-experiment-id": v.id, onclick: () => { location.hash = `#/exp/${v.id}`; } },
        h("td", { class: "best" }, v.best ? "best" : ""), h("td", {}, v.id), ...Object.values(v.settings).map(x => h("td", {}, x)),
        h("td", { class: "num" }, fmt.num(v.throughput, 4)), h("td", { class: "num" }, fmt.num(v.loss)),
        h("td", { class: "num" }, fmt.num(v.efficiency, 3)), h("td", {}, state(v.status)))))),
    h("h3", {}, "Curves"), charts);
  overlay(charts, s.series, Object.fromEntries(s.variants.map(v => [v.id, `exp ${v.id}: ${Object.values(v.settings).join(", ")}`])), s.spans);
  view.dataset.ready = "1";
}

// ---- GPUs and the queue ----------------------------------------------------------------------------------------
async function gpusView() {
  const table = h("div", {}, h("p", { class: "muted" }, "asking the machines (orch gpus)…"));
  const holders = h("div", { class: "charts" });
  view.replaceChildren(h("h2", {}, "GPUs"), table, h("h3", {}, "Who holds which GPU, and its utilisation over time"), holders);
  const use = await get("/api/gpu-use");
  if (!use.holders.length) holders.append(h("p", { class: "muted" }, "no experiment was given GPUs (orch deploy --gpus N)"));
  for (const e of use.holders) {
    const box = h("div", { class: "chart", "data-series": `gpu-util-${e.id}`, "data-points": e.series.length },
      h("div", { class: "title" }, h("a", { href: `#/exp/${e.id}` }, `exp ${e.id}`), " ", state(e.state), " on ", e.target, " · GPUs ",
        ...e.gpus.map(g => h("span", { class: "gpu" }, g.index))));
    holders.append(box);
    if (e.series.length) {
      const xs = e.series.map(p => p[0]);
      const per = e.gpus.map((g, k) => e.series.map(p => (p[1][k] || [null])[0]));
      new uPlot({ width: Math.max(300, box.clientWidth - 16), height: 180, scales: { y: { range: [0, 100] } },
        series: [{}, ...e.gpus.map((g, k) => ({ label: `GPU ${g.index} util %`, stroke: COLORS[k % COLORS.length], width: 1.5 }))] },
        [xs, ...per], box);
    } else box.append(h("p", { class: "muted" }, "no utilisation read yet (orch status reads it)"));
  }
  get("/api/gpus").then(rows => {
    const body = [];
    for (const m of rows) {
      if (!m.gpus.length) { body.push(h("tr", {}, h("td", {}, m.where), h("td", {}, "-"), h("td", { colspan: 4 }, m.error || m.status || "no GPUs"))); continue; }
      for (const g of m.gpus) body.push(h("tr", {}, h("td", {}, m.where), h("td", {}, g.index), h("td", {}, g.name || "-"),
        h("td", {}, g.mem_used_mib !== undefined && g.mem_used_mib !== null ? `${g.mem_used_mib}/${g.mem_total_mib} MiB` : "-"),
        h("td", {}, g.util !== undefined && g.util !== null ? `${g.util}%` : "-"), h("td", {}, g.use)));
    }
    table.replaceChildren(h("table", { id: "gpus" }, h("thead", {}, h("tr", {}, ...["machine", "gpu", "name", "memory", "util", "use"].map(c => h("th", {}, c)))),
      h("tbody", {}, ...body)));
    if (!rows.length) table.replaceChildren(h("p", { class: "muted" }, "no machines to ask: configure a target or a [proxmox] section"));
  }).catch(e => table.replaceChildren(h("p", { class: "error" }, e.message)));
  view.dataset.ready = "1";
}

async function queueView() {
  const q = await get("/api/queue");
  const parts = Object.entries(q.targets);
  view.replaceChildren(h("h2", {}, "Queue"),
    ...(parts.length ? parts.map(([target, rows]) => h("div", { class: "card" }, h("h3", {}, `queued on ${target}`),
      h("table", {}, h("thead", {}, h("tr", {}, ...["position", "id", "sweep", "revision", "queued", "message", ""].map(c => h("th", {}, c)))),
        h("tbody", {}, ...rows.map((r, k) => h("tr", { "data-experiment-id": r.id }, h("td", {}, k + 1),
          h("td", {}, h("a", { href: `#/exp/${r.id}` }, r.id)), h("td", {}, r.sweep || "-"), h("td", {}, r.revision), h("td", {}, fmt.when(r.created)),
          h("td", { class: "msg" }, r.message || ""),
          h("td", {}, h("button", { "data-action": "queue-remove", onclick: async () => {
            if (await act("queue-remove", { id: r.id, target }, () => post(`/api/queue/${r.id}/remove`))) route();
          } }, "Remove")))))))) : [h("p", { class: "muted" }, "nothing is queued (orch deploy --queue, orch sweep)")]));
  view.dataset.ready = "1";
}

// ---- routing --------------------------------------------------------------------------------------------------
async function route() {
  for (const stop of cleanup) stop();
  cleanup = [];
  view.dataset.ready = "";
  const hash = location.hash || "#/";
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  document.querySelectorAll("[data-nav]").forEach(a => a.classList.toggle("active",
    a.dataset.nav === (parts[0] === "gpus" ? "gpus" : parts[0] === "queue" ? "queue" : "experiments")));
  try {
    if (parts[0] === "exp" && parts[1]) await experimentView(Number(parts[1]));
    else if (parts[0] === "compare") await compareView((params.get("ids") || "").split(",").filter(Boolean).map(Number));
    else if (parts[0] === "sweep" && parts[1]) await sweepView(decodeURIComponent(parts[1]));
    else if (parts[0] === "gpus") await gpusView();
    else if (parts[0] === "queue") await queueView();
    else await experimentsView();
  } catch (e) {
    view.replaceChildren(h("h2", { class: "error" }, e.message), e.hint ? h("p", {}, `hint: ${e.hint}`) : "");
    view.dataset.ready = "1";
  }
}

window.addEventListener("hashchange", route);
route();
