"""The one cluster.yaml editor (doctor --fix, setup hostfile, setup env): comments and layout
kept, values quoted as YAML reads them back, a node's words checked, the result read back as
exactly the intended cluster, the file replaced in one step with its backup's mode kept."""

from __future__ import annotations

import os

import pytest
import yaml

from trainfleet import clusterfile
from trainfleet.cluster import load_cluster, parse_cluster_yaml
from trainfleet.errors import ClusterFileError, TrainfleetError

pytestmark = pytest.mark.unit

CLUSTER = """\
# our two boxes
master: a
nodes:
  - host: a            # the master
    slots: 8
  - slots: 8
    host: b
    interface: eth9    # old guess
  - c   # short form
  - 'd'
"""


def _nodes(text: str) -> dict:
    return {n.host: (n.slots, n.interface, dict(n.env)) for n in parse_cluster_yaml(text).nodes}


def test_pin_interfaces_edits_in_place_and_keeps_comments():
    pins = {"a": {"interface": "ens1"}, "b": {"interface": "ens2"}, "c": {"interface": "ens3"}}
    edited = clusterfile.edit(CLUSTER, "cluster.yaml", nodes=pins)
    assert edited.splitlines() == [
        "# our two boxes",
        "master: a",
        "nodes:",
        "  - host: a            # the master",
        "    interface: ens1",
        "    slots: 8",
        "  - slots: 8",
        "    host: b",
        "    interface: ens2    # old guess",
        "  - {host: c, interface: ens3}   # short form",
        "  - 'd'",
    ]
    nodes = {n.host: n.interface for n in parse_cluster_yaml(edited, "x").nodes}
    assert nodes == {"a": "ens1", "b": "ens2", "c": "ens3", "d": None}


def test_a_flow_entry_is_edited_and_what_it_cannot_edit_safely_is_refused():
    """A `{host: a, slots: 2}` entry was refused by doctor --fix's old regex editor (setup's
    YAML round trip took it): both now edit it in place."""
    edited = clusterfile.edit(
        "nodes:\n  - {host: a, slots: 2}\n", "c.yaml", nodes={"a": {"interface": "ens1"}}
    )
    assert edited == "nodes:\n  - {host: a, slots: 2, interface: ens1}\n"
    block_scalar = "nodes:\n  - host: a\n    env:\n      PATH: |\n        /usr/bin\n"
    with pytest.raises(TrainfleetError, match="cannot edit"):
        clusterfile.edit(block_scalar, "c.yaml", nodes={"a": {"env": {"PATH": "/opt/bin"}}})
    with pytest.raises(TrainfleetError, match="node z not found"):
        clusterfile.edit(CLUSTER, "c.yaml", nodes={"z": {"interface": "ens1"}})


def test_a_plain_name_becomes_a_mapping_and_keeps_its_quotes_and_comment():
    edited = clusterfile.edit(
        CLUSTER, "c.yaml", nodes={"c": {"slots": 2}, "d": {"env": {"X": "1"}, "slots": 4}}
    )
    assert "  - {host: c, slots: 2}   # short form" in edited.splitlines()
    assert "  - {host: 'd', env: {X: '1'}, slots: 4}" in edited.splitlines()
    assert _nodes(edited)["c"] == (2, None, {}) and _nodes(edited)["d"] == (4, None, {"X": "1"})


NESTED = """\
# A sandbox cluster. Written by `trainfleet sandbox up`.
master: gpu-node-1
ssh:
  user: root
  options: [-o, IdentitiesOnly=yes]
env:
  OMP_NUM_THREADS: '1'   # one thread per rank
nodes:
- host: gpu-node-1
  slots: 2
  ssh:
    port: 2222   # its sshd
  env:
    HF_HOME: /data/hf
# gpu-node-2 came later
- host: gpu-node-2
  env: {NCCL_DEBUG: WARN}
  slots: 2
"""


def test_a_nested_node_list_keeps_its_nesting_comments_and_key_order():
    fields = {
        "gpu-node-1": {"interface": "ens14f0", "env": {"PATH": "/opt/env/bin:/usr/bin"}},
        "gpu-node-2": {"python": "/opt/env/bin/python", "env": {"NCCL_DEBUG": "INFO", "X": "y"}},
    }
    edited = clusterfile.edit(NESTED, "c.yaml", nodes=fields)
    assert edited.splitlines() == [
        "# A sandbox cluster. Written by `trainfleet sandbox up`.",
        "master: gpu-node-1",
        "ssh:",
        "  user: root",
        "  options: [-o, IdentitiesOnly=yes]",
        "env:",
        "  OMP_NUM_THREADS: '1'   # one thread per rank",
        "nodes:",
        "- host: gpu-node-1",
        "  interface: ens14f0",
        "  slots: 2",
        "  ssh:",
        "    port: 2222   # its sshd",
        "  env:",
        "    HF_HOME: /data/hf",
        "    PATH: /opt/env/bin:/usr/bin",
        "# gpu-node-2 came later",
        "- host: gpu-node-2",
        "  python: /opt/env/bin/python",
        "  env: {NCCL_DEBUG: INFO, X: y}",
        "  slots: 2",
    ]
    first = parse_cluster_yaml(edited).node("gpu-node-1")
    assert first.ssh.port == 2222 and first.ssh.options == ("-o", "IdentitiesOnly=yes")
    assert dict(first.env) == {
        "OMP_NUM_THREADS": "1",
        "HF_HOME": "/data/hf",
        "PATH": "/opt/env/bin:/usr/bin",
    }


