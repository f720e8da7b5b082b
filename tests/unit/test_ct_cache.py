"""The short-lived memory of Proxmox lookups: only running CTs, only for the TTL, forgotten after a failure."""

import os
import stat

from orchestrator.reach import ct_cache

INFO = {"node": "pve1", "name": "trainer", "status": "running", "address": "10.0.0.5", "started": False,
        "config_summary": {"gpus": 2}}


def test_a_running_ct_is_kept_for_the_ttl_only(tmp_path):
    ct_cache.remember(tmp_path, "pve:8006", 200, "ssh", 30, INFO)
    got = ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30)
    assert got is not None and got["address"] == "10.0.0.5" and got["config_summary"] == {"gpus": 2}
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30, now=got["at"] + 31) is None
    assert ct_cache.lookup(tmp_path, "pve:8006", 201, "ssh", 30) is None
    assert ct_cache.lookup(tmp_path, "other:8006", 200, "ssh", 30) is None
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 0) is None  # cache_ttl = 0: always the API
    mode = stat.S_IMODE(os.stat(tmp_path / ct_cache.FILE).st_mode)
    assert mode == 0o600


def test_stopped_or_just_started_cts_are_never_kept(tmp_path):
    ct_cache.remember(tmp_path, "pve:8006", 200, "ssh", 30, {**INFO, "status": "stopped"})
    ct_cache.remember(tmp_path, "pve:8006", 201, "ssh", 30, {**INFO, "started": True})
    ct_cache.remember(tmp_path, "pve:8006", 202, "ssh", 0, INFO)
    assert not (tmp_path / ct_cache.FILE).exists()


def test_a_failure_forgets_what_was_served(tmp_path):
    ct_cache.remember(tmp_path, "pve:8006", 200, "ssh", 30, INFO)
    ct_cache.remember(tmp_path, "pve:8006", 201, "ssh", 30, INFO)
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30) is not None
    ct_cache.forget_served()
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30) is None
    assert ct_cache.lookup(tmp_path, "pve:8006", 201, "ssh", 30) is not None  # not served: kept


def test_a_damaged_file_is_no_cache(tmp_path):
    (tmp_path / ct_cache.FILE).write_text("{not json")
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30) is None
    ct_cache.remember(tmp_path, "pve:8006", 200, "ssh", 30, INFO)
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30) is not None


def test_past_the_ttl_a_lookup_is_stale_until_its_max_age(tmp_path):
    ct_cache.remember(tmp_path, "pve:8006", 200, "ssh", 30, INFO, max_age=3600)
    fresh = ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30, max_age=3600)
    assert fresh is not None and fresh["stale"] is False
    stale = ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30, now=fresh["at"] + 600, max_age=3600)
    assert stale is not None and stale["stale"] is True and stale["address"] == "10.0.0.5"
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30, now=fresh["at"] + 3601, max_age=3600) is None
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30, now=fresh["at"] + 600) is None  # no max age


def test_a_lookup_that_finds_the_ct_stopped_forgets_it(tmp_path):
    ct_cache.remember(tmp_path, "pve:8006", 200, "ssh", 30, INFO, max_age=3600)
    ct_cache.remember(tmp_path, "pve:8006", 201, "ssh", 30, INFO, max_age=3600)
    ct_cache.remember(tmp_path, "pve:8006", 200, "ssh", 30, {**INFO, "status": "stopped"}, max_age=3600)
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30, max_age=3600) is None
    assert ct_cache.lookup(tmp_path, "pve:8006", 201, "ssh", 30, max_age=3600) is not None


def test_the_machine_id_seen_is_kept_with_the_lookup_until_another_machine_answered(tmp_path):
    ct_cache.remember(tmp_path, "pve:8006", 200, "ssh", 30, INFO)
    at = ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30)["at"]
    ct_cache.note(tmp_path, "pve:8006", 200, "ssh", machine_id="abc")
    got = ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30)
    assert got["machine_id"] == "abc" and got["at"] == at  # its age as it was
    ct_cache.remember(tmp_path, "pve:8006", 200, "ssh", 30, INFO)  # asked again: the same machine
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30)["machine_id"] == "abc"
    ct_cache.forget(tmp_path, "pve:8006", 200, "ssh")  # another machine answered at its address
    assert ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30) is None
    ct_cache.remember(tmp_path, "pve:8006", 200, "ssh", 30, INFO)
    assert "machine_id" not in ct_cache.lookup(tmp_path, "pve:8006", 200, "ssh", 30)
