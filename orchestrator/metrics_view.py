"""Keeping each experiment's metrics up to date in the registry, incrementally.

Each refresh reads the log from where the last one stopped (complete lines only), feeds the parsed
events into bounded series (``metrics.Series``), and derives what ``status`` and ``compare`` show:
step, loss, throughput and its change against the previous experiment on the target, spikes, ETA,
stalls. The series stay bounded however long the run, so the registry stays small.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from .agent_client import AgentClient, decode_log
from .config import Settings
from .experiments import Experiment, Registry
from .targets import Target

MAX_READ = 4 << 20  # bytes parsed per refresh at most; the rest next time
TRACKED = ("loss", "tok_s", "lr", "grad_norm")


def _state(stored: dict | None) -> tuple[int, dict, dict]:
    if not stored:
        return 0, {}, {}
    return stored["log_offset"], stored["series"], dict(stored["summary"].get("_state") or {})


def ingest(settings: Settings, text_lines: list[str], series: dict, state: dict) -> None:
    from .metrics import Parser, Series

    parser = Parser(settings.metrics.patterns or None)
    live = {k: Series.from_dict(v) for k, v in series.items()}
    for line in text_lines:
        ev = parser.parse_line(line)
        if not ev:
            continue
        if "step" in ev:
            state.setdefault("first_step", ev["step"])
            state["last_step"] = ev["step"]
        for key in ("total_steps", "epoch"):
            if key in ev:
                state[key] = ev[key]
        if "loss" in ev:
            state["last_loss"] = ev["loss"]
            if state.get("min_loss") is None or ev["loss"] < state["min_loss"]:
                state["min_loss"] = ev["loss"]
        x = ev.get("step", state.get("last_step", state.get("events", 0)))
        state["events"] = state.get("events", 0) + 1
        for key in TRACKED:
            if key in ev:
                live.setdefault(key, Series()).add(float(x), float(ev[key]))
    series.clear()
    series.update({k: v.to_dict() for k, v in live.items()})


def summary(settings: Settings, exp: Experiment, series: dict, state: dict, run: dict | None,
            previous: dict | None, now: float) -> dict:
    from .metrics import Series, find_spikes, format_duration, format_rate, spike_episodes, throughput_change

    out: dict[str, Any] = {"step": state.get("last_step"), "total_steps": state.get("total_steps"),
                           "loss": state.get("last_loss"), "min_loss": state.get("min_loss"), "notes": []}
    loss = Series.from_dict(series["loss"]) if "loss" in series else None
    if loss is not None:
        pts = loss.points()
        episodes = spike_episodes(find_spikes([p[1] for p in pts], [p[0] for p in pts]))
        out["spikes"] = len(episodes)
        out["spike_steps"] = [ep[0].step for ep in episodes]
    tok = Series.from_dict(series["tok_s"]).values() if "tok_s" in series else []
    if tok:
        out["median_tok_s"] = statistics.median(tok)
        prev_rate = (previous or {}).get("median_tok_s")
        label = f"exp {previous['id']}" if previous else "previous"
        out["throughput"] = throughput_change(out["median_tok_s"], prev_rate, label)
    total = state.get("total_steps") or settings.project.total_steps
    started = exp.started or exp.created
    last_time = (run or {}).get("log_mtime") or now
    done_steps = (state.get("last_step") or 0) - (state.get("first_step") or 0)
    if total and done_steps > 0 and last_time > started:
        rate = done_steps / (last_time - started)
        out["eta_s"] = max(0.0, (total - state["last_step"]) / rate)
        out["eta"] = format_duration(out["eta_s"])
    state_name = (run or {}).get("state", exp.status)
    if state_name == "running" and run and run.get("log_mtime"):
        age = now - run["log_mtime"]
        if age > settings.metrics.stall_after:
            out["notes"].append(f"stalled: no new log line for {format_duration(age)}")
    if out.get("spikes"):
        out["notes"].append(f"{out['spikes']} loss spike(s), first at step {out['spike_steps'][0]}")
    if out.get("median_tok_s") is not None:
        out["tok_s_text"] = format_rate(out["median_tok_s"])
    return out


def refresh(settings: Settings, target: Target, registry: Registry, client: AgentClient,
            exp: Experiment | None) -> dict:
    """Read what is new in the experiment's log, store it, and return the summary to show."""
    if exp is None:
        return {}
    offset, series, state = _state(registry.metrics(exp.id))
    identity = state.get("identity")
    run = None
    read = 0
    while read < MAX_READ:
        value = client.one("log_read", exp_id=exp.id, offset=offset, identity=identity, max_bytes=1 << 20)
        run = value["state"]
        if value["reset"]:
            offset, series, state = 0, {}, {}
        data = decode_log(value)
        cut = data.rfind(b"\n") + 1
        if cut:
            lines = data[:cut].decode("utf-8", "replace").splitlines()
            ingest(settings, lines, series, state)
        offset = (value["offset"] - len(data)) + cut
        identity = state["identity"] = value["identity"]
        read += len(data)
        if cut == 0 or offset >= value["size"]:
            break
    previous = _previous(registry, exp)
    out = summary(settings, exp, series, state, run, previous, time.time())
    registry.save_metrics(exp.id, offset, series, {**{k: v for k, v in out.items() if k != "notes"},
                                                   "_state": state})
    return out


def _previous(registry: Registry, exp: Experiment) -> dict | None:
    """The experiment to compare throughput against: the parent, else the one before on the target."""
    candidates = [registry.get(exp.parent)] if exp.parent else []
    candidates += [e for e in registry.list(target=exp.target, limit=10) if e.id < exp.id]
    for cand in candidates:
        m = registry.metrics(cand.id)
        if m and m["summary"].get("median_tok_s"):
            return {"id": cand.id, "median_tok_s": m["summary"]["median_tok_s"]}
    return None
