"""``orch doctor``'s questions: one agent call on the target (``doctor``) and, for a CT reached through its
node, the node's ``nvidia-smi``; ``doctor_checks.judge`` turns the answers into findings.

The deploy preflight asks the same (without torch) inside its probe call: ``agent_op`` is that call's op and
``findings`` judges its answer, so a deploy pays only the node's command on top.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import OrchError, TransportError
from ..reach.agent_client import AgentClient, Op
from .doctor_checks import Facts, Finding, judge, passed_devices

if TYPE_CHECKING:
    from ..config import Settings
    from ..reach.targets import Target
    from ..reach.transport.base import Transport

NODE_SMI = ["nvidia-smi", "--query-gpu=index,driver_version", "--format=csv,noheader,nounits"]
NODE_TIMEOUT = 20.0


def _ct(target: Target) -> dict | None:
    info = target.info
    if info.get("ct") is None:
        return None
    return {"vmid": info.get("ct"), "node": info.get("node"), "config": info.get("ct_config") or {}}


def agent_op(target: Target, torch: bool = False) -> Op:
    """The target's half: its device nodes (those the CT passes and any /dev/nvidia*), nvidia-smi, NVML,
    /dev/shm, space, python, tmux, its clock and, with ``torch``, what torch sees."""
    ct = _ct(target)
    devices = [p.path for p in passed_devices(ct["config"])] if ct else []
    return Op("doctor", {"devices": devices, "checkpoints": target.checkpoints, "torch": torch})


def ask_node(transport: Transport, target: Target) -> tuple[dict | None, str | None]:
    """The node's ``nvidia-smi`` answer for a CT reached with ``pct`` whose config passes GPUs (else None),
    and why the node could not be asked."""
    ct = _ct(target)
    node = getattr(transport, "node", None)  # a PctTransport's own connection to the CT's node
    if ct is None or not passed_devices(ct["config"]):
        return None, None
    if node is None:
        return None, f"CT {ct['vmid']} is reached over SSH, not through node {ct['node']} (access = \"pct\")"
    try:
        got = node.run(NODE_SMI, timeout=NODE_TIMEOUT)
    except TransportError as exc:
        return None, exc.message
    stdout, stderr = (got.stdout or b"").decode("utf-8", "replace"), (got.stderr or b"").decode("utf-8", "replace")
    if got.exit_code == 127 or "not found" in stderr and got.exit_code != 0 and not stdout:
        return {"found": False}, None
    return node_report(got.exit_code, stdout, stderr), None


def node_report(code: int, stdout: str, stderr: str) -> dict:
    """The node's answer in the shape of the agent's ``system.gpu_report`` (its parser, one for both)."""
    from ..agent.machine.system import parse_csv

    if code != 0:
        text = (stdout + stderr).strip()
        return {"found": True, "error": text.splitlines()[0] if text else f"nvidia-smi exited {code}",
                "exit_code": code, "detail": text[-1000:], "driver_version": None, "gpus": []}
    rows = parse_csv(stdout, ("index", "driver_version"))
    return {"found": True, "error": None, "exit_code": 0, "gpus": rows,
            "driver_version": rows[0]["driver_version"] if rows else None}


def findings(target: Target, answer: dict, node: tuple[dict | None, str | None], sent: float, received: float,
             *, min_free_mb: int = 50, torch: bool = False) -> list[Finding]:
    slurm = target.spec.kind == "slurm"
    if slurm:  # the agent answers from the login node: the GPUs (and what drives them) are the compute nodes'
        answer = dict(answer, devices=[], nvidia_smi={"found": False}, nvml_libraries=[], kernel_module=None)
    facts = Facts(agent=answer, ct=_ct(target), node_smi=node[0], node_error=node[1], sent=sent,
                  received=received, min_free_mb=min_free_mb, torch_asked=torch)
    found = judge(facts)
    return [f for f in found if f.check != "tmux"] if slurm else found  # Slurm runs the job, not tmux


def examine(settings: Settings, target: Target, *, torch: bool = True) -> dict:
    """``orch doctor``: every check on ``target``; ``{"target", "findings", "status"}``."""
    from .doctor_checks import worst

    assert target.connect is not None
    transport = target.connect()
    try:
        client = AgentClient(transport, target.root, target.python, timeout=settings.ssh.command_timeout)
        sent = time.time()
        op = agent_op(target, torch)
        answer = client.one(op.name, **op.args)
        received = time.time()
        try:
            node = ask_node(transport, target)
        except OrchError as exc:
            node = (None, exc.message)
    finally:
        transport.close()
    found = findings(target, answer, node, sent, received, torch=torch)
    if target.spec.kind == "slurm":  # the cluster's own checks, asked of the login node
        found += slurm_findings(settings, target)
    return {"target": target.label, "ct": target.info.get("ct"), "node": target.info.get("node"),
            "status": worst(found), "findings": [f.to_dict() for f in found]}


def slurm_findings(settings: Settings, target: Target) -> list[Finding]:
    """A Slurm target's checks (``agent/slurm.doctor``): the controller, the partition, a compute node's Python and
    view of ``root``, GPU confinement."""
    assert target.connect is not None
    transport = target.connect()
    try:
        client = AgentClient(transport, target.root, target.python, timeout=settings.ssh.command_timeout)
        got = client.one("slurm_doctor", partition=target.spec.partition, time_limit=target.spec.time)
    finally:
        transport.close()
    return [Finding(**f) for f in got["findings"]]


def refuse(found: list[Finding] | None, label: str, echo) -> None:
    """The deploy preflight's verdict: each ``warn`` said through ``echo``; any ``fail`` a ``SafetyError``
    (exit 6) naming every failed check and its fix."""
    from ..errors import SafetyError

    for f in found or []:
        if f.status == "warn":
            echo(f"orch: warning: {label}: {f.check}: {f.reason}" + (f" (fix: {f.fix})" if f.fix else ""))
    failed = [f for f in found or [] if f.status == "fail"]
    if failed:
        fixes = "; ".join(f.fix for f in failed if f.fix)
        raise SafetyError(f"{label} is not fit to run: " + "; ".join(f"{f.check}: {f.reason}" for f in failed)
                          + "; nothing was changed",
                          hint=(f"fix: {fixes}; " if fixes else "") + "then deploy again (orch doctor shows every check)")
