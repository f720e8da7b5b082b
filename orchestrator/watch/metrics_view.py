"""Keeping each experiment's metrics up to date in the registry, incrementally.

Each refresh reads the log from where the last one stopped (complete lines only), feeds the parsed
events into bounded series (``metrics.Series``), and derives what ``status`` and ``compare`` show:
step, loss, throughput and its change against the previous experiment on the target, spikes, ETA,
stalls. The series stay bounded however long the run, so the registry stays small. Once a run has
ended and its whole log is read, its metrics are marked complete and never read again.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from ..reach.agent_client import AgentClient, Op, decode_log
from ..config import Settings
from ..errors import NotFoundError, OrchError
from ..records.experiments import ENDED, FINAL, Experiment, Registry
from ..reach.targets import Target

CHUNK = 4 << 20  # bytes per agent call
SERIES_CHUNK = 1 << 19  # bytes of a run's series per agent call (some 12,000 events); the budget is checked between
STATUS_BUDGET_S = 2.0  # `orch status` stays responsive on a huge log; the rest is read next time
# where the run's supervisor sums its series up (its last step, each metric's last and best), what status shows is
# exact however little of the series is read: the rest, for the charts, is read a chunk a time (the one asked ahead,
# in the status's own call: no further call, which costs more than the chunk; 1 MB a status outruns any run)
SUMMED_BUDGET_S = 0.0
COUNTERS = ("step", "epoch", "total_steps", "total_epochs", "tokens", "total_tokens", "t")  # not series
MAX_SERIES = 64  # a log that prints more metric names than this keeps the first ones
EVAL_LOSSES = ("val_loss", "test_loss")  # the eval loss status shows: the validation loss, else the test loss
QUIET_S = 300.0  # without [run] stall_after, a running run this long without a line (or a step) is noted


def as_recorded(settings: Settings, exp: Experiment) -> Settings:
    """The settings an experiment was launched with govern how its log is read (stalls, ETA); its patterns are
    the recorded ones plus today's ``[metrics] patterns``."""
    from pydantic import ValidationError

    from ..config import MetricsSection, recorded_as_now

    recorded = recorded_as_now(exp.config or {})
    try:
        metrics = MetricsSection.model_validate(recorded["metrics"]) if "metrics" in recorded else settings.metrics
    except ValidationError:
        return settings
    # patterns added since teach orch to read earlier logs too; a name given now wins over the recorded one
    metrics = metrics.model_copy(update={"patterns": {**metrics.patterns, **settings.metrics.patterns}})
    total = (recorded.get("project") or {}).get("total_steps", settings.project.total_steps)
    project = settings.project.model_copy(update={"total_steps": total})
    run = recorded.get("run") if isinstance(recorded.get("run"), dict) else {}
    stall = run.get("stall_after", settings.run.stall_after)  # what its supervisor was told
    run_section = settings.run.model_copy(update={"stall_after": stall if isinstance(stall, (int, float)) else None})
    return settings.model_copy(update={"metrics": metrics, "project": project, "run": run_section})


def _state(stored: dict | None) -> tuple[int, dict, dict]:
    if not stored:
        return 0, {}, {}
    return stored["log_offset"], stored["series"], dict(stored["summary"].get("_state") or {})


def is_complete(stored: dict | None, key: str | None = None) -> bool:
    """True when the stored metrics cover a run that has ended, to its last byte, read the way ``key``
    (``reading_key.parser_key``) names: a changed pattern set or parser makes them stale."""
    state = (stored or {}).get("summary", {}).get("_state") or {}
    return bool(state.get("complete")) and (key is None or state.get("no_run_folder") or state.get("parser") == key)


def reading_key(settings: Settings, exp: Experiment) -> str:
    """How ``exp``'s log is read now: the parser's version and the patterns that apply to it."""
    return _key_of(as_recorded(settings, exp))


def _key_of(recorded: Settings) -> str:
    """``reading_key`` from the settings ``as_recorded`` made already."""
    from .reading_key import parser_key

    return parser_key(recorded.metrics.patterns)


