"""Which machine this is, checked before any op runs: a host key is not an identity (a cloned CT has its
original's keys, and a stopped CT's address can be handed to such a clone).

A request about a Proxmox CT carries ``expect``: what the API says that CT is (its vmid, node, hostname and the
MAC addresses of its ``netN``), and the machine id orch saw there before. The agent compares them with this machine
(``uname``, ``/etc/machine-id``, ``/sys/class/net/*/address``) and with the mark orch wrote under its root on
first contact (``identity.json``: vmid, node, cluster, machine id). Where they differ, nothing runs and the
answer says what answered instead. A clone copies the mark with the disk, so the mark counts only where it
names this machine's own machine id; the hostname and the MAC address come from the API and a clone gets
its own.

    who = facts("/workspace/orch")     # {"hostname": "ct350", "machine_id": "…", "hwaddrs": […], "mark": {…}}
    why = mismatch(expect, who)        # None, or "its hostname is ct351, where the API names CT 350 ct350"
"""

from __future__ import annotations

import functools
import json
import os

MARK = "identity.json"
_NET = "/sys/class/net"


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _hwaddrs() -> list[str]:
    try:
        names = os.listdir(_NET)
    except OSError:
        return []
    found = []
    for name in sorted(names):
        if name != "lo":
            address = _read(os.path.join(_NET, name, "address")).lower()
            if address and address != "00:00:00:00:00:00":
                found.append(address)
    return found


def mark_path(root: str) -> str:
    return os.path.join(root, MARK)


@functools.cache
def _machine() -> tuple[str, str, tuple[str, ...]]:
    """Hostname, machine id, MAC addresses: read once per agent process (a resident one serves a single machine)."""
    return os.uname().nodename, _read("/etc/machine-id"), tuple(_hwaddrs())


def facts(root: str) -> dict:
    """This machine as a request can check it: a few small reads, no process started."""
    try:
        mark = json.loads(_read(mark_path(root)) or "null")
    except ValueError:
        mark = None
    hostname, machine_id, hwaddrs = _machine()
    return {"hostname": hostname, "machine_id": machine_id, "hwaddrs": list(hwaddrs),
            "mark": mark if isinstance(mark, dict) else None}


def _short(hostname: str) -> str:
    """The name Proxmox writes into a CT for its config's hostname: the first label (``ct350`` of ``ct350.lan``)."""
    return hostname.split(".", 1)[0].lower()


def mismatch(expect: dict, who: dict) -> str | None:
    """Why this machine is not the CT ``expect`` describes (None: nothing says it is another)."""
    vmid = expect.get("vmid")
    why = []
    hostname = expect.get("hostname")
    if hostname and _short(who["hostname"]) != _short(hostname):
        why.append(f"its hostname is {who['hostname']}, where the Proxmox API names CT {vmid} {hostname}")
    hwaddrs = [str(a).lower() for a in expect.get("hwaddrs") or []]
    if hwaddrs and who["hwaddrs"] and not set(hwaddrs) & set(who["hwaddrs"]):
        why.append(f"its MAC address {', '.join(who['hwaddrs'])} is not CT {vmid}'s ({', '.join(hwaddrs)})")
    mark = who.get("mark") or {}
    own = mark.get("machine_id") == who["machine_id"]  # a mark a clone copied names its original's machine id
    if own and mark.get("cluster") == expect.get("cluster") and mark.get("vmid") not in (None, vmid):
        why.append(f"orch recorded this machine as CT {mark.get('vmid')}")
    seen = expect.get("machine_id")
    if seen and who["machine_id"] and who["machine_id"] != seen:
        why.append(f"its machine id {who['machine_id'][:12]}… is not the {seen[:12]}… orch saw on CT {vmid}")
    return "; ".join(why) or None


def record(root: str, expect: dict, who: dict) -> None:
    """On a contact the API vouched for (``expect["record"]``): write the mark, where it is not already this."""
    from ..layout import write_atomic

    mark = {"vmid": expect.get("vmid"), "node": expect.get("node"), "cluster": expect.get("cluster"),
            "machine_id": who["machine_id"]}
    if not expect.get("record") or who.get("mark") == mark or not os.path.isdir(root):
        return  # a root not made yet gets its mark on the next contact, once a command has made it
    try:
        write_atomic(mark_path(root), json.dumps(mark).encode(), 0o644)
    except OSError:
        return  # the mark only makes the next check stronger
    who["mark"] = mark


def check(root: str, expect: object) -> tuple[dict | None, str | None]:
    """(this machine's facts, why it is not the CT expected); (None, None) for a request that expects nothing."""
    if not isinstance(expect, dict):
        return None, None
    who = facts(root)
    why = mismatch(expect, who)
    if why is None:
        record(root, expect, who)
    return who, why
