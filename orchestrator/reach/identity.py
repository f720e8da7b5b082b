"""The CT a Proxmox target names, checked in every agent call (the agent's side: ``agent/machine/identity.py``).

An SSH host key proves only that the machine holds that key, and a clone holds its original's: a stopped CT's
address handed to its clone answers with the key orch trusts. So every call to a Proxmox CT carries ``expect``
(``Expected.wire``: vmid, node, hostname and MAC addresses as the API gave them, and the machine id orch saw
there before), and the agent runs nothing on a machine that is not that CT. Its answer names what answered;
orch then asks the API again (``resolve_again``): where the CT now has another address, the call goes there
(nothing ran on the other machine); where the API still names that address, or says the CT is stopped, the
command is refused with what answered instead (``WrongMachine``, ``CtNotRunning``: exit 3).

    expect = Expected(350, "pve1", "ct350", ("bc:24:11:00:01:5e",), "pve.lan:8006", "10.0.0.50")
    transport.identity = expect     # AgentClient sends expect.wire() with every request
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import CtNotRunning, OrchError, WrongMachine

HINT = ("another machine answers at CT {vmid}'s address with the SSH host key orch trusts for it (a clone that "
        "kept its original's host keys, or an address handed out twice): give each CT its own host keys (in the "
        "clone: `rm /etc/ssh/ssh_host_*; dpkg-reconfigure openssh-server`) and check which CT holds {address}; "
        "orch changed nothing on the machine that answered")


@dataclass
class Expected:
    """What the machine behind a Proxmox target must be; ``address`` is where it is reached (its node's host,
    for ``pct``). ``cached``: from a remembered lookup, not the API just now."""

    vmid: int
    node: str
    hostname: str
    hwaddrs: tuple[str, ...]
    cluster: str
    address: str
    machine_id: str | None = None
    cached: bool = False
    again: Callable[[], Any] | None = None  # the API asked again: a CtInfo (its lookup remembered anew)
    saw: Callable[[str], None] | None = None  # remembers the machine id a checked answer came from
    info: dict = field(default_factory=dict)  # the target's info, kept in step with a move
    address_of: Callable[[Any], str | None] | None = None  # where a CtInfo says it is reached (default: address)

    def wire(self) -> dict:
        """The request's ``expect``: a contact the API vouched for just now also records orch's mark there."""
        return {"vmid": self.vmid, "node": self.node, "hostname": self.hostname, "hwaddrs": list(self.hwaddrs),
                "cluster": self.cluster, "machine_id": self.machine_id, "record": not self.cached}

    def answered(self, who: Any) -> None:
        """A checked answer: its machine id is this CT's from now on (remembered with the lookup)."""
        seen = who.get("machine_id") if isinstance(who, dict) else None
        if seen and seen != self.machine_id:
            self.machine_id = seen
            if self.saw is not None:
                self.saw(seen)

    def resolve_again(self, why: str) -> str:
        """After an answer from another machine (``why``): the CT's address as the API gives it now, when it is
        another; else the refusal, saying what answered."""
        where = self.address
        if self.again is None:
            raise WrongMachine(f"{why} (at {where})", hint=HINT.format(vmid=self.vmid, address=where))
        try:
            info = self.again()
        except CtNotRunning as exc:
            raise CtNotRunning(f"{exc.message}; what answers at its address {where} is another machine: {why}",
                               hint=f"{exc.hint}; and {HINT.format(vmid=self.vmid, address=where)}") from None
        except OrchError as exc:
            raise WrongMachine(f"{why} (at {where}), and the Proxmox API could not be asked again: {exc.message}",
                               hint=exc.hint) from None
        self.node, self.hostname, self.hwaddrs = info.node, info.hostname, tuple(info.hwaddrs)
        self.machine_id, self.cached = None, False
        moved = self.address_of(info) if self.address_of is not None else info.address
        if not moved or moved == where:
            raise WrongMachine(f"{why} (at {where}, where the Proxmox API says CT {self.vmid} is)",
                               hint=HINT.format(vmid=self.vmid, address=where))
        self.address = moved
        self.info.update(node=info.node, **({"address": moved} if "address" in self.info else {}))
        return moved
