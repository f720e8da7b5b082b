#!/usr/bin/env python3
"""A stand-in for NVIDIA's ``nvidia-smi``, for machines without NVIDIA GPUs.

It prints what the real tool prints for the queries orch and its tests make, from a JSON state file
(``$NVIDIA_STANDIN_STATE``, default ``/etc/nvidia-standin.json``)::

    {"driver_version": "550.127.05", "cuda_version": "12.4",
     "library_version": "550.127.05",        # the user-space NVML; differs from the driver: a mismatch
     "mismatch": false,                       # forces "Driver/library version mismatch" (exit 18)
     "driver": true,                          # false: "couldn't communicate with the NVIDIA driver" (exit 9)
     "delay_s": 0,                            # sleep before answering (a hung driver)
     "gpus": [{"index": 0, "uuid": "GPU-…", "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
               "memory_used_mib": 0, "utilization_gpu": 0, "utilization_memory": 0, "temperature_gpu": 34,
               "power_draw_w": 70.12, "power_limit_w": 700, "pci_bus_id": "00000000:18:00.0"}],
     "compute_apps": [{"pid": 4411, "gpu_uuid": "GPU-…", "process_name": "python", "used_memory_mib": 1024}]}

A missing state file is a machine whose driver is not loaded. A value of ``null`` prints as ``[N/A]``,
as the real tool does for what a board does not report. Supported: ``-L``, ``--query-gpu=FIELDS``,
``--query-compute-apps=FIELDS``, ``--format=csv[,noheader][,nounits]``, ``-i/--id=INDEX[,INDEX]|UUID``,
``--version`` and the default table. Exit codes follow nvidia-smi(1): 2 invalid argument, 6 no device
found, 9 driver not loaded, 18 driver/library version mismatch (NVML_ERROR_LIB_RM_VERSION_MISMATCH).

Standard library only: it is copied alone into test containers as ``/usr/bin/nvidia-smi``.
"""

from __future__ import annotations

import json
import os
import sys
import time

STATE_ENV = "NVIDIA_STANDIN_STATE"
DEFAULT_STATE = "/etc/nvidia-standin.json"

EXIT_INVALID_ARGUMENT = 2
EXIT_NOT_FOUND = 6
EXIT_DRIVER_NOT_LOADED = 9
EXIT_VERSION_MISMATCH = 18

NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.\n")
NA = "[N/A]"

# --query-gpu fields: canonical name -> (aliases, unit, how to read it from a GPU's state).
GPU_FIELDS: dict[str, tuple[tuple[str, ...], str | None, str]] = {
    "timestamp": ((), None, "@timestamp"),
    "driver_version": ((), None, "@driver_version"),
    "count": ((), None, "@count"),
    "name": (("gpu_name",), None, "name"),
    "serial": (("gpu_serial",), None, "serial"),
    "uuid": (("gpu_uuid",), None, "uuid"),
    "pci.bus_id": (("gpu_bus_id",), None, "pci_bus_id"),
    "index": ((), None, "index"),
    "persistence_mode": ((), None, "persistence_mode"),
    "compute_mode": ((), None, "compute_mode"),
    "pstate": ((), None, "pstate"),
    "fan.speed": ((), "%", "fan_speed"),
    "memory.total": ((), "MiB", "memory_total_mib"),
    "memory.reserved": ((), "MiB", "memory_reserved_mib"),
    "memory.used": ((), "MiB", "memory_used_mib"),
    "memory.free": ((), "MiB", "@memory_free"),
    "utilization.gpu": ((), "%", "utilization_gpu"),
    "utilization.memory": ((), "%", "utilization_memory"),
    "temperature.gpu": ((), None, "temperature_gpu"),
    "temperature.memory": ((), None, "temperature_memory"),
    "power.draw": ((), "W", "power_draw_w"),
    "power.limit": ((), "W", "power_limit_w"),
    "clocks.current.sm": (("clocks.sm",), "MHz", "clocks_sm_mhz"),
    "mig.mode.current": ((), None, "mig_mode"),
    "vbios_version": ((), None, "vbios_version"),
}
APP_FIELDS: dict[str, tuple[tuple[str, ...], str | None, str]] = {
    "timestamp": ((), None, "@timestamp"),
    "gpu_name": ((), None, "@gpu_name"),
    "gpu_bus_id": ((), None, "@gpu_bus_id"),
    "gpu_serial": ((), None, "@gpu_serial"),
    "gpu_uuid": ((), None, "@gpu_uuid"),
    "pid": ((), None, "pid"),
    "process_name": (("name",), None, "process_name"),
    "used_gpu_memory": (("used_memory",), "MiB", "used_memory_mib"),
}
DEFAULTS = {"persistence_mode": "Enabled", "compute_mode": "Default", "pstate": "P0", "fan_speed": None,
            "memory_reserved_mib": 0, "temperature_memory": None, "clocks_sm_mhz": None, "mig_mode": "Disabled",
            "vbios_version": "96.00.89.00.01", "serial": None}