def ingest(settings: Settings, text_lines: list[str], series: dict, state: dict) -> None:
    from .logparse import Parser

    parser = Parser(settings.metrics.patterns or None, state.get("reader"))
    state["lines"] = state.get("lines", 0) + sum(1 for line in text_lines if line.strip())
    if not state.get("events"):  # until a line is read: a few lines to propose a pattern from
        unread = state.setdefault("unread", [])
        unread += [line[:300] for line in text_lines if line.strip()][:SAMPLE_LINES - len(unread)]
    add_events(parser.parse_lines(text_lines), series, state)
    state["reader"] = parser.state()


def add_events(events: list[dict], series: dict, state: dict) -> None:
    """Metric events (read here from the log, or kept by the run's supervisor) into the stored series and the
    state the summary is made from."""
    from .metrics import Series

    live = {k: Series.from_dict(v) for k, v in series.items()}
    last = state.setdefault("last", {})
    events_seen = state.get("events", 0)
    last_step = state.get("last_step")
    for ev in events:
        if _evaluation_bar(ev, state):
            continue
        if "step" in ev:
            state.setdefault("first_step", ev["step"])
            last_step = state["last_step"] = ev["step"]
        for key in ("total_steps", "epoch", "tokens", "total_tokens"):
            if key in ev:
                state[key] = ev[key]
        if "loss" in ev:
            state["last_loss"] = ev["loss"]
            if state.get("min_loss") is None or ev["loss"] < state["min_loss"]:
                state["min_loss"] = ev["loss"]
        x = float(last_step if last_step is not None else events_seen)
        events_seen += 1
        for key, value in ev.items():
            if key in COUNTERS:
                continue
            s = live.get(key)
            if s is None:
                if len(live) >= MAX_SERIES:
                    continue
                s = live[key] = Series()
            s.add(x, float(value))
            last[key] = float(value)
    state["events"] = events_seen
    if events_seen:
        state.pop("unread", None)
    series.clear()
    series.update({k: v.to_dict() for k, v in live.items()})


NOTE_AFTER_LINES = 20  # a running run's first lines (its set-up) are not yet a reason to say no metric was found
NOTE_AFTER_LINES_ENDED = 5  # nor are the few lines of a run that ended well at once


def _worth_a_note(lines: int, state: str, exit_code: int | None) -> bool:
    """Whether a log without a metric line is a format orch should be taught: a run that kept running past its
    set-up, or ended well after a few lines. A run that died after a line or two (``can't open file``, an
    ImportError) printed no metric because it never trained: its last line says why, not a missing pattern."""
    return lines >= (NOTE_AFTER_LINES_ENDED if state == "finished" and exit_code in (0, None) else NOTE_AFTER_LINES)
SAMPLE_LINES = 50  # the unread lines kept to build (and check) a proposed pattern from


def no_metrics_note(lines: int, sample: list[str] | None = None, patterns: dict | None = None) -> str:
    """What ``status`` and ``logs --metrics`` say about a log none of whose lines holds a metric: the configured
    patterns and how many of the lines each matched, then a ``[metrics] patterns`` entry built from the log's own
    ``sample`` lines and checked against them (none when no line names a loss, lr, acc or ppl)."""
    from .logparse import Parser, propose

    text = f"no metric line recognised in {lines} line{'s' if lines != 1 else ''}"
    sample = sample or []
    if patterns:
        counts = Parser(patterns).matching(sample)
        text += "; [metrics] patterns matched: " + ", ".join(f"{k} {n} of {len(sample)} lines"
                                                               for k, n in counts.items())
    found = propose(sample)
    if found is not None:
        name, source, reads = found
        return (f"{text}; hint: add to orch.toml [metrics] patterns = {{ {name} = '{source}' }} "
                f"(it reads {reads} of the {len(sample)} lines seen)")
    return f"{text}; hint: teach orch the run's format with [metrics] patterns in orch.toml, one regex per metric " \
           "with one group for the number, e.g. patterns = { loss = 'loss=([0-9.eE+-]+)' }"


