"""Webhook notifications, sent by a run's supervisor on the target when the event happens.

No controller needs to be connected: the supervisor calls ``Notifier.send`` at a crash, a stall, a restart or
the end, and a detached process posts the message with the standard library (``urllib``): a short timeout, a
few tries, never blocking or failing the run. Each try's outcome is a JSON line in the run's ``notify.log``,
which ``status`` reads (``summary``). The URL is a secret: it reaches the supervisor through the secrets pipe
(``handover.py``, under ``URL_KEY``), never a file, and is cut out of every error written (``redact``).

The body follows each service's documented webhook shape::

    slack    {"text": "...", "blocks": [...]}                 (incoming webhook)
    discord  {"content": "...", "username": "orch"}           (content at most 2000 characters)
    ntfy     the text as the body; Title, Priority, Tags headers
    json     {"schema": "orch.notify/1", "event", "title", "text", "experiment", "project", "target", "ct",
              "node", "time", "details": {...}, "look": "orch logs -e 14"}
"""

from __future__ import annotations

import json
import math
import os
import time

from ..protocol import AgentFailure

EVENTS = ("crashed", "stalled", "restarted", "finished", "spike", "slow")
FORMATS = ("slack", "discord", "ntfy", "json")
SCHEMA = "orch.notify/1"
URL_KEY = "orch:notify_url"  # the URL's name in the secrets pipe: never an environment variable's
LOG = "notify.log"
TIMEOUT_S = 5.0
TRIES = 3
PAUSE_S = 1.0  # before the second try; doubled before each next one
DISCORD_MAX = 2000
LINES = 10  # last log lines in a crash's message
_HEADLINE = {"crashed": "crashed", "stalled": "stalled", "restarted": "restarted", "finished": "finished",
             "spike": "has a loss spike", "slow": "is slow", "test": "test notification"}
_NTFY = {"crashed": ("high", "rotating_light"), "stalled": ("high", "warning"),
         "restarted": ("default", "repeat"), "finished": ("default", "white_check_mark"),
         "spike": ("default", "chart_with_upwards_trend"), "slow": ("default", "snail"), "test": ("low", "bell")}


def check(spec: object) -> dict:
    """The ``notify`` argument of ``run_start``: ``{"url", "format", "on", "context"}``."""
    if not isinstance(spec, dict) or set(spec) - {"url", "format", "on", "context"}:
        raise AgentFailure("input", "notify must be an object with url, format, on and context")
    url = spec.get("url")
    fault = url_fault(url) if isinstance(url, str) else "must be an http:// or https:// URL"
    if fault:
        raise AgentFailure("input", f"notify.url {fault}")
    if spec.get("format") not in FORMATS:
        raise AgentFailure("input", f"notify.format must be one of {', '.join(FORMATS)}")
    on = spec.get("on")
    if not isinstance(on, list) or any(e not in EVENTS for e in on):
        raise AgentFailure("input", f"notify.on must list events among {', '.join(EVENTS)}")
    if not isinstance(spec.get("context", {}), dict):
        raise AgentFailure("input", "notify.context must be an object")
    return spec


def message(event: str, context: dict, details: dict) -> dict:
    """The words of one notification: ``title``, ``text``, ``look`` (pure).

    >>> message("crashed", {"experiment": 14, "project": "demo", "target": "CT 101 on pve1"},
    ...         {"exit_code": 1})["title"]
    'orch: experiment 14 of demo crashed (exit code 1) on CT 101 on pve1'
    """
    exp, where = context.get("experiment"), context.get("target") or "the target"
    subject = f"experiment {exp} of {context.get('project')}" if exp is not None else f"project {context.get('project')}"
    numbers = _numbers(event, details)
    title = f"orch: {subject} {_HEADLINE.get(event, event)}{f' ({numbers})' if numbers else ''} on {where}"
    look = f"orch logs -e {exp}" if exp is not None else "orch status"
    lines = [title]
    if context.get("ct") is not None or context.get("node"):
        lines.append(f"CT {context.get('ct') or '-'}, node {context.get('node') or '-'}")
    tail = details.get("last_lines") or []
    if tail:
        lines.append("last log lines:\n" + "\n".join(tail))
    lines.append(f"look: {look}")
    return {"title": title, "text": "\n".join(lines), "look": look}


def _numbers(event: str, d: dict) -> str:
    if event in ("crashed", "finished", "restarted"):
        parts = [f"exit code {d['exit_code']}"] if d.get("exit_code") is not None else []
        if d.get("signal"):
            parts.append(f"signal {d['signal']}")
        if d.get("reason") and d.get("reason") not in (f"exit code {d.get('exit_code')}",):
            parts.append(str(d["reason"]))
        if event == "restarted" and d.get("attempt") is not None:
            parts.append(f"attempt {d['attempt']} of {d.get('attempts')}, in {d.get('delay', 0):g} s")
        return ", ".join(parts)
    if event == "stalled":
        return f"no new log line for {d.get('stall_after', 0):g} s"
    if event == "spike":
        at = f" at step {d['step']:g}" if d.get("step") is not None else ""
        return f"loss {d.get('loss'):.4g}{at}, median {d.get('median'):.4g}"
    if event == "slow":
        pct = int(d.get("change_pct") or 0)
        sign = "\u2212" if pct < 0 else "+"
        return (f"{_rate(d.get('rate'))} {d.get('unit')}, {sign}{abs(pct)}% vs experiment {d.get('against')} "
                f"({_rate(d.get('baseline'))} {d.get('unit')})")
    return ""


