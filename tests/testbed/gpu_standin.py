"""Put the ``nvidia-smi`` stand-in (tests/testbed/nvidia_smi.py) where a test needs GPUs.

``gpu_state`` builds a state file's content (H100s with fixed UUIDs, compute apps by GPU index);
``install_ct`` copies the script into a testbed CT as ``/usr/bin/nvidia-smi`` with its state at
``/etc/nvidia-standin.json``; ``install_local`` writes both into a folder for the local target and
returns the environment that puts it first on PATH.
"""

from __future__ import annotations

import json
from pathlib import Path

SCRIPT = Path(__file__).with_name("nvidia_smi.py")
CT_BINARY = "/usr/bin/nvidia-smi"
CT_STATE = "/etc/nvidia-standin.json"
H100 = "NVIDIA H100 80GB HBM3"


def gpu_uuid(seed: int, index: int) -> str:
    """A stable UUID in NVIDIA's form (``GPU-8hex-4hex-4hex-4hex-12hex``) for machine ``seed``'s GPU ``index``."""
    h = f"{seed:04x}{index:04x}"
    return f"GPU-{h}-1a2b-3c4d-5e6f-{seed:06x}{index:06x}"


def gpu_state(count: int, seed: int = 0, apps: dict[int, list[int]] | None = None, name: str = H100,
              driver: str = "550.127.05", cuda: str = "12.4", **extra) -> dict:
    """A state with ``count`` GPUs; ``apps`` maps a GPU index to pids using it (1024 MiB each)."""
    gpus = []
    for i in range(count):
        used = 1024 * len((apps or {}).get(i, []))
        gpus.append({"index": i, "uuid": gpu_uuid(seed, i), "name": name, "memory_total_mib": 81559,
                     "memory_used_mib": used, "utilization_gpu": 87 if used else 0,
                     "utilization_memory": 40 if used else 0, "temperature_gpu": 34 + i,
                     "power_draw_w": 312.5 if used else 70.12, "power_limit_w": 700,
                     "pci_bus_id": f"00000000:{0x18 + i * 0x10:02X}:00.0"})
    compute = [{"pid": pid, "gpu_uuid": gpu_uuid(seed, i), "process_name": "python3", "used_memory_mib": 1024}
               for i, pids in sorted((apps or {}).items()) for pid in pids]
    state = {"driver_version": driver, "cuda_version": cuda, "gpus": gpus, "compute_apps": compute}
    state.update(extra)
    return state


def install_ct(ct, state: dict | None) -> None:
    """The stand-in in CT ``ct`` (a tests.testbed.lxc.Container) with ``state`` (None: no state file,
    a driver that is not loaded)."""
    ct.attach("sh", "-c", f"cat > {CT_BINARY} && chmod 755 {CT_BINARY}", input=SCRIPT.read_bytes())
    set_ct_state(ct, state)


def set_ct_state(ct, state: dict | None) -> None:
    if state is None:
        ct.attach("rm", "-f", CT_STATE)
    else:
        ct.attach("sh", "-c", f"cat > {CT_STATE}", input=json.dumps(state).encode())


def remove_ct(ct) -> None:
    ct.attach("rm", "-f", CT_BINARY, CT_STATE)


def install_local(folder: Path, state: dict | None) -> dict[str, str]:
    """The stand-in as ``folder/bin/nvidia-smi`` with its state in ``folder``; the environment to use it."""
    import os

    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    binary = bin_dir / "nvidia-smi"
    binary.write_bytes(SCRIPT.read_bytes())
    binary.chmod(0o755)
    state_file = folder / "nvidia-standin.json"
    if state is None:
        state_file.unlink(missing_ok=True)
    else:
        state_file.write_text(json.dumps(state))
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "NVIDIA_STANDIN_STATE": str(state_file)}


def passthrough_lines(count: int) -> list[str]:
    """The LXC config lines that pass ``count`` NVIDIA GPUs through (the form PVE's wiki gives)."""
    lines = ["lxc.cgroup2.devices.allow = c 195:* rwm", "lxc.cgroup2.devices.allow = c 508:* rwm"]
    for node in [f"nvidia{i}" for i in range(count)] + ["nvidiactl", "nvidia-uvm"]:
        lines.append(f"lxc.mount.entry = /dev/{node} dev/{node} none bind,optional,create=file")
    return lines


DEVICE_NUMBERS = {"nvidiactl": (195, 255), "nvidia-uvm": (508, 0)}


class Passthrough:
    """GPU passthrough lines in testbed CTs' configs (what the API stand-in reports as their pct.conf) for
    the length of a ``with``; the configs are put back as they were after it.

    Each CT is restarted so that LXC applies the rules (as PVE does at start; the testbed's host keeps the
    device controller on cgroup v1, so each rule is given in its v1 form too, which the API view shows as
    well), and the device nodes the bind mounts would bring are made with ``mknod``."""

    def __init__(self, *cts: tuple) -> None:  # (Container, GPU count), ...
        self.cts, self.saved = cts, {}

    def __enter__(self) -> "Passthrough":
        for ct, count in self.cts:
            path = ct.dir / "config"
            self.saved[path] = path.read_text()
            lines = passthrough_lines(count)
            lines += [line.replace("lxc.cgroup2.", "lxc.cgroup.") for line in lines if line.startswith("lxc.cgroup2.")]
            path.write_text(self.saved[path].rstrip("\n") + "\n" + "\n".join(lines) + "\n")
            ct.stop()
            ct.start()
            for name in [f"nvidia{i}" for i in range(count)] + ["nvidiactl", "nvidia-uvm"]:
                major, minor = DEVICE_NUMBERS.get(name, (195, int(name[6:] or 0) if name[6:].isdigit() else 0))
                ct.attach("sh", "-c", 'rm -f "$1" && mknod -m 666 "$1" c "$2" "$3"', "sh", f"/dev/{name}",
                          str(major), str(minor))
        return self

    def __exit__(self, *exc) -> None:
        for path, text in self.saved.items():
            path.write_text(text)