def _evaluation_bar(ev: dict, state: dict) -> bool:
    """A progress bar over fewer items than the training bar and behind it (Hugging Face's evaluation bar
    has no name of its own): its counts are not training steps."""
    total, known = ev.get("total_steps"), state.get("total_steps")
    return (total is not None and known is not None and total < known
            and set(ev) <= {"step", "total_steps", "steps_s"} and ev.get("step", -1.0) <= (state.get("last_step") or 0))


def _int(v: float | None) -> float | int | None:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def summary(settings: Settings, exp: Experiment, series: dict, state: dict, run: dict | None,
            previous: dict | None, now: float) -> dict:
    from .metrics import Series, best_of, find_spikes, format_duration, format_rate, spike_episodes, throughput_change

    out: dict[str, Any] = {"step": _int(state.get("last_step")), "total_steps": _int(state.get("total_steps")),
                           "loss": state.get("last_loss"), "min_loss": state.get("min_loss"), "notes": []}
    loss = Series.from_dict(series["loss"]) if "loss" in series else None
    if loss is not None:
        pts = loss.points()
        episodes = spike_episodes(find_spikes([p[1] for p in pts], [p[0] for p in pts]))
        out["spikes"] = len(episodes)
        out["spike_steps"] = [_int(ep[0].step) for ep in episodes]
    metrics = state.get("last") or {}
    out["metrics"] = {k: metrics[k] for k in sorted(metrics)}
    out["best"] = best_of(series)  # the dashboard's best column, by each metric's direction
    eval_key = next((k for k in EVAL_LOSSES if k in metrics), None)
    if eval_key is not None:
        out["eval_loss"], out["eval_metric"] = metrics[eval_key], eval_key
    tok = Series.from_dict(series["tok_s"]).values() if "tok_s" in series else []
    steps = Series.from_dict(series["steps_s"]).values() if "steps_s" in series and not tok else []
    samples = Series.from_dict(series["samples_s"]).values() if "samples_s" in series and not (tok or steps) else []
    # tokens/s where the log gives it, else steps/s (time per iteration, it/s), else samples/s: never one passed
    # off as another
    rate_key, unit, rates = (("median_tok_s", "tok/s", tok) if tok else ("median_steps_s", "steps/s", steps)
                             if steps or not samples else ("median_samples_s", "samples/s", samples))
    if rates:
        out[rate_key] = statistics.median(rates)
        prev_rate = (previous or {}).get(rate_key)
        label = f"exp {previous['id']}" if previous else "previous"
        out["throughput"] = throughput_change(out[rate_key], prev_rate, label, unit)
        if prev_rate:
            out["throughput_vs"] = {"experiment": previous["id"], rate_key: prev_rate,  # type: ignore[index]
                                    "change": (out[rate_key] - prev_rate) / prev_rate}
    run = run or {}
    state_name = run.get("state", exp.status)
    total = state.get("total_steps") or settings.project.total_steps
    started = run.get("started") or exp.started or exp.created
    last_time = run.get("log_mtime") or now
    done_steps = (state.get("last_step") or 0) - (state.get("first_step") or 0)
    if state_name == "running" and total and done_steps > 0 and last_time > started:
        rate = done_steps / (last_time - started)
        out["eta_s"] = max(0.0, (total - state["last_step"]) / rate)
    elif state_name == "running" and state.get("total_tokens") and state.get("tokens") and tok:
        out["eta_s"] = max(0.0, (state["total_tokens"] - state["tokens"]) / statistics.median(tok[-20:]))
    if out.get("eta_s") is not None:
        out["eta"] = format_duration(out["eta_s"])
    if state_name == "running" and run.get("log_mtime"):
        step_age = now - state["step_seen"] if state.get("step_seen") else None
        out["notes"] += _quiet_notes(now - run["log_mtime"], step_age, settings.run.stall_after)
    if out.get("spikes"):
        out["notes"].append(f"{out['spikes']} loss spike(s), first at step {out['spike_steps'][0]}")
    if out.get("median_tok_s") is not None:
        out["tok_s_text"] = format_rate(out["median_tok_s"])
    if state.get("lines") and not state.get("events") and _worth_a_note(state["lines"], state_name,
                                                                        run.get("exit_code", exp.exit_code)):
        out["unrecognised_lines"] = state["lines"]
        out["notes"].append(no_metrics_note(state["lines"], state.get("unread"), settings.metrics.patterns))
    if state.get("behind"):
        out["notes"].append(f"metrics read up to byte {state['offset']} of {state['size']}; "
                            "the rest on the next refresh")
    return out


