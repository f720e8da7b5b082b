"""Comparing experiments: what differs in their settings (batching first), and how they ran."""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from ..records.experiments import Experiment, Registry, command_line


def _flat(prefix: str, value: Any, out: dict) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def _fields(exp: Experiment) -> dict:
    from ..config import recorded_as_now

    fields: dict = {}
    _flat("batching", exp.batching, fields)
    fields.update({"revision": exp.revision, "command": command_line(exp.command), "target": exp.target,
                   "git_commit": exp.git_commit, "parent": exp.parent, "secrets": ", ".join(exp.secret_names)})
    project = exp.config.get("project") or {}
    _flat("env", project.get("env") or {}, fields)
    for key in ("sources", "follow_symlinks", "name", "total_steps"):  # what else makes a revision or a run
        if key in project:
            fields[f"project.{key}"] = ", ".join(map(str, project[key])) if isinstance(project[key], list) \
                else project[key]
    if exp.env:  # the run's Python environment ([env]); its packages are compared on their own
        fields["python env"] = exp.env.get("hash")
    rest: dict = {}
    config = recorded_as_now(exp.config)  # an experiment from before a key was renamed compares under its new name
    _flat("", {k: v for k, v in config.items() if k not in ("batching", "targets", "project")}, rest)
    fields.update({f"config.{k}": v for k, v in rest.items()})
    return fields


def package_changes(before: dict, after: dict) -> list[str]:
    """``torch 2.4.0 → 2.5.1``, ``+ attrs 23.2.0``, ``- six 1.16.0``: how two installed sets differ."""
    low = {k.lower(): (k, v) for k, v in before.items()}
    high = {k.lower(): (k, v) for k, v in after.items()}
    out = []
    for key in sorted(set(low) | set(high)):
        if key in low and key in high:
            if low[key][1] != high[key][1]:
                out.append(f"{high[key][0]} {low[key][1]} → {high[key][1]}")
        elif key in high:
            out.append(f"+ {high[key][0]} {high[key][1]}")
        else:
            out.append(f"- {low[key][0]} {low[key][1]}")
    return out


