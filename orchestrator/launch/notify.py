"""``[notify]`` as a run's supervisor takes it, and ``orch notify test``.

The target sends the notifications (``agent/watch/notify.py``); the controller only resolves the webhook URL (the
``url`` key, or the secret ``url_secret`` names) and says who the run is, so each message can name the
experiment, project, CT and node. The URL travels in the agent's stdin, never in a record, like a secret.
"""

from __future__ import annotations

from .. import secrets
from ..config import Settings
from ..errors import InputError, OrchError
from ..reach.targets import Target


def url(settings: Settings) -> str | None:
    """The webhook URL, or None when ``[notify]`` is not set; an ``InputError`` when its secret is missing."""
    section = settings.notify
    if section.url is not None:
        return section.url
    if section.url_secret is None:
        return None
    from ..agent.watch.notify import url_fault

    value = secrets.collect([section.url_secret], settings.state_dir)[section.url_secret]
    fault = url_fault(value)
    if fault:
        raise InputError(f"the secret {section.url_secret} named by [notify] url_secret {fault}",
                         hint=f"set {section.url_secret} to the webhook's URL (https://…)")
    return value


def context(settings: Settings, target: Target, exp_id: int | None) -> dict:
    """Who the run is, as each message names it."""
    return {"experiment": exp_id, "project": settings.project.name, "target": target.label,
            "ct": target.spec.ct if target.spec.kind == "proxmox" else None,
            "node": target.info.get("node") if target.spec.kind == "proxmox" else target.spec.host}


def spec(settings: Settings, target: Target, exp_id: int | None, parent: int | None = None) -> dict | None:
    """The ``notify`` argument of the agent's ``run_start`` (None: nothing is sent)."""
    address = url(settings)
    if address is None:
        return None
    about = context(settings, target, exp_id)
    if "slow" in settings.notify.on and exp_id is not None:
        found = baseline(settings, target, exp_id, parent)
        if found:
            about["baseline"] = found
    return {"url": address, "format": settings.notify.format, "on": list(settings.notify.on), "context": about}


def baseline(settings: Settings, target: Target, exp_id: int, parent: int | None) -> dict | None:
    """The throughput a ``slow`` run is measured against, as ``orch status`` compares it: the parent's median,
    else that of the latest earlier experiment on this machine whose metrics were read."""
    from ..records.experiments import Registry

    path = settings.state_dir / "experiments.db"
    if not path.exists():
        return None
    with Registry(path) as reg:
        ids = [parent] if parent else []
        ids += [e.id for e in reg.list(machine=target.machine, limit=10) if e.id < exp_id and e.id != parent]
        for cand in ids:
            summary = (reg.metrics(cand) or {}).get("summary") or {}
            for key, unit in (("median_tok_s", "tok_s"), ("median_steps_s", "steps_s")):
                if summary.get(key):
                    return {"experiment": cand, unit: float(summary[key])}
    return None


def check(settings: Settings) -> None:
    """Before a launch changes anything: the URL can be had."""
    url(settings)


def test(settings: Settings, target: Target) -> dict:
    """One test notification posted from the target: ``{"ok", "status", "tries", "error", "format"}``."""
    from ..reach.agent_client import Op
    from ..records.reconcile import client_for

    if not settings.notify.enabled:
        raise InputError("[notify] sets no webhook", hint='add [notify] url = "https://…" (or url_secret = "NAME" '
                                                          "naming a secret) to orch.toml")
    args = spec(settings, target, None)
    assert args is not None
    client = client_for(settings, target)
    try:
        result = client.call([Op("notify_test", {"notify": args})], what="notify test")[0]
    except OrchError as exc:  # whatever the agent said, the URL is not shown
        exc.message = _redact(exc.message, args["url"])
        exc.args = (exc.message,)
        exc.detail = _redact(exc.detail, args["url"]) if exc.detail else exc.detail
        raise
    finally:
        client.transport.close()
    return {**result, "format": args["format"], "target": target.label}


def _redact(text: str, address: str) -> str:
    from ..agent.watch.notify import redact

    return redact(text, address)