def _quiet_notes(age: float, step_age: float | None, stall_after: float | None) -> list[str]:
    """``stalled: …`` past ``[run] stall_after`` (its supervisor stops a run whose log stops; one whose log grows
    without a step is only shown); without it, a run ``QUIET_S`` without a line or a step is only noted."""
    from .metrics import format_duration

    limit, word = (stall_after, "stalled: ") if stall_after is not None else (QUIET_S, "")
    if age > limit:
        return [f"{word}no new log line for {format_duration(age)}"]
    if step_age is not None and step_age > limit:
        return [f"{word}no step progress for {format_duration(step_age)} (the log still grows)"]
    return []


def first_read(settings: Settings, registry: Registry, exp: Experiment) -> Op:
    """The ``log_read`` a ``refresh`` of ``exp`` starts with (from where the stored metrics stopped): asked ahead,
    in a call made anyway, its answer is given to ``refresh`` as ``ahead``."""
    stored = registry.metrics(exp.id)
    offset, _, state = _state(stored)
    recorded = as_recorded(settings, exp)
    if state.get("parser") != _key_of(recorded):
        offset, state = 0, {}
    return _log_read(registry, exp, offset, state, recorded)


def _log_read(registry: Registry, exp: Experiment, offset: int, state: dict, settings: Settings) -> Op:
    """The next read of the run's log; where its supervisor keeps the run's series (``agent/run/series.py``) and no
    ``[metrics] patterns`` need the log's lines, of the series instead (``series_offset``)."""
    args = {"exp_id": exp.id, "registry": registry.run_registry(exp.id), "offset": offset,
            "identity": state.get("identity"), "max_bytes": CHUNK}
    if not settings.metrics.patterns and state.get("source") != "log":
        args["series_offset"], args["max_bytes"] = state.get("series_offset", 0), SERIES_CHUNK
    return Op("log_read", args)