def _packages(exps: list[Experiment]) -> tuple[list[dict], list[dict]]:
    """The packages whose versions differ (one row each), and each later experiment's changes against the first."""
    sets = [{k.lower(): (k, v) for k, v in ((e.env or {}).get("packages") or {}).items()} for e in exps]
    if not any(e.env for e in exps):
        return [], []
    rows = []
    for key in sorted(set().union(*sets)):
        values = [s[key][1] if key in s else None for s in sets]
        if any(v != values[0] for v in values[1:]):
            name = next(s[key][0] for s in sets if key in s)
            rows.append({"key": f"package {name}", "values": [_fmt(v) for v in values]})
    first = (exps[0].env or {}).get("packages") or {}
    changes = [{"id": e.id, "against": exps[0].id, "changes": package_changes(first, (e.env or {}).get("packages") or {})}
               for e in exps[1:]]
    return rows, [c for c in changes if c["changes"]]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _whole(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _throughput(summary: dict, first: dict, first_id: int) -> str:
    """``11.9 Ktok/s, +5% vs exp 3``, or in steps/s when the log gave no token rate; compared with the first
    experiment only in the same unit."""
    from .metrics import throughput_change

    for key, unit in (("median_tok_s", "tok/s"), ("median_steps_s", "steps/s"), ("median_samples_s", "samples/s")):
        if summary.get(key):
            return throughput_change(summary[key], first.get(key), f"exp {first_id}", unit)
    return "-"


def _every_metric(summaries: list[dict]) -> dict[str, list[str]]:
    """One row per metric any of the experiments' logs gave (its last value), training metrics first, then the
    evaluations' (``val_*``, ``test_*``), then the summaries' (``summary_*``)."""
    names = set().union(*((s.get("metrics") or {}) for s in summaries))

    def order(name: str) -> tuple[int, str]:
        return (2 if name.startswith("summary_") else 1 if name.startswith(("val_", "test_")) else 0, name)

    return {f"last {name}": [_fmt((s.get("metrics") or {}).get(name)) for s in summaries]
            for name in sorted(names, key=order)}


def compare(registry: Registry, ids: list[int]) -> dict:
    """The settings that differ (batching keys first) and the stored metrics, side by side.

    Throughputs after the first are shown with their change against the first experiment.
    """
    if len(ids) < 2:
        raise InputError("compare needs at least two experiment ids", hint="e.g. orch experiments compare 3 4")
    exps = [registry.get(i) for i in ids]
    flats = [_fields(e) for e in exps]
    keys = sorted(set().union(*flats), key=lambda k: (not k.startswith("batching."), k))
    diff = []
    for k in keys:
        values = [f.get(k) for f in flats]
        if any(v != values[0] for v in values[1:]):
            diff.append({"key": k, "values": [_fmt(v) for v in values]})
    rows_, changes = _packages(exps)
    diff += rows_
    from .metrics import Series, format_duration, sparkline

    from . import gpu_use

    rows: dict[str, list] = {m: [] for m in ("status", "step", "epoch", "median throughput", "final loss",
                                             "final eval loss",
                                             "min loss", "spikes",
                                             "duration", "loss trend", "throughput trend", "planned efficiency",
                                             "gpus", "gpu util", "gpu memory peak", "gpu util trend")}
    raw = []
    first = (registry.metrics(exps[0].id) or {"summary": {}})["summary"]
    for e in exps:
        m = registry.metrics(e.id) or {"summary": {}, "series": {}}
        s = m["summary"]
        raw.append({"id": e.id, "status": e.status, "exit_code": e.exit_code,
                    **{k: v for k, v in s.items() if k not in ("_state", "throughput", "throughput_vs")}})
        rows["status"].append(f"{e.status}" + (f" ({e.exit_code})" if e.exit_code not in (None, 0) else ""))
        # how far each run got: runs compared at different steps are not alike
        total = s.get("total_steps")
        rows["step"].append(_fmt(_whole(s.get("step"))) + (f" of {_fmt(_whole(total))}" if total else ""))
        rows["epoch"].append(_fmt(_whole((s.get("_state") or {}).get("epoch"))))
        rows["median throughput"].append(_throughput(s, first if e.id != exps[0].id else {}, exps[0].id))
        rows["final loss"].append(_fmt(s.get("loss")))
        rows["min loss"].append(_fmt(s.get("min_loss")))
        rows["spikes"].append(_fmt(s.get("spikes")))
        dur = (e.ended or 0) - (e.started or 0) if e.ended and e.started else None
        rows["duration"].append(format_duration(dur))
        loss = Series.from_dict(m["series"]["loss"]).values() if "loss" in m["series"] else []
        rows["loss trend"].append(sparkline(loss, 24) or "-")
        rate_series = "tok_s" if "tok_s" in m["series"] else "steps_s"
        tok = Series.from_dict(m["series"][rate_series]).values() if rate_series in m["series"] else []
        rows["throughput trend"].append(sparkline(tok, 24) or "-")
        eval_key = s.get("eval_metric") or "val_loss"
        rows["final eval loss"].append(_fmt(s.get("eval_loss")) + (f" ({eval_key})" if s.get("eval_loss") is not None
                                                                    and eval_key != "val_loss" else ""))
        plan = e.batching_plan or {}
        rows["planned efficiency"].append(_fmt(plan.get("efficiency")))
        use = gpu_use.summary(e.gpu_series)
        rows["gpus"].append(",".join(str(g["index"]) for g in e.gpus) if e.gpus else "-")
        rows["gpu util"].append("-" if use["util_mean"] is None else f"{use['util_mean']:.0f}%")
        rows["gpu memory peak"].append("-" if use["mem_peak_mib"] is None else f"{use['mem_peak_mib']:.0f} MiB")
        rows["gpu util trend"].append(sparkline(use["util"], 24) or "-")
    rows.update(_every_metric([(registry.metrics(e.id) or {}).get("summary", {}) for e in exps]))
    return {"ids": ids, "diff": diff, "packages": changes, "metrics": [{"metric": k, "values": v} for k, v in rows.items()],
            "experiments": raw}