@pytest.mark.parametrize(
    "value", ["yes", "1", "0x1F", "a: b", "a,b", "{x}", "#x", "", "it's", "x\ny", " lead", "é"]
)
def test_a_value_that_needs_quoting_reads_back_as_itself(value):
    for text in (NESTED, CLUSTER):  # block and flow mappings, a plain name
        for host in [n.host for n in parse_cluster_yaml(text).nodes]:
            edited = clusterfile.edit(text, "c.yaml", nodes={host: {"env": {"V": value}}})
            assert parse_cluster_yaml(edited).node(host).env["V"] == value


def test_an_interface_from_a_hostile_node_is_refused_and_nothing_else_slips_in():
    evil = "eth0\n    env: {LD_PRELOAD: /tmp/x.so}"
    with pytest.raises(ClusterFileError, match="not an interface name"):
        clusterfile.edit(CLUSTER, "c.yaml", nodes={"a": {"interface": evil}})
    cluster = load_cluster(hosts="a,b")
    with pytest.raises(ClusterFileError, match="not an interface name"):
        clusterfile.new(cluster, nodes={"b": {"interface": evil}}, written_by="test")
    # A python path is no interface: YAML quotes it into one value, and trainfleet's parser
    # (run on the result) refuses it there.
    with pytest.raises(ClusterFileError, match="would not load"):
        clusterfile.edit(CLUSTER, "c.yaml", nodes={"a": {"python": evil}})


def test_the_read_back_refuses_an_edit_that_would_change_another_node():
    """An anchor shared by two nodes: adding to one node's env would add to both."""
    shared = "nodes:\n  - host: a\n    env: &e {X: '1'}\n  - host: b\n    env: *e\n"
    with pytest.raises(
        ClusterFileError, match=r"not load as the asked change alone \(b would differ"
    ):
        clusterfile.edit(shared, "c.yaml", nodes={"a": {"env": {"Y": "2"}}})
    edited = clusterfile.edit(shared, "c.yaml", nodes={"a": {"slots": 2}})  # not shared
    assert _nodes(edited) == {"a": (2, None, {"X": "1"}), "b": (1, None, {"X": "1"})}


def test_top_level_keys_and_a_file_without_a_final_newline():
    edited = clusterfile.edit(
        "# mine\nmaster: a  # first\nnodes: [a, b]",
        "c.yaml",
        nodes={"b": {"slots": 2}},
        top={"master": "b", "master_port": 29600},
    )
    assert (
        edited
        == "# mine\nmaster: b  # first\nnodes: [a, {host: b, slots: 2}]\nmaster_port: 29600\n"
    )


def test_an_edit_to_the_values_already_there_changes_nothing():
    same = {"b": {"interface": "eth9", "slots": 8}, "a": {"slots": 8}}
    assert clusterfile.edit(CLUSTER, "c.yaml", nodes=same) == CLUSTER


def test_new_cluster_yaml_from_a_hostfile_pins_and_keeps_slots(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("n1 slots=8\nn2 slots=4\n")
    cluster = load_cluster(hostfile=str(hostfile))
    text = clusterfile.new(cluster, nodes={"n2": {"interface": "ens2"}}, written_by="test")
    parsed = parse_cluster_yaml(text, "cluster.yaml")
    assert [(n.host, n.slots, n.interface) for n in parsed.nodes] == [
        ("n1", 8, None),
        ("n2", 4, "ens2"),
    ]
    assert str(hostfile) in text.splitlines()[0]


def test_a_backup_never_overwrites_an_older_one(tmp_path, monkeypatch):
    monkeypatch.setattr(clusterfile.time, "strftime", lambda _: "20261121-120000")
    path = tmp_path / "cluster.yaml"
    (tmp_path / "cluster.yaml.20261121-120000").write_text("the original")
    assert clusterfile.backup_name(str(path)) == f"{path}.20261121-120000-1"


@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_save_keeps_the_mode_in_the_backup_and_the_new_file(tmp_path, mode):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    path.chmod(mode)
    backup = str(tmp_path / "cluster.yaml.old")
    edited = clusterfile.edit(CLUSTER, str(path), nodes={"a": {"interface": "ens1"}})
    clusterfile.save(str(path), edited, backup=backup)
    assert (tmp_path / "cluster.yaml.old").read_text() == CLUSTER
    assert os.stat(backup).st_mode & 0o777 == mode == path.stat().st_mode & 0o777
    assert path.read_text() == edited
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml", "cluster.yaml.old"]


def test_save_never_overwrites_for_a_new_file_or_a_backup(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    with pytest.raises(FileExistsError):
        clusterfile.save(str(path), "nodes: [a]\n", backup=None)
    with pytest.raises(FileExistsError):
        clusterfile.save(str(path), "nodes: [a]\n", backup=str(path))
    assert path.read_text() == CLUSTER
    with pytest.raises(TrainfleetError, match="slots"):
        clusterfile.save(str(path), "nodes:\n- host: a\n  slots: 0\n", backup=str(path) + ".b")
    assert path.read_text() == CLUSTER


def test_save_through_a_symlink_keeps_the_link(tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text(CLUSTER)
    link = tmp_path / "cluster.yaml"
    link.symlink_to(real)
    clusterfile.save(str(link), "nodes: [a]\n", backup=str(tmp_path / "old.yaml"))
    assert link.is_symlink() and real.read_text() == "nodes: [a]\n"
    assert yaml.safe_load((tmp_path / "old.yaml").read_text())["master"] == "a"