def _rate(value: object) -> str:
    """``11,873`` or ``2.41``: a throughput as people read it."""
    number = float(value) if isinstance(value, (int, float)) else math.nan
    return f"{number:,.0f}" if abs(number) >= 100 else f"{number:.3g}"


def payload(fmt: str, event: str, context: dict, details: dict, now: float | None = None) -> tuple[bytes, dict]:
    """The request body and headers of one notification in ``fmt``'s documented shape (pure)."""
    words = message(event, context, details)
    now = time.time() if now is None else now
    if fmt == "ntfy":
        priority, tags = _NTFY.get(event, ("default", "bell"))
        body = words["text"].split("\n", 1)[1] if "\n" in words["text"] else words["text"]
        return body.encode(), {"Title": _header(words["title"]), "Priority": priority, "Tags": tags,
                               "Content-Type": "text/plain; charset=utf-8"}
    if fmt == "slack":
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": _cut(words["title"], 3000)}}]
        tail = details.get("last_lines") or []
        if tail:
            blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                       "text": "```" + _cut("\n".join(tail), 2900) + "```"}})
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"`{words['look']}`"}]})
        data: dict = {"text": _cut(words["text"], 3000), "blocks": blocks}
    elif fmt == "discord":
        data = {"content": _cut(words["text"], DISCORD_MAX), "username": "orch"}
    else:
        data = {"schema": SCHEMA, "event": event, "title": words["title"], "text": words["text"],
                "experiment": context.get("experiment"), "project": context.get("project"),
                "target": context.get("target"), "ct": context.get("ct"), "node": context.get("node"),
                "time": now, "details": details, "look": words["look"]}
    return json.dumps(data).encode(), {"Content-Type": "application/json"}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _header(text: str) -> str:
    """A header value: one line; non-Latin-1 characters would make urllib refuse it."""
    return _cut(text.replace("\n", " "), 250).encode("latin-1", "replace").decode("latin-1")


def url_fault(url: str) -> str | None:
    """Why ``url`` is no webhook URL orch can post to (never naming it: it is a secret), or None.

    The one check, made by the controller's settings, its secret's reader and this agent alike.

    >>> url_fault("http://[hooks.example/T0"), url_fault("https://hooks.example/T0")
    ('does not parse as a URL (a bracket, port or character out of place)', None)
    """
    from urllib.parse import urlsplit

    if not url.startswith(("http://", "https://")):
        return "must be an http:// or https:// URL"
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        return "holds a space or a control character"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        return "does not parse as a URL (a bracket, port or character out of place)"
    if not parts.hostname:
        return "names no host"
    return None


def redact(text: str, url: str) -> str:
    """``text`` with the URL and each of its longer parts (host, path, query) replaced; a URL that does not
    parse is cut out whole, and so is each piece of it between ``/``, ``?`` and ``#``."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        pieces = {url, parts.netloc, parts.path, parts.query, parts.netloc + parts.path}
    except ValueError:
        rest = url.split("://", 1)[-1]
        pieces = {url, rest, *rest.replace("?", "/").replace("#", "/").split("/")}
    for piece in sorted(pieces, key=len, reverse=True):
        if len(piece) >= 4:
            text = text.replace(piece, "<webhook>")
    return text


def post(url: str, body: bytes, headers: dict, tries: int = TRIES, timeout: float = TIMEOUT_S,
         pause: float = PAUSE_S) -> dict:
    """POST until a 2xx answer or ``tries`` tries: ``{"ok", "status", "tries", "error"}``, the URL redacted."""
    import urllib.error  # here, not at the top: the supervisor imports this module before its command starts
    import urllib.request

    status, error = None, None
    for attempt in range(1, tries + 1):
        request = urllib.request.Request(url, data=body, headers={"User-Agent": "orch", **headers}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 (the user's webhook)
                answer.read(4096)
                return {"ok": True, "status": answer.status, "tries": attempt, "error": None}
        except urllib.error.HTTPError as exc:
            status, error = exc.code, f"HTTP {exc.code} {exc.reason}"
            if 400 <= exc.code < 500 and exc.code != 429:
                break  # the webhook refuses this request: another try gets the same answer
        except (urllib.error.URLError, OSError, ValueError) as exc:
            status, error = None, str(getattr(exc, "reason", None) or exc) or type(exc).__name__
        if attempt < tries:
            time.sleep(pause * 2 ** (attempt - 1))
    return {"ok": False, "status": status, "tries": attempt, "error": redact(str(error), url)[:300]}


def log_result(run_dir: str, event: str, result: dict) -> None:
    """One line of ``notify.log``; a full disk loses the line, never the run."""
    line = json.dumps({"t": time.time(), "event": event, **result}) + "\n"
    try:
        with open(os.path.join(run_dir, LOG), "a") as fh:
            fh.write(line)
    except OSError:
        pass


def summary(run_dir: str) -> dict | None:
    """What ``status`` shows: how many notifications were sent and failed, the last failure."""
    try:
        with open(os.path.join(run_dir, LOG)) as fh:
            lines = fh.read().splitlines()[-200:]
    except OSError:
        return None
    sent, failed, last = 0, 0, None
    for raw in lines:
        try:
            item = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        if item.get("ok"):
            sent += 1
        else:
            failed += 1
            last = {"event": item.get("event"), "error": item.get("error"), "time": item.get("t")}
    return {"sent": sent, "failed": failed, "last_failure": last}


class Notifier:
    """The supervisor's side: ``send("crashed", exit_code=1, ...)`` posts in a detached process, if asked."""

    def __init__(self, run_dir: str, spec: dict | None, url: str | None) -> None:
        self.run_dir, self.url = run_dir, url
        spec = spec or {}
        self.format, self.on, self.context = spec.get("format", "json"), set(spec.get("on") or ()), \
            dict(spec.get("context") or {})

    def wants(self, event: str) -> bool:
        return bool(self.url) and event in self.on

    def send(self, event: str, **details: object) -> None:
        import signal

        if not self.wants(event):
            return
        assert self.url is not None
        body, headers = payload(self.format, event, self.context, details)
        try:
            child = os.fork()
        except OSError as exc:
            log_result(self.run_dir, event, {"ok": False, "status": None, "tries": 0, "error": f"fork: {exc}"})
            return
        if child:
            os.waitpid(child, 0)  # the middle process exits at once; the poster is nobody's child
            return
        try:  # the middle process: a new session, out of the pane's (a killed tmux session ends no poster)
            os.setsid()
            if os.fork():
                os._exit(0)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDWR)  # the pane's terminal stays free to close
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            log_result(self.run_dir, event, post(self.url, body, headers))
        finally:
            os._exit(0)


