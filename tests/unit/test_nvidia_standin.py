"""The nvidia-smi stand-in prints what NVIDIA's nvidia-smi prints, for the queries orch makes.

The expected texts are in the form of real nvidia-smi output (driver 5xx): ``-L`` lines, csv with
``, `` separators and ``[unit]`` headers, ``[N/A]`` for what a board does not report, the empty
compute-apps table as a bare header, and the exit codes of nvidia-smi(1) and NVML.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.testbed import gpu_standin
from tests.testbed.gpu_standin import SCRIPT, gpu_state, gpu_uuid


def smi(tmp_path, state, *argv):
    env = {"PATH": "/usr/bin:/bin"}
    if state is not None:
        (tmp_path / "state.json").write_text(json.dumps(state))
    env["NVIDIA_STANDIN_STATE"] = str(tmp_path / "state.json")
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env, timeout=30)
    return proc.returncode, proc.stdout


def test_list_gpus(tmp_path):
    code, out = smi(tmp_path, gpu_state(2, seed=7), "-L")
    assert code == 0
    assert out == (f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {gpu_uuid(7, 0)})\n"
                   f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {gpu_uuid(7, 1)})\n")


def test_uuid_form():
    import re

    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", gpu_uuid(200, 3))


def test_query_gpu_csv_with_units(tmp_path):
    state = gpu_state(1, apps={0: [4411]})
    code, out = smi(tmp_path, state, "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,"
                    "temperature.gpu,power.draw,power.limit,pci.bus_id,fan.speed", "--format=csv")
    assert code == 0
    assert out.splitlines() == [
        "index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], temperature.gpu, "
        "power.draw [W], power.limit [W], pci.bus_id, fan.speed [%]",
        "0, NVIDIA H100 80GB HBM3, 1024 MiB, 81559 MiB, 87 %, 34, 312.50 W, 700.00 W, 00000000:18:00.0, [N/A]",
    ]


def test_query_gpu_noheader_nounits_and_id(tmp_path):
    code, out = smi(tmp_path, gpu_state(3), "--query-gpu=index,uuid,memory.free,power.draw",
                    "--format=csv,noheader,nounits", "-i", "1")
    assert code == 0
    assert out == f"1, {gpu_uuid(0, 1)}, 81559, 70.12\n"


def test_aliases_print_the_canonical_header(tmp_path):
    code, out = smi(tmp_path, gpu_state(1), "--query-gpu=gpu_name,gpu_bus_id,driver_version,count",
                    "--format=csv")
    assert out.splitlines() == ["name, pci.bus_id, driver_version, count",
                                "NVIDIA H100 80GB HBM3, 00000000:18:00.0, 550.127.05, 1"]


def test_compute_apps(tmp_path):
    state = gpu_state(2, apps={1: [4411, 4412]})
    code, out = smi(tmp_path, state, "--query-compute-apps=pid,gpu_uuid,process_name,used_memory", "--format=csv")
    assert code == 0
    assert out.splitlines() == ["pid, gpu_uuid, process_name, used_gpu_memory [MiB]",
                                f"4411, {gpu_uuid(0, 1)}, python3, 1024 MiB",
                                f"4412, {gpu_uuid(0, 1)}, python3, 1024 MiB"]


def test_no_compute_apps_is_a_bare_header(tmp_path):
    code, out = smi(tmp_path, gpu_state(2), "--query-compute-apps=pid,used_memory", "--format=csv")
    assert (code, out) == (0, "pid, used_gpu_memory [MiB]\n")
    code, out = smi(tmp_path, gpu_state(2), "--query-compute-apps=pid,used_memory", "--format=csv,noheader")
    assert (code, out) == (0, "")


def test_driver_library_mismatch(tmp_path):
    state = gpu_state(1, driver="550.127.05", library_version="550.144.03")
    code, out = smi(tmp_path, state, "-L")
    assert code == 18
    assert out == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.144\n"
    code, _ = smi(tmp_path, gpu_state(1, mismatch=True), "--query-gpu=name", "--format=csv")
    assert code == 18


def test_driver_not_loaded(tmp_path):
    code, out = smi(tmp_path, None, "-L")
    assert code == 9
    assert out.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    code, _ = smi(tmp_path, {"driver": False}, "-L")
    assert code == 9


def test_no_devices_and_bad_id(tmp_path):
    assert smi(tmp_path, gpu_state(0), "-L") == (6, "No devices were found\n")
    assert smi(tmp_path, gpu_state(2), "-L", "-i", "5") == (6, "No devices were found\n")


def test_bad_field_and_format(tmp_path):
    code, out = smi(tmp_path, gpu_state(1), "--query-gpu=index,bogus", "--format=csv")
    assert code == 2
    assert out.startswith('Field "bogus" is not a valid field to query.')
    code, _ = smi(tmp_path, gpu_state(1), "--query-gpu=index", "--format=json")
    assert code == 2
    code, _ = smi(tmp_path, gpu_state(1), "--frobnicate")
    assert code == 2


def test_default_table_and_version(tmp_path):
    code, out = smi(tmp_path, gpu_state(1, apps={0: [4411]}))
    assert code == 0
    assert "Driver Version: 550.127.05" in out and "CUDA Version: 12.4" in out
    assert "4411" in out and "python3" in out
    code, out = smi(tmp_path, gpu_state(1), "--version")
    assert "DRIVER version      : 550.127.05" in out


def test_install_local_puts_it_first_on_path(tmp_path):
    env = gpu_standin.install_local(tmp_path, gpu_state(1))
    proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0 and proc.stdout.startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
