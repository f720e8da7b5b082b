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

// A request that got no answer (the server ended or was too busy to take the connection, the page was left) throws
// an error that says so, as an answer with an error status does: the caller shows it, and asks again later.
async function request(path, options) {
  try {
    return await fetch(path, { credentials: "same-origin", ...options });
  } catch (e) {
    throw Object.assign(new Error(`no answer from orch ui (${e.message})`), { hint: "is orch ui still running?" });
  }
}

async function get(path) {
  let r = null;
  if (path === "/api/table" && window.firstTable) {  // asked by the page itself, before this script loaded
    r = await window.firstTable;  // null: it got no answer, so it is asked again
    window.firstTable = null;
  }
  if (!r) r = await request(path);
  const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok) throw Object.assign(new Error(body.error || `HTTP ${r.status}`), { hint: body.hint });
  return body;
}

async function post(path) {
  const r = await request(path, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
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
  rate(t) { return t ? `${sig3(t.value)} ${t.unit}` : "-"; },
  // bytes for people, in powers of 1024 with three significant digits: 2.38 MiB, 512 B
  size(n) {
    if (n === null || n === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return i ? `${Number(n.toPrecision(3))} ${units[i]}` : `${n} B`;
  },
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

// ---- the experiments table ----------------------------------------------------------------------------------
// A page of rows at a time (PAGE), filtered and sorted by the server: the first page costs the same with ten
// experiments or ten thousand. Any column sorts (a second click reverses it); a metric's best is its lowest or
// highest by the metric's direction.
const filters = { state: "", target: "", sweep: "", message: "" };
const tableState = { sort: "id", desc: true, offset: 0 };
const PAGE = 100;
const COLUMNS = [  // [key, header, numeric]
  ["id", "id", true], ["state", "state"], ["message", "message"], ["target", "target"], ["gpus", "GPUs"],
  ["batching", "batching"], ["throughput", "throughput", true], ["best:loss", "best loss", true],
  ["last:loss", "last loss", true], ["best:eval_loss", "best eval loss", true], ["last:eval_loss", "last eval loss", true],
  ["started", "start"], ["duration", "duration", true]];
const UNSORTED = ["gpus"];

async function experimentsView() {
  const selected = new Set();
  const body = h("tbody");
  const compareBtn = h("button", { disabled: true, onclick: () => { location.hash = `#/compare?ids=${[...selected].join(",")}`; } },
                       "Compare selected");
  let typing;
  const changed = () => { tableState.offset = 0; clearTimeout(typing); typing = setTimeout(load, 150); };
  const input = (key, placeholder) => h("input", { placeholder, value: filters[key], "data-filter": key,
                                                   oninput: e => { filters[key] = e.target.value; changed(); } });
  const stateSel = h("select", { "data-filter": "state", onchange: e => { filters.state = e.target.value; tableState.offset = 0; load(); } },
                     h("option", { value: "" }, "any state"),
                     ...["running", "queued", "finished", "crashed", "stopped", "failed", "lost", "launching"].map(
                       s => h("option", { value: s, selected: filters.state === s }, s)));
  const count = h("span", { class: "muted", "data-count": "" });
  const prev = h("button", { "data-page": "prev", onclick: () => { tableState.offset = Math.max(0, tableState.offset - PAGE); load(); } }, "← newer");
  const next = h("button", { "data-page": "next", onclick: () => { tableState.offset += PAGE; load(); } }, "older →");
  const sweepLink = h("a", { hidden: true }, "");
  const heads = COLUMNS.map(([key, label, num]) => {
    const th = h("th", { class: num ? "num" : "", "data-sort": UNSORTED.includes(key) ? null : key }, label);
    if (!UNSORTED.includes(key)) th.onclick = () => {
      if (tableState.sort === key) tableState.desc = !tableState.desc;
      // a first click: the newest, the fastest, the longest first; a loss lowest (best) first; text from A
      else { tableState.sort = key; tableState.desc = ["id", "started", "duration", "throughput"].includes(key); }
      tableState.offset = 0;
      load();
    };
    return th;
  });
  view.replaceChildren(
    h("h2", {}, "Experiments"),
    h("div", { class: "filters" }, stateSel, input("target", "target or CT"), input("sweep", "sweep"),
      input("message", "message contains"), compareBtn, count, prev, next, sweepLink),
    h("table", { id: "experiments" },
      h("colgroup", {}, ...[28, 56, 92, null, 120, 56, 92, 110, 76, 76, 84, 84, 130, 76].map(w => h("col", w ? { style: `width:${w}px` } : {}))),
      h("thead", {}, h("tr", {}, h("th", {}, ""), ...heads)),
      body));
  let data = { rows: [], total: 0 }, now = Date.now() / 1000;
  function paint() {
    const rows = data.rows;
    const sweep = filters.sweep.trim();
    const whole = sweep && rows.some(r => r.sweep === sweep);  // a sweep named in full: its ranked page
    sweepLink.hidden = !whole;
    if (whole) { sweepLink.href = `#/sweep/${encodeURIComponent(sweep)}`; sweepLink.textContent = `sweep ${sweep}, ranked →`; }
    const from = data.total ? tableState.offset + 1 : 0;
    count.textContent = `${from}–${tableState.offset + rows.length} of ${data.total}`;
    prev.disabled = tableState.offset === 0;
    next.disabled = tableState.offset + rows.length >= data.total;
    heads.forEach(th => {
      th.classList.toggle("sorted", th.dataset.sort === tableState.sort);
      th.dataset.dir = th.dataset.sort === tableState.sort ? (tableState.desc ? "desc" : "asc") : "";
    });
    body.replaceChildren(...rows.map(row));
    view.dataset.ready = "1";
    view.dataset.complete = "1";
  }
  function row(r) {
    const box = h("input", { type: "checkbox", checked: selected.has(r.id), onclick: e => {
      e.stopPropagation();
      e.target.checked ? selected.add(r.id) : selected.delete(r.id);
      compareBtn.disabled = selected.size < 2;
    } });
    const end = r.ended || (LIVE.includes(r.state) ? now : null);
    const v = r.values || {};
    const cell = (column, text, num, title) => h("td", { class: num ? "num" : column === "message" ? "msg" : "", "data-column": column, title }, text);
    const evalName = r.eval_metric ? `${r.eval_metric}` : null;
    const tr = h("tr", { "data-experiment-id": r.id, "data-state": r.state },
      h("td", {}, box), cell("id", r.id, true), h("td", { "data-column": "state" }, state(r.state)), cell("message", r.message || ""),
      cell("target", r.ct ? `${r.target} (CT ${r.ct})` : r.target), cell("gpus", r.gpus.length ? r.gpus.join(",") : "-"),
      cell("batching", r.strategy || "-"), cell("throughput", fmt.rate(r.throughput), true),
      cell("best:loss", sig3(v["best:loss"]), true, "the lowest loss printed"), cell("last:loss", sig3(v["last:loss"]), true),
      cell("best:eval_loss", sig3(v["best:eval_loss"]), true, evalName), cell("last:eval_loss", sig3(v["last:eval_loss"]), true, evalName),
      cell("started", fmt.when(r.started)), cell("duration", r.started && end ? fmt.duration(end - r.started) : "-", true));
    tr.onclick = () => { location.hash = `#/exp/${r.id}`; };
    return tr;
  }
  let last = "";
  async function load() {
    const q = new URLSearchParams({ offset: tableState.offset, limit: PAGE, sort: tableState.sort, desc: tableState.desc ? 1 : 0 });
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    const plain = tableState.offset === 0 && tableState.sort === "id" && tableState.desc && !Object.values(filters).some(Boolean);
    try {
      const got = await get(plain ? "/api/table" : `/api/table?${q}`);
      if (gone) return;  // the address changed meanwhile: another view is on the page
      const same = JSON.stringify([got.rows, got.total, q.toString()]);
      if (same === last && !got.rows.some(r => LIVE.includes(r.state))) return;  // nothing to paint again
      last = same;
      data = got; now = got.now;
      document.getElementById("project").textContent = `project ${got.project}`;
      paint();
    } catch (e) { if (!gone) toast(`${e.message}${e.hint ? ` (${e.hint})` : ""}; asked again every 5 s`, true); }
  }
  // stopped by the next address, even one given while the first rows are still being asked for
  let gone = false;
  const timer = setInterval(() => { if (!document.hidden) load(); }, 5000);
  cleanup.push(() => { gone = true; clearInterval(timer); clearTimeout(typing); });
  await load();
}

// ---- one experiment -------------------------------------------------------------------------------------------
function kv(obj) {
  const rows = Object.entries(obj || {}).filter(([, v]) => v !== null && v !== undefined && v !== "");
  if (!rows.length) return h("p", { class: "muted" }, "none");
  return h("table", {}, h("tbody", {}, ...rows.map(([k, v]) =>
    h("tr", { "data-key": k }, h("th", {}, k), h("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v))))));
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
            files.length ? `Moves ${files.length} file(s), ${fmt.size(ck.bytes || 0)}, from ${ck.path} to ${ck.trash}:`
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
  const log = h("pre", { class: "log", id: "log" });
  const logLines = h("span");
  const current = h("span", { class: "current", "data-current": "" });  // the line being drawn now (a progress bar)
  log.append(logLines, current);
  const liveMark = h("span", { class: "muted" });
  const stateBox = h("span", {}, state(exp.orphaned ? "orphaned" : exp.status));
  let stored = exp.series || {};
  const live = { series: null, axes: {} };  // what the log follower read, once its snapshot came
  const points = name => (live.series || stored)[name] || [];
  const runAxes = () => {  // the registry's ends, with what the follower saw printed as it read
    const out = {};
    for (const k of ["time", "tokens"]) out[k] = [...((exp.axes || {})[k] || []), ...(live.axes[k] || [])];
    return out;
  };
  const runs = [{ label: `exp ${id}`, axes: runAxes() }];
  const chartView = new ChartView("exp", {});
  const names = () => Object.keys(live.series || stored);
  const chartsBox = h("div");
  const set = new ChartSet(chartsBox, chartView, runs, (i, name) => points(name), exp.better);
  const controls = chartControls(chartView, names, name => set.show(name).el.scrollIntoView({ block: "nearest" }));
  if (names().length) set.auto(names()); else set.show("loss");
  let ended = !LIVE.includes(exp.status);  // the run is over: the page says so, whatever a stale read says

  const stopBtn = h("button", { class: "danger", "data-action": "stop", disabled: !["running", "launching", "lost"].includes(exp.status),
    onclick: async () => { if (await act("stop", exp, () => post(`/api/experiments/${id}/stop`))) { loadTarget().then(refresh); } } }, "Stop");
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
  const guard = h("div", { id: "on-target" }, h("p", { class: "muted" }, "asking the target…"));
  const ckpts = h("div", {}, h("p", { class: "muted" }, "asking the target…"));
  const sweepLink = exp.sweep ? h("a", { href: `#/sweep/${encodeURIComponent(exp.sweep)}` }, `sweep ${exp.sweep}`) : null;

  view.replaceChildren(
    h("h2", {}, `Experiment ${exp.id} `, stateBox, " ", liveMark),
    h("p", {}, exp.message || h("span", { class: "muted" }, "(no message)"), " · ", exp.target, " · started ",
      fmt.when(exp.started), exp.parent ? [" · parent ", h("a", { href: `#/exp/${exp.parent}` }, `exp ${exp.parent}`)] : null,
      sweepLink ? [" · ", sweepLink] : null),
    h("div", { class: "actions" }, stopBtn, restartBtn, dequeueBtn,
      exp.parent ? h("a", { href: `#/compare?ids=${exp.parent},${exp.id}` }, h("button", {}, `Compare with exp ${exp.parent}`)) : null),
    controls.el, chartsBox,
    h("h3", {}, "Log"), log,
    h("div", { class: "grid2" },
      h("div", {}, h("h3", {}, "Attempts"), attempts, h("h3", {}, "On the target"), guard),
      h("div", {}, h("h3", {}, "Checkpoints and trash"), ckpts)),
    h("div", { class: "grid2" },
      h("div", {}, h("h3", {}, "Batching"), kv(exp.batching), h("h3", {}, "Batching plan"), kv(exp.batching_plan)),
      h("div", {}, h("h3", {}, "Config"), h("pre", { class: "json" }, JSON.stringify(exp.config, null, 2)))));

  function showState(name) {
    exp.status = name;
    stateBox.replaceChildren(state(name));
    stopBtn.disabled = !["running", "launching", "lost"].includes(name);
    restartBtn.disabled = name === "queued" || !!(exp.nodes || []).length;
  }
  async function refresh() {
    try {
      const now = await get(`/api/experiments/${id}`);
      if (ended && LIVE.includes(now.status)) return;  // the registry not yet told: the stream's end stands
      const was = exp.status;
      showState(now.status);
      if (now.status !== was) {
        loadTarget();
        if (!LIVE.includes(now.status) && liveMark.className === "live") { liveMark.textContent = ""; liveMark.className = "muted"; }
      }
    } catch (e) { /* the next refresh tries again */ }
  }

  // the log and the charts, live: the snapshot replaces what the registry had, then each batch is added
  let seq = -1;
  const source = new EventSource(`/api/experiments/${id}/events`);
  cleanup.push(() => source.close());
  const appendLog = (lines, now) => {
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    if (lines.length) logLines.textContent += lines.map(l => l + "\n").join("");
    if (logLines.textContent.length > 200000) logLines.textContent = logLines.textContent.slice(-150000);
    current.textContent = now || "";
    if (atEnd) log.scrollTop = log.scrollHeight;
  };
  const newAxes = axes => { if (axes) { live.axes = axes; runs[0].axes = runAxes(); } };
  let lastStep = null;
  const stepSeen = pts => { for (const p of Object.values(pts)) for (const [x] of p) lastStep = Math.max(lastStep ?? x, x); };
  let targetTotal = null;  // the step the target last said, moved on by what the page reads as the run prints
  const markLive = () => {
    liveMark.textContent = `● live${lastStep !== null ? ` · step ${Math.round(lastStep)}` : ""}`; liveMark.className = "live";
    const cell = guard.querySelector("tr[data-key='step'] td");
    if (cell && lastStep !== null) cell.textContent = targetTotal ? `${Math.round(lastStep)} of ${targetTotal}` : `${Math.round(lastStep)}`;
  };
  source.onmessage = msg => {
    const ev = JSON.parse(msg.data);
    if (ev.type === "snapshot") {
      seq = ev.seq;
      // the log read from its first byte replaces what the registry kept (its points come again, from the log)
      if (!ev.error) {
        live.series = ev.series;
        newAxes(ev.axes);
        stepSeen(ev.series);
        for (const [name, c] of Object.entries(set.charts)) c.set(0, ev.series[name] || []);
        set.auto(Object.keys(ev.series));
        controls.fill();
      }
      logLines.textContent = "";
      appendLog(ev.log, ev.current);
      if (ev.done) { liveMark.textContent = ""; liveMark.className = "muted"; } else markLive();
      if (ev.error) { liveMark.textContent = `log not read: ${ev.error.error}`; liveMark.className = "error"; }
    } else if (ev.type === "data") {
      if (ev.seq <= seq) return;
      seq = ev.seq;
      newAxes(ev.axes);
      stepSeen(ev.points);
      for (const [name, pts] of Object.entries(ev.points)) {
        (live.series[name] = live.series[name] || []).push(...pts);
        if (set.charts[name]) set.charts[name].add(0, pts);
      }
      if (ev.axes) for (const c of Object.values(set.charts)) c.draw();
      set.auto(Object.keys(live.series));
      controls.fill();
      appendLog(ev.log, ev.current);
      if (!ended) markLive();
    } else if (ev.type === "end") {
      source.close();
      if (ev.error) {  // the log could not be read: what the registry kept is what there is
        liveMark.textContent = `log not read: ${ev.error}`; liveMark.className = "error";
        live.series = null;
        for (const [name, c] of Object.entries(set.charts)) if (!c.count()) c.set(0, stored[name] || []);
        refresh();
        return;
      }
      liveMark.textContent = ev.state ? `(${ev.state}${ev.exit_code !== null && ev.exit_code !== undefined ? `, exit ${ev.exit_code}` : ""})` : "";
      liveMark.className = "muted";
      if (ev.ended) {  // the run is over: the page follows it there, then asks the target (which settles the record)
        ended = true;
        showState(ev.state);
      }
      loadTarget().then(refresh);
    }
  };
  const timer = setInterval(() => { if (!document.hidden && LIVE.includes(exp.status)) refresh(); }, 5000);
  cleanup.push(() => clearInterval(timer));

  // what only the target knows: its guard and its checkpoints (orch status --json, orch checkpoints list --json)
  function loadTarget() {
    const one = get(`/api/experiments/${id}/status`).then(s => {
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
      guard.dataset.state = s.state || "";
      targetTotal = sum.total_steps || null;
    }).catch(e => guard.replaceChildren(h("p", { class: "error" }, e.message)));
    const two = get(`/api/experiments/${id}/checkpoints`).then(c => ckpts.replaceChildren(...checkpointTables(c)))
      .catch(e => ckpts.replaceChildren(h("p", { class: "error" }, e.message)));
    return Promise.all([one, two]);
  }
  loadTarget();
  view.dataset.ready = "1";
}

// A checkpoint folder and its trash, as people read them: names in order (ckpt-9 before ckpt-10), sizes in
// KiB/MiB/GiB, times as dates; the newest trash entry first.
function checkpointTables(c) {
  const byName = new Intl.Collator(undefined, { numeric: true });
  const files = [...(c.listing || [])].sort((a, b) => byName.compare(a.path, b.path));
  const trash = [...(c.entries || [])].sort((a, b) => (b.created || 0) - (a.created || 0) || byName.compare(a.name, b.name));
  return [
    h("p", { class: "muted" }, `${c.path} · ${c.files} file(s), ${fmt.size(c.bytes)}`),
    files.length ? h("table", { id: "checkpoints" }, h("thead", {}, h("tr", {}, h("th", {}, "file"), h("th", { class: "num" }, "size"), h("th", {}, "written"))),
      h("tbody", {}, ...files.map(f => h("tr", {}, h("td", {}, f.path), h("td", { class: "num" }, fmt.size(f.size)), h("td", {}, fmt.when(f.mtime))))))
      : h("p", { class: "muted" }, "no checkpoints"),
    h("h3", {}, `Trash (${c.trash})`),
    trash.length ? h("table", { id: "trash" }, h("thead", {}, h("tr", {}, ...["entry", "files", "size", "holds", "moved by", "moved"].map(k => h("th", {}, k)))),
      h("tbody", {}, ...trash.map(e => h("tr", {}, h("td", {}, e.name), h("td", { class: "num" }, e.files ?? "-"), h("td", { class: "num" }, fmt.size(e.bytes)),
        h("td", {}, e.experiment ?? "-"),
        h("td", {}, e.moved_by !== null && e.moved_by !== undefined ? `exp ${e.moved_by}` : "-"), h("td", {}, fmt.when(e.created))))))
      : h("p", { class: "muted" }, "the trash is empty")];
}

// ---- compare and sweeps ----------------------------------------------------------------------------------------
// Several experiments' curves, one chart a metric, overlaid or grouped by a setting, with the same controls as a
// run's page. The registry keeps each point's step: by time or by tokens, a run's steps are placed through what
// is known of it (its start and end, the tokens it last printed).
function overlay(parent, data, labels, groupKeys) {
  const ids = Object.keys(data.series);
  const runs = ids.map(i => ({ label: labels[i] || `exp ${i}`, axes: (data.axes || {})[i] || {}, settings: (data.settings || {})[i] || {} }));
  const names = () => [...new Set(ids.flatMap(i => Object.keys(data.series[i])))];
  const chartView = new ChartView("compare", {});
  chartView.s.group = "";
  const set = new ChartSet(h("div"), chartView, runs, (k, name) => data.series[ids[k]][name] || [], data.better);
  const controls = chartControls(chartView, names, name => set.show(name), { groupKeys });
  parent.append(controls.el, set.box);
  for (const name of firstCharts(names())) set.show(name);
  if (!names().length) parent.append(h("p", { class: "muted" }, "no metric series recorded yet (orch status reads them)"));
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
        h("table", { id: "metrics" }, h("thead", {}, head), h("tbody", {}, ...c.metrics.map(
          r => h("tr", { "data-metric": r.metric }, h("th", {}, r.metric), ...r.values.map(v => h("td", {}, v)))))))),
    h("h3", {}, "Curves"), charts);
  const labels = Object.fromEntries(c.ids.map(i => [i, `exp ${i}${c.messages[i] ? `: ${c.messages[i]}` : ""}`]));
  overlay(charts, c, labels, groupKeys(c.diff.map(r => r.key), c.settings));
  view.dataset.ready = "1";
}

// the settings a chart can group runs by: those that differ (batching first, as the diff has them), then the rest
function groupKeys(differing, settings) {
  const all = new Set(Object.values(settings || {}).flatMap(s => Object.keys(s)));
  return [...differing.filter(k => all.has(k)), ...[...all].filter(k => !differing.includes(k)).sort()];
}

async function sweepView(sweep) {
  const s = await get(`/api/sweeps/${encodeURIComponent(sweep)}`);
  const charts = h("div");
  if (s.rows) {  // a search (orch sweep --trials N): its trials, parallel coordinates and scatters (search.js)
    searchView(s, charts);
    const ids = s.rows.filter(r => r.experiment !== null && r.experiment !== undefined).map(r => r.experiment);
    if (s.series) overlay(charts, s, Object.fromEntries(ids.map(i => [i, `exp ${i}`])), groupKeys(s.keys, s.settings));
    view.dataset.ready = "1";
    return;
  }
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
    h("p", { class: "muted" }, s.window ? `ranked by throughput over steps ${sig3(s.window[0])}–${sig3(s.window[1])}` : "no metrics yet"),
    h("table", { id: "sweep" }, h("thead", {}, h("tr", {}, ...["", "id", ...s.keys, unit, "loss", "efficiency", "state"].map(c => h("th", {}, c)))),
      h("tbody", {}, ...s.variants.map(v => h("tr", { "data-experiment-id": v.id, onclick: () => { location.hash = `#/exp/${v.id}`; } },
        h("td", { class: "best" }, v.best ? "best" : ""), h("td", {}, v.id), ...Object.values(v.settings).map(x => h("td", {}, x)),
        h("td", { class: "num" }, sig3(v.throughput)), h("td", { class: "num" }, sig3(v.loss)),
        h("td", { class: "num" }, sig3(v.efficiency)), h("td", {}, state(v.status)))))),
    h("h3", {}, "Curves"), charts);
  overlay(charts, s, Object.fromEntries(s.variants.map(v => [v.id, `exp ${v.id}: ${Object.values(v.settings).join(", ")}`])),
          groupKeys(s.keys, s.settings));
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