class Usage(Exception):
    """A bad command line: the message, exit 2."""


def load_state(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def _resolve(name: str, fields: dict) -> str | None:
    for canonical, (aliases, _unit, _src) in fields.items():
        if name == canonical or name in aliases:
            return canonical
    return None


def _number(value: object, unit: str | None) -> str:
    if unit == "W" and isinstance(value, (int, float)):
        return f"{float(value):.2f}"
    return str(value)


def _cell(value: object, unit: str | None, units: bool) -> str:
    if value is None:
        return NA
    if isinstance(value, str) and value.startswith("["):
        return value
    text = _number(value, unit)
    return f"{text} {unit}" if unit and units else text


def _gpu_value(src: str, gpu: dict, state: dict) -> object:
    if src == "@timestamp":
        return time.strftime("%Y/%m/%d %H:%M:%S.000")
    if src == "@driver_version":
        return state.get("driver_version")
    if src == "@count":
        return len(state.get("gpus") or [])
    if src == "@memory_free":
        total, used = gpu.get("memory_total_mib"), gpu.get("memory_used_mib")
        if total is None or used is None:
            return None
        return total - used - (gpu.get("memory_reserved_mib") or 0)
    if src in gpu:
        return gpu[src]
    return DEFAULTS.get(src)


def _app_value(src: str, app: dict, gpu: dict) -> object:
    if src == "@timestamp":
        return time.strftime("%Y/%m/%d %H:%M:%S.000")
    if src.startswith("@gpu_"):
        return gpu.get({"@gpu_name": "name", "@gpu_bus_id": "pci_bus_id", "@gpu_serial": "serial",
                        "@gpu_uuid": "uuid"}[src])
    return app.get(src)


def _fields(spec: str, table: dict) -> list[str]:
    out = []
    for raw in spec.split(","):
        name = raw.strip()
        canonical = _resolve(name, table)
        if canonical is None:
            raise Usage(f'Field "{name}" is not a valid field to query.\n\n')
        out.append(canonical)
    return out


def _csv(rows: list[list[str]], header: list[str], flags: set[str]) -> str:
    lines = [] if "noheader" in flags else [", ".join(header)]
    lines += [", ".join(r) for r in rows]
    return "".join(line + "\n" for line in lines)


def _header(fields: list[str], table: dict, units: bool) -> list[str]:
    names = []
    for f in fields:
        unit = table[f][1]
        names.append(f"{f} [{unit}]" if unit and units else f)
    return names


def _selected(state: dict, ids: str | None) -> list[dict]:
    gpus = sorted(state.get("gpus") or [], key=lambda g: int(g.get("index", 0)))
    if ids is None:
        return gpus
    chosen = []
    for want in ids.split(","):
        want = want.strip()
        match = [g for g in gpus if str(g.get("index")) == want or g.get("uuid") == want
                 or str(g.get("pci_bus_id", "")).lower() == want.lower()]
        if not match:
            return []
        chosen += match
    return chosen


def _parse(argv: list[str]) -> dict:
    opts: dict = {}
    names = {"--query-gpu": "query_gpu", "--query-compute-apps": "query_apps", "--format": "format",
             "-i": "id", "--id": "id"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if key in names:
            if not eq:
                i += 1
                if i >= len(argv):
                    raise Usage(f'Option "{key}" requires an argument.\n')
                value = argv[i]
            opts[names[key]] = value
        elif arg in ("-L", "--list-gpus"):
            opts["list"] = True
        elif arg == "--version":
            opts["version"] = True
        elif arg in ("-h", "--help"):
            opts["help"] = True
        else:
            raise Usage(f"Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
        i += 1
    return opts


def _format_flags(opts: dict) -> set[str]:
    spec = opts.get("format")
    if spec is None:
        raise Usage('"--format" is missing. Please run \'nvidia-smi -h\' for help.\n')
    parts = {p.strip() for p in spec.split(",")}
    if "csv" not in parts or parts - {"csv", "noheader", "nounits"}:
        raise Usage(f'"{spec}" is not a valid format. Please run \'nvidia-smi -h\' for help.\n')
    return parts


def _short(version: str | None) -> str:
    return ".".join(str(version or "").split(".")[:2])


def _table(state: dict, gpus: list[dict]) -> str:
    width = 89
    rule = "+" + "-" * (width - 2) + "+"
    drv, cuda = state.get("driver_version", NA), state.get("cuda_version", NA)
    head = f"| NVIDIA-SMI {drv:<22} Driver Version: {drv:<15} CUDA Version: {cuda:<9}"
    lines = [time.strftime("%a %b %d %H:%M:%S %Y"), rule, head.ljust(width - 1) + "|",
             "|" + "-" * 41 + "+" + "-" * 22 + "+" + "-" * 22 + "+"]
    for g in gpus:
        mem = f"{g.get('memory_used_mib', 0)}MiB / {g.get('memory_total_mib', 0)}MiB"
        draw, limit = (_number(g.get(k, 0), "W").split(".")[0] for k in ("power_draw_w", "power_limit_w"))
        power = f"{draw}W / {limit}W"
        lines.append(f"| {g.get('index', 0):>3}  {str(g.get('name', ''))[:30]:<30}  On | "
                     f"{str(g.get('pci_bus_id', '')):<16} Off | {'0':>20} |")
        lines.append(f"| N/A  {str(g.get('temperature_gpu', 0)) + 'C':>4}  P0  {power:>22} | {mem:>20} | "
                     f"{str(g.get('utilization_gpu', 0)) + '%':>8}      Default |")
        lines.append("+" + "-" * 41 + "+" + "-" * 22 + "+" + "-" * 22 + "+")
    lines += ["", rule, "| Processes:".ljust(width - 1) + "|",
              "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
              "|        ID   ID                                                               Usage      |",
              "|" + "=" * (width - 2) + "|"]
    by_uuid = {g.get("uuid"): g for g in gpus}
    apps = [a for a in state.get("compute_apps") or [] if a.get("gpu_uuid") in by_uuid]
    if not apps:
        lines.append("|  No running processes found".ljust(width - 1) + "|")
    for a in apps:
        gpu = by_uuid[a["gpu_uuid"]]
        lines.append(f"|  {gpu.get('index', 0):>3}   N/A  N/A  {a.get('pid', 0):>9}      C   "
                     f"{str(a.get('process_name', ''))[:40]:<40} {str(a.get('used_memory_mib', 0)) + 'MiB':>9} |")
    lines.append(rule)
    return "\n".join(lines) + "\n"


def run(argv: list[str], state: dict | None) -> tuple[int, str]:
    """The output and exit code of ``nvidia-smi ARGV`` on a machine in ``state``."""
    try:
        opts = _parse(argv)
    except Usage as exc:
        return EXIT_INVALID_ARGUMENT, str(exc)
    if opts.get("help"):
        return 0, "NVIDIA System Management Interface -- stand-in for tests.\n"
    if state is None or state.get("driver") is False:
        return EXIT_DRIVER_NOT_LOADED, NO_DRIVER
    if state.get("delay_s"):
        time.sleep(float(state["delay_s"]))
    library = state.get("library_version") or state.get("driver_version")
    if state.get("mismatch") or (library and library != state.get("driver_version")):
        return EXIT_VERSION_MISMATCH, ("Failed to initialize NVML: Driver/library version mismatch\n"
                                       f"NVML library version: {_short(library)}\n")
    if opts.get("version"):
        return 0, (f"NVIDIA-SMI version  : {state.get('driver_version')}\n"
                   f"NVML version        : {_short(state.get('driver_version'))}\n"
                   f"DRIVER version      : {state.get('driver_version')}\n"
                   f"CUDA Version        : {state.get('cuda_version')}\n")
    gpus = _selected(state, opts.get("id"))
    if not gpus:
        return EXIT_NOT_FOUND, "No devices were found\n"
    try:
        if "query_gpu" in opts:
            fields = _fields(opts["query_gpu"], GPU_FIELDS)
            flags = _format_flags(opts)
            units = "nounits" not in flags
            rows = [[_cell(_gpu_value(GPU_FIELDS[f][2], g, state), GPU_FIELDS[f][1], units) for f in fields]
                    for g in gpus]
            return 0, _csv(rows, _header(fields, GPU_FIELDS, units), flags)
        if "query_apps" in opts:
            fields = _fields(opts["query_apps"], APP_FIELDS)
            flags = _format_flags(opts)
            units = "nounits" not in flags
            by_uuid = {g.get("uuid"): g for g in gpus}
            rows = [[_cell(_app_value(APP_FIELDS[f][2], a, by_uuid[a.get("gpu_uuid")]), APP_FIELDS[f][1], units)
                     for f in fields]
                    for a in state.get("compute_apps") or [] if a.get("gpu_uuid") in by_uuid]
            return 0, _csv(rows, _header(fields, APP_FIELDS, units), flags)
    except Usage as exc:
        return EXIT_INVALID_ARGUMENT, str(exc)
    if opts.get("list"):
        return 0, "".join(f"GPU {g.get('index')}: {g.get('name')} (UUID: {g.get('uuid')})\n" for g in gpus)
    return 0, _table(state, gpus)


def main() -> int:
    code, out = run(sys.argv[1:], load_state(os.environ.get(STATE_ENV, DEFAULT_STATE)))
    sys.stdout.write(out)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