def last_lines(path: str, count: int = LINES) -> list[str]:
    """The last ``count`` lines of the log (its last 8 KiB), for a crash's message."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return [line[:300] for line in lines[-count:]]


def test(layout: object, notify: dict) -> dict:
    """``orch notify test``: one message posted from the target now, and the answer."""
    spec = check(notify)
    body, headers = payload(spec["format"], "test", spec.get("context") or {}, {})
    return post(spec["url"], body, headers)


class MetricWatch:
    """What is new in the run's log, read at each tick of the supervisor's watch: ``spike`` (a loss jump, at most
    one message per ``SPIKE_GAP_S``) and ``slow`` (the median throughput under ``SLOW`` of the baseline run's,
    the parent's, sent again only after it came back over ``AGAIN``)."""

    SLOW, AGAIN, SPIKE_GAP_S, READ_MAX = 0.7, 0.9, 300.0, 1 << 20

    def __init__(self, told: Notifier, log_path: str) -> None:
        from ..metrics import metric_lines

        self.told, self.path, self.lines = told, log_path, metric_lines
        try:
            self.offset = os.path.getsize(log_path)  # this attempt's lines only
        except OSError:
            self.offset = 0
        self.rest = b""
        self.spikes, self.rate = metric_lines.Spikes(), metric_lines.Rate()
        self.reader = metric_lines.Reader()
        base = told.context.get("baseline") or {}
        self.unit_key = "tok_s" if base.get("tok_s") else "steps_s" if base.get("steps_s") else None
        self.baseline = base.get(self.unit_key) if self.unit_key else None
        self.against = base.get("experiment")
        self.last_spike, self.slow_sent = -math.inf, False

    def tick(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(self.READ_MAX)
        except OSError:
            return
        self.offset += len(data)
        *complete, self.rest = (self.rest + data).split(b"\n")
        if len(self.rest) > self.READ_MAX:
            self.rest = b""  # one endless line (a progress bar without newlines): not a metric line
        for raw in complete:
            self.line(raw.decode("utf-8", "replace").rsplit("\r", 1)[-1])

    def line(self, text: str) -> None:
        found = self.lines.parse(text, self.reader)  # an eval loss is val_loss: never taken for a spike
        if "loss" in found and self.told.wants("spike"):
            median = self.spikes.add(found["loss"])
            now = time.monotonic()
            if median is not None and now - self.last_spike >= self.SPIKE_GAP_S:
                self.last_spike = now
                self.told.send("spike", loss=found["loss"], step=found.get("step"), median=median)
        if self.unit_key in found and self.baseline and self.told.wants("slow"):
            rate = self.rate.add(found[self.unit_key])
            if rate is None:
                return
            if not self.slow_sent and rate < self.SLOW * self.baseline:
                self.slow_sent = True
                self.told.send("slow", rate=rate, baseline=self.baseline, against=self.against,
                               unit=self.unit_key.replace("_", "/"), step=found.get("step"),
                               change_pct=round((rate - self.baseline) / self.baseline * 100))
            elif rate >= self.AGAIN * self.baseline:
                self.slow_sent = False