def refresh(settings: Settings, target: Target, registry: Registry, client: AgentClient,
            exp: Experiment | None, *, now: float | None = None, budget_s: float | None = STATUS_BUDGET_S,
            with_previous: bool = True, ahead: tuple[Op, Any] | None = None) -> dict:
    """Read what is new in the experiment's log, store it, and return the summary to show.

    ``now`` is the target's clock when known (stall ages compare it with the log's mtime there);
    ``budget_s`` bounds the time spent reading, None reads to the end. ``ahead`` is a ``first_read`` op and its
    value, already asked: used where it is the very read this refresh starts with.
    """
    if exp is None:
        return {}
    from ..records.reconcile import sync

    base, settings = settings, as_recorded(settings, exp)
    key = _key_of(settings)
    stored = registry.metrics(exp.id)
    offset, series, state = _state(stored)
    if state.get("parser") != key:  # read with other patterns or an older parser: read it again
        offset, series, state = 0, {}, {}
    state["parser"] = key
    old_step = state.get("last_step")
    begin = time.monotonic()
    kept = None
    while True:
        op = _log_read(registry, exp, offset, state, settings)
        try:
            if ahead is not None and ahead[0] == op:
                value = ahead[1]
            else:
                value = client.call([op])[0]
            ahead = None
        except NotFoundError:
            if exp.status in FINAL:  # it ended without a run folder here: nothing will ever be read
                _keep_without_log(registry, exp.id, stored)
            return {"notes": [f"experiment {exp.id} has no run folder on target {target.name}"]}
        run = value["state"]
        if value["reset"]:
            offset, series, state = 0, {}, {"parser": key}
            if "series" in value:
                continue  # its records were read from the old offset: ask again from the start
        if "series" in value:  # the events its supervisor read as they were written: no line read again here
            kept = value["series"]
            records = kept_records(kept["data"], state.setdefault("series_context", {}))
            add_events([record[2] for record in records], series, state)
            if records:
                offset = records[-1][0]  # the log is read (by its supervisor) to the end of this event's line
            state["series_offset"], state["source"] = kept["offset"], "series"
            state["identity"] = value["identity"]
            budget = budget_s if budget_s is None or "summary" not in kept else min(budget_s, SUMMED_BUDGET_S)
            if kept["offset"] >= kept["size"] or (budget is not None and time.monotonic() - begin > budget):
                break
            continue
        if state.get("source") == "series":
            break  # its series is gone (the run folder collected): what was read stays
        data = decode_log(value)
        at_end = value["offset"] >= value["size"]
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1  # a progress bar's update ends with \r
        if not cut and data and (len(data) >= CHUNK or (at_end and run.get("state") in ENDED)):
            cut = len(data)  # a line longer than a chunk, or the run's unterminated last line
        if cut:
            ingest(settings, data[:cut].decode("utf-8", "replace").splitlines(), series, state)
            state["source"] = "log"
        offset = value["offset"] - len(data) + cut
        state["identity"] = value["identity"]
        if cut == 0 or offset >= value["size"] or (budget_s is not None and time.monotonic() - begin > budget_s):
            break
    if kept is not None:  # how far the series is read, and whether it covers the log to its end
        state["behind"] = kept["offset"] < kept["size"]
        state["offset"], state["size"] = kept["offset"], kept["size"]
        state["complete"] = run.get("state") in ENDED and kept["offset"] >= kept["size"] and kept["whole"]
    elif state.get("source") != "series":
        state["behind"] = offset < value["size"] and cut > 0
        state["offset"], state["size"] = offset, value["size"]
        state["complete"] = run.get("state") in ENDED and offset >= value["size"]
    if state.get("last_step") != old_step:
        state["step_seen"] = run.get("log_mtime")
    # the earlier experiment's own reads (agent calls) before this one's writes, which then hold the registry's
    # write lock only for as long as they take: another command never waits on a target answering
    previous = _previous(base, target, registry, client, exp, with_previous, budget_s)
    with registry.batch():
        if run.get("id") == exp.id and not exp.nodes:  # a job's state is every node's, settled by the job layer
            sync(registry, [run], target, settings.project.name)
            exp = registry.get(exp.id)
        out = summary(settings, exp, series, state, run, previous, time.time() if now is None else now)
        if kept is not None and state["behind"] and isinstance(kept.get("summary"), dict):
            summed_up(out, kept["summary"])
        kept_summary = {**{k: v for k, v in out.items() if k != "notes"}, "_state": state}
        # (what is stored already is not written again: a status of a run with nothing new takes no write, its
        # sync of the file nor the registry's lock from a command beside it; anything read moves the offsets)
        if stored is None or offset != stored["log_offset"] or kept_summary != stored["summary"]:
            registry.save_metrics(exp.id, offset, series, kept_summary)
    return out


def summed_up(out: dict, kept: dict) -> None:
    """Where the series is read only in part, the place ``out`` shows from the supervisor's own summary of it
    (``agent/run/series.py``: ``Summary``): the last step, the last loss and each metric's last and best value."""
    from .metrics import better

    last, low, high = kept.get("last") or {}, kept.get("min") or {}, kept.get("max") or {}
    for key in ("step", "total_steps"):
        if isinstance(kept.get(key), (int, float)):
            out[key] = _int(float(kept[key]))
    metrics = {k: float(v) for k, v in last.items() if k not in COUNTERS and isinstance(v, (int, float))}
    if "loss" in metrics:
        out["loss"], out["min_loss"] = metrics["loss"], float(low.get("loss", metrics["loss"]))
    out["metrics"] = {k: metrics[k] for k in sorted(metrics)}
    out["best"] = {k: float((high if better(k) == "max" else low).get(k, v)) for k, v in out["metrics"].items()}
    eval_key = next((k for k in EVAL_LOSSES if k in metrics), None)
    if eval_key is not None:
        out["eval_loss"], out["eval_metric"] = metrics[eval_key], eval_key


