"""ProxyJump planning: pure, from an SSH config lookup to the ordered hops orch opens and checks itself."""

from __future__ import annotations

import io

import pytest

from orchestrator.errors import InputError
from orchestrator.reach.transport.jumps import MAX_JUMPS, Hop, Route, describe_jump, parse_hop, parse_proxy_jump, plan_route


def lookup_of(text: str):
    """A real paramiko SSHConfig lookup (the one orch reads the SSH config with), from ssh_config text."""
    from paramiko import SSHConfig

    config = SSHConfig()
    config.parse(io.StringIO(text))
    return config.lookup


@pytest.mark.parametrize("text,hop", [
    ("bastion", Hop("bastion")),
    ("root@bastion:2222", Hop("bastion", "root", 2222)),
    ("ssh://ops@10.0.0.5:22", Hop("10.0.0.5", "ops", 22)),
    ("[fe80::1]:2200", Hop("fe80::1", None, 2200)),
    ("u@[2001:db8::7]", Hop("2001:db8::7", "u", None)),
    (" spaced ", Hop("spaced")),
])
def test_hops_are_read_as_openssh_writes_them(text, hop):
    assert parse_hop(text) == hop


@pytest.mark.parametrize("text", ["", "user@", "host:port", "host:"])
def test_unreadable_hops_are_input_errors(text):
    with pytest.raises(InputError, match="ProxyJump"):
        parse_hop(text)


def test_none_and_empty_mean_no_jump():
    assert parse_proxy_jump(None) == parse_proxy_jump("none") == parse_proxy_jump("None") == []
    assert parse_proxy_jump("a,root@b:2") == [Hop("a"), Hop("b", "root", 2)]


def test_hops_come_first_first_behind_the_first_hops_own_route():
    lookup = lookup_of("""
Host gpu
    ProxyJump inner,outer
Host inner
    ProxyJump edge
Host outer
    ProxyJump ignored
Host edge
    ProxyCommand nc -x proxy:1080 %h %p
""")
    route = plan_route("gpu", lookup)
    assert route.hops == [Hop("edge"), Hop("inner"), Hop("outer")]
    assert route.proxy_command == "nc -x proxy:1080 edge 22"


def test_a_host_star_block_naming_the_jump_host_itself_does_not_loop():
    lookup = lookup_of("Host *\n    ProxyJump bastion\n")
    assert plan_route("gpu", lookup) == Route([Hop("bastion")])
    assert plan_route("bastion", lookup) == Route()


def test_proxy_command_none_and_proxy_jump_none_mean_direct():
    assert plan_route("a", lookup_of("Host a\n    ProxyCommand none\n")) == Route()
    assert plan_route("a", lookup_of("Host a\n    ProxyJump none\nHost *\n    ProxyCommand nc %h %p\n")) == Route()


def test_loops_and_overlong_chains_are_input_errors():
    with pytest.raises(InputError, match="ProxyJump loops: a -> b -> c -> a"):
        plan_route("a", lookup_of("Host a\n ProxyJump b\nHost b\n ProxyJump c\nHost c\n ProxyJump a\n"))
    chain = "".join(f"Host h{i}\n    ProxyJump h{i + 1}\n" for i in range(MAX_JUMPS + 2))
    with pytest.raises(InputError, match=f"more than {MAX_JUMPS} jump hosts"):
        plan_route("h0", lookup_of(chain))


def test_jump_hosts_are_named_by_alias_and_address():
    assert describe_jump("bastion", "10.0.0.5", 22) == "the jump host bastion (10.0.0.5:22)"
    assert describe_jump("10.0.0.5", "10.0.0.5", 2222) == "the jump host 10.0.0.5:2222"
