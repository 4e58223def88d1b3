"""cluster.toml's [ha] table and the RM's id (protocol/ha_config.py): bad input is refused with a
message naming the setting."""
from __future__ import annotations

import pytest

from protocol.config import ConfigError
from protocol.ha_config import DEFAULT_LEASE_S, HAConfig, load_ha, resolve_rm_id

GOOD = """
[ha]
enabled = true
rm_ids = ["rm1", "rm2"]
rm_addresses = { rm1 = "http://h1:8088", rm2 = "h2:8088/" }
etcd_endpoints = ["http://e1:2379", "http://e2:2379"]
"""


def write(tmp_path, text, name="cluster.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_good_table_and_its_defaults(tmp_path):
    ha = load_ha(write(tmp_path, GOOD))
    assert ha.enabled and ha.lease_s == DEFAULT_LEASE_S
    assert ha.addresses() == ["http://h1:8088", "http://h2:8088"]
    assert ha.etcd_targets() == [("e1", 2379), ("e2", 2379)]


def test_no_table_is_ha_off(tmp_path):
    assert not load_ha(write(tmp_path, "[cluster]\n")).enabled
    assert not HAConfig().enabled     # nothing else is checked while it is off


@pytest.mark.parametrize("change,setting", [
    ('rm_ids = ["rm1", "rm1"]', "rm_ids: 'rm1' is listed twice"),
    ('rm_ids = []', "rm_ids"),
    ('rm_ids = ["rm 1", "rm2"]', "rm_ids: 'rm 1'"),
    ('rm_ids = ["rm1", "rm2", "rm3"]', "rm_addresses.rm3"),
    ('rm_addresses = { rm1 = "http://h1:8088", rm2 = "http://h2:8088", rm9 = "http://h9:1" }', "rm_addresses.rm9"),
    ('rm_addresses = { rm1 = "http://h1:8088", rm2 = "ftp://h2:8088" }', "rm_addresses.rm2"),
    ('rm_addresses = { rm1 = "http://h1:8088", rm2 = "http://h1:8088/" }', "rm_addresses: two RMs share"),
    ('etcd_endpoints = []', "etcd_endpoints"),
    ('etcd_endpoints = ["https://e1:2379"]', "etcd_endpoints"),
    ('etcd_endpoints = ["http://e1"]', "etcd_endpoints: 'http://e1' names no port"),
    ('lease_s = 1', "lease_s"),
    ('lease_s = 2.5', "lease_s"),
    ('etcd_prefix = "elastane"', "etcd_prefix"),
    ('failover_max_attempts = 0', "failover_max_attempts"),
    ('compaction_interval_s = -1', "compaction_interval_s"),
    ('bogus = 1', "bogus"),
])
def test_bad_settings_are_named(tmp_path, change, setting):
    key = change.split(" =", 1)[0]
    lines = [ln for ln in GOOD.splitlines() if not ln.startswith(key + " ")]
    with pytest.raises(ConfigError, match=setting.replace("(", r"\(").replace("[", r"\[")):
        load_ha(write(tmp_path, "\n".join(lines) + "\n" + change + "\n"))


def test_the_rm_id_comes_from_the_flag_the_environment_or_rm_toml(tmp_path, monkeypatch):
    ha = load_ha(write(tmp_path, GOOD))
    rm_toml = write(tmp_path, '[rm]\nport = 8088\n[ha]\nrm_id = "rm2"\n', "rm.toml")
    monkeypatch.delenv("ELASTANE_RM_ID", raising=False)
    assert resolve_rm_id(ha, None, rm_toml) == "rm2"
    monkeypatch.setenv("ELASTANE_RM_ID", "rm1")
    assert resolve_rm_id(ha, None, rm_toml) == "rm1"
    assert resolve_rm_id(ha, "rm2", rm_toml) == "rm2"
    with pytest.raises(ConfigError, match=r"rm_id: 'rm7' \(from --rm-id\) is not one of"):
        resolve_rm_id(ha, "rm7", rm_toml)
    monkeypatch.delenv("ELASTANE_RM_ID")
    with pytest.raises(ConfigError, match="rm_id: .*has no id"):
        resolve_rm_id(ha, None, write(tmp_path, "[rm]\n", "rm-noid.toml"))