def kept_records(data: str, context: dict | None = None) -> list:
    """The records of a run's series (``agent/run/series.py``) as a ``log_read`` with ``series_offset`` sends them;
    ``context``: what the reads of the series before this one found (its shapes' names), updated in place."""
    import base64

    from ..agent.run.series import records

    return records(base64.b64decode(data), context)


def _keep_without_log(registry: Registry, exp_id: int, stored: dict | None) -> None:
    """Marks an ended experiment's metrics final once its log is gone (its run folder collected): what was read
    before, under other patterns or parser, is kept as it is rather than lost."""
    if stored and (stored["series"] or stored["log_offset"]):
        summary = dict(stored["summary"])
        summary["_state"] = {**(summary.get("_state") or {}), "complete": True, "no_run_folder": True}
        registry.save_metrics(exp_id, stored["log_offset"], stored["series"], summary)
    else:
        registry.save_metrics(exp_id, 0, {}, {"_state": {"complete": True, "no_run_folder": True}})


def _previous(settings: Settings, target: Target, registry: Registry, client: AgentClient, exp: Experiment,
              fetch: bool, budget_s: float | None) -> dict | None:
    """The experiment to compare throughput against: the parent, else the one before on the target.

    A candidate on this target whose metrics were never read (it ran while nobody asked), or were read
    with other patterns, is read now.
    """
    candidates = [registry.get(exp.parent)] if exp.parent else []
    nearby = registry.list(machine=exp.machine, limit=10) if exp.machine else \
        registry.list(target=exp.target, limit=10)
    candidates += [e for e in nearby if e.id < exp.id]
    for cand in candidates:
        m = registry.metrics(cand.id)
        same = cand.machine == target.machine if cand.machine else cand.target == target.name
        if fetch and same and cand.status != "failed" and not is_complete(m, reading_key(settings, cand)):
            refresh(settings, target, registry, client, cand, budget_s=budget_s, with_previous=False)
            m = registry.metrics(cand.id)
        rates = {k: m["summary"][k] for k in ("median_tok_s", "median_steps_s", "median_samples_s")
                 if m and m["summary"].get(k)}
        if rates:
            return {"id": cand.id, **rates}
    return None


def target_flags(settings: Settings, exp: Experiment) -> tuple[str | None, int | None]:
    """The (--target, --ct) that reach the target an experiment ran on; for a job, its node 0 (whose log is the
    job's metrics)."""
    if exp.nodes:
        first = exp.nodes[0]
        return (first["target"], None) if first.get("target") in settings.targets or first.get("ct") is None \
            else (None, int(first["ct"]))
    if exp.target in settings.targets:
        return exp.target, None
    ct = exp.target_info.get("ct")
    return (None, int(ct)) if ct is not None else (exp.target, None)


def refresh_stale(settings: Settings, registry: Registry, exps: list[Experiment],
                  resolve: Callable[[Experiment], Target], notice: Callable[[str], None],
                  budget_s: float | None = None) -> int:
    """Bring incomplete metrics up to date, one connection per target; returns how many were read.

    Experiments whose metrics are complete cost nothing; a target that cannot be reached is
    reported through ``notice`` and its experiments keep what the registry has. ``budget_s`` bounds each one's
    read as ``refresh``'s does (``experiments show``, which shows the summary); None reads every log to its end.
    """
    from ..records.reconcile import client_for

    todo: dict[str, list[Experiment]] = {}
    for exp in exps:
        if exp.status != "failed" and not is_complete(registry.metrics(exp.id), reading_key(settings, exp)):
            todo.setdefault(exp.target, []).append(exp)
    done = 0
    for name, group in todo.items():
        try:
            target = resolve(group[0])
            client = client_for(settings, target)
        except OrchError as exc:
            notice(f"metrics of experiment(s) {', '.join(str(e.id) for e in group)} not refreshed: {exc.message}")
            continue
        try:
            for exp in group:
                refresh(settings, target, registry, client, exp, budget_s=budget_s, with_previous=False)
                done += 1
        except OrchError as exc:
            notice(f"metrics on target {name} not refreshed: {exc.message}")
        finally:
            client.transport.close()
    return done
