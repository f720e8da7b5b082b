"""Reversible network faults for the testbed, all under fixed names so that ``clear()`` undoes them.

Packet filters live in the nft table ``inet orch_faults`` (output hook: this machine is the only
client); a downed veth makes a CT unreachable. Freezing a CT and killing its sshd are in ``lxc.py``.
"""

from __future__ import annotations

from .lxc import PREFIX, sh

TABLE = "orch_faults"


def _ensure_table() -> None:
    sh("nft", "add", "table", "inet", TABLE)
    sh("nft", "add", "chain", "inet", TABLE, "output",
       "{ type filter hook output priority 0 ; policy accept ; }")


def block(address: str, port: int, how: str = "drop") -> None:
    """Filter TCP to ``address:port``: ``drop`` looks like a filtered port (timeout), ``reject`` like refused."""
    if how not in ("drop", "reject"):
        raise ValueError(f"how must be 'drop' or 'reject', not {how!r}")
    if not address.startswith(PREFIX) and address != "127.0.0.1":
        raise ValueError(f"{address} is not a testbed address")
    _ensure_table()
    verdict = ["drop"] if how == "drop" else ["reject", "with", "tcp", "reset"]
    sh("nft", "add", "rule", "inet", TABLE, "output", "ip", "daddr", address, "tcp", "dport", str(port), *verdict)


def link_down(vmid: int) -> None:
    """Take the CT's host-side veth down: the CT becomes unreachable (connect timeout)."""
    sh("ip", "link", "set", f"veth{vmid}i0", "down")


def link_up(vmid: int) -> None:
    sh("ip", "link", "set", f"veth{vmid}i0", "up")


def clear(vmids: list[int]) -> None:
    """Remove every filter and bring the given CTs' links back up (only those that exist)."""
    if sh("nft", "list", "table", "inet", TABLE, check=False).returncode == 0:
        sh("nft", "delete", "table", "inet", TABLE)
    for vmid in vmids:
        if sh("ip", "link", "show", f"veth{vmid}i0", check=False).returncode == 0:
            link_up(vmid)
