"""A run killed by SIGKILL is blamed on the OOM killer only when the kernel log names its pid (real-looking
kmsg and dmesg lines; no OOM is triggered)."""

from __future__ import annotations

import os

from orchestrator.agent.run import causes
from orchestrator.records.end_reason import describe

KMSG = [
    "6,1201,88122334455,-;python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0",
    "6,1230,88122334501,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
    "task_memcg=/lxc/201/ns/user.slice,task=python3,pid=1234,uid=100000",
    "3,1231,88122334502,-;Out of memory: Killed process 1234 (python3) total-vm:9475624kB, anon-rss:7845120kB, "
    "file-rss:1024kB, shmem-rss:0kB, UID:100000 pgtables:15608kB oom_score_adj:0",
    "6,1232,88122334990,-;oom_reaper: reaped process 1234 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
]
DMESG = [
    "[712345.118822] Memory cgroup out of memory: Killed process 4321 (torchrun) total-vm:2206712kB, "
    "anon-rss:1034040kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:2152kB oom_score_adj:0",
    "[712399.000001] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=ns,mems_allowed=0,"
    "oom_memcg=/lxc/200,task_memcg=/lxc/200/ns,task=python3,pid=777,uid=0",
    "[712400.000002] Out of memory: Kill process 555 (java) score 905 or sacrifice child",  # older kernels
]


def test_the_parser_finds_the_pids_in_kmsg_records_and_dmesg_lines():
    assert causes.oom_killed(KMSG) == {1234: "python3"}
    assert causes.oom_killed(DMESG) == {4321: "torchrun", 777: "python3", 555: "java"}
    assert causes.oom_killed(["6,1,2,-;python3[1234]: segfault at 0", "Out of memory and no killable processes",
                              "oom-kill:task=x,pid=notanumber", ""]) == {}


def test_only_the_pid_the_kernel_named_is_blamed():
    assert causes.oom_cause(1234, "python3", KMSG) == "killed by the kernel's OOM killer"
    assert causes.oom_cause(1234, None, KMSG) == "killed by the kernel's OOM killer"
    assert causes.oom_cause(123, "python3", KMSG) is None  # not a prefix match: pid 123 is another process
    assert causes.oom_cause(12345, "python3", KMSG) is None
    assert causes.oom_cause(None, "python3", KMSG) is None
    assert causes.oom_cause(1234, "python3", []) is None  # a log we cannot read blames nobody
    # a container's pid 1234 is not the host's: the command name tells them apart
    assert causes.oom_cause(1234, "bash", KMSG) is None
    assert causes.oom_cause(1234, "python3", ["Out of memory: Killed process 1234"]) is not None  # no name logged


def test_status_words_for_an_oom_kill():
    run = {"state": "crashed", "exit_code": 137, "signal": 9, "cause": causes.oom_cause(777, "python3", DMESG)}
    assert describe(run) == "SIGKILL: killed by the kernel's OOM killer"


def test_the_command_name_is_the_one_the_kernel_logs():
    assert causes.comm(os.getpid()) == open(f"/proc/{os.getpid()}/comm").read().strip()
    assert causes.comm(1 << 30) is None


def test_only_the_real_kmsg_device_is_read(tmp_path):
    fake = tmp_path / "kmsg"
    fake.write_text("Out of memory: Killed process 1 (init)\n")
    assert not causes._is_kmsg(str(fake))  # a container's stand-in (a file, its console) is never read as kmsg
    assert not causes._is_kmsg(str(tmp_path / "missing"))
    assert all(isinstance(line, str) for line in causes.kernel_log(str(fake)))  # dmesg, or nothing
