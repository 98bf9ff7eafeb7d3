"""setup hostfile and the cluster.yaml edits that setup hostfile and setup env share."""

from __future__ import annotations

import os

import pytest
import yaml
from doctor_fixtures import facts_of, make_survey

from trainfleet import clusterfile
from trainfleet.cluster import load_cluster, parse_cluster_yaml, parse_hostfile
from trainfleet.setup import clusteryaml, hostfile
from trainfleet.setup.hostfile import hostfile_text, slots_for

pytestmark = pytest.mark.unit

GPUS = facts_of({"gpus": {"devices": [{"index": i} for i in range(8)]}})
CPU = facts_of({"gpus": {"error": "nvidia-smi not found"}})


def test_hostfile_text_reads_back_as_deepspeed_reads_it():
    text = hostfile_text({"gpu-node-1": 8, "gpu-node-2": 4})
    assert text.splitlines()[1:] == ["gpu-node-1 slots=8", "gpu-node-2 slots=4"]
    assert text.startswith("# written by `trainfleet setup hostfile`")
    pool = parse_hostfile(text)
    assert {h: s for h, (s, _) in pool.items()} == {"gpu-node-1": 8, "gpu-node-2": 4}


def test_slots_are_the_gpus_found_and_cpu_nodes_get_slots_or_1_with_a_note():
    slots, notes = slots_for({"a": GPUS, "b": CPU}, cpu_slots=None)
    assert slots == {"a": 8, "b": 1}
    assert notes == ["b: no GPU found; slots=1 (set --slots N for CPU nodes)"]
    slots, notes = slots_for({"a": GPUS, "b": CPU}, cpu_slots=2)
    assert slots == {"a": 8, "b": 2} and notes == ["a: 8 GPU(s); --slots 2 applies to CPU nodes"]


def test_a_cluster_from_hosts_becomes_a_cluster_yaml(tmp_path):
    cluster = load_cluster(hosts="gpu-node-1,gpu-node-2", ssh_config=str(tmp_path / "cfg"))
    text = clusterfile.new(cluster, nodes={"gpu-node-2": {"slots": 8}}, written_by="test")
    parsed = parse_cluster_yaml(text, str(tmp_path / "cluster.yaml"))
    assert [(n.host, n.slots) for n in parsed.nodes] == [("gpu-node-1", 1), ("gpu-node-2", 8)]
    assert parsed.nodes[0].ssh.config_file == str(tmp_path / "cfg")


def test_an_existing_cluster_yaml_keeps_its_keys_header_and_short_entries(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "# my cluster\n# second line\nmaster: b\nenv: {HF_HOME: /data/hf}\nnodes:\n  - a\n"
        "  - host: b\n    slots: 2\n    env: {X: '1'}\n"
    )
    old = path.read_text()
    fields = {"a": {"slots": 8, "interface": "ens14f0"}, "b": {"env": {"CUDA_HOME": "/cuda"}}}
    text = clusterfile.edit(old, str(path), nodes=fields)
    assert text.startswith("# my cluster\n# second line\n")
    new = yaml.safe_load(text)
    assert new["master"] == "b" and new["env"] == {"HF_HOME": "/data/hf"}
    assert new["nodes"] == [
        {"host": "a", "slots": 8, "interface": "ens14f0"},
        {"host": "b", "slots": 2, "env": {"X": "1", "CUDA_HOME": "/cuda"}},
    ]
    assert clusteryaml.node_changes(old, text) == {
        "a": "slots: 8, interface: ens14f0",
        "b": "CUDA_HOME: /cuda",
    }


def test_write_is_idempotent_and_keeps_the_old_file(tmp_path):
    path = str(tmp_path / "cluster.yaml")
    first = "nodes:\n- host: a\n  slots: 1\n"
    assert clusterfile.write(path, first, dry_run=True) == f"would write {path}"
    assert clusterfile.write(path, first, dry_run=False) == f"wrote {path}"
    assert os.stat(path).st_mode & 0o777 == 0o600  # its env may hold secrets (#17)
    assert clusterfile.write(path, first, dry_run=False) is None
    changed = clusterfile.write(path, first.replace("1", "8"), dry_run=False)
    assert changed.startswith(f"updated {path} (the old one is kept as ")
    [backup] = [p for p in tmp_path.iterdir() if p.name != "cluster.yaml"]
    assert backup.read_text() == first


def test_a_private_cluster_yaml_keeps_a_private_backup(tmp_path):
    """#17: the backup of a 0600 cluster.yaml (its env may hold secrets) was 0644."""
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes:\n- host: a\n  slots: 1\n")
    path.chmod(0o600)
    clusterfile.write(str(path), "nodes:\n- host: a\n  slots: 8\n", dry_run=False)
    [backup] = [p for p in tmp_path.iterdir() if p.name != "cluster.yaml"]
    assert backup.stat().st_mode & 0o777 == 0o600 == path.stat().st_mode & 0o777


def test_write_refuses_text_trainfleet_would_not_load(tmp_path):
    with pytest.raises(Exception, match="slots"):
        clusterfile.write(
            str(tmp_path / "c.yaml"), "nodes:\n- host: a\n  slots: 0\n", dry_run=False
        )
    assert not (tmp_path / "c.yaml").exists()


def test_base_text_prefers_the_given_file_then_a_matching_output(tmp_path):
    cluster = load_cluster(hosts="a,b")
    out = tmp_path / "cluster.yaml"

    def base() -> tuple[str, dict]:
        text, source = clusteryaml.base_text(cluster, cluster_in=None, out=str(out), written_by="t")
        assert source == str(out)
        return text, yaml.safe_load(text)

    assert base()[1]["nodes"][0] == {"host": "a", "slots": 1}
    out.write_text("# mine\nmaster_port: 29600\nnodes: [a, b]\n")
    text, doc = base()
    assert text.startswith("# mine\n") and doc["master_port"] == 29600
    out.write_text("nodes: [x]\n")  # another cluster's file: not reused
    assert base()[1]["master"] == "a"


def test_setup_hostfile_edits_cluster_yaml_in_place_keeping_comments(tmp_path, monkeypatch):
    survey = make_survey(tmp_path)  # the recorded nodes have no GPUs: --slots applies
    path = tmp_path / "mine.yaml"
    mine = (
        "# three boxes\nnodes:\n  - host: gpu-node-1   # rack A\n    slots: 1\n"
        "  - gpu-node-2   # rack B\n  - {host: gpu-node-3, slots: 1}   # the new one\n"
    )
    path.write_text(mine)
    monkeypatch.setattr(hostfile.verify, "survey", lambda *args, **kwargs: survey)

    hostfile.setup_hostfile(
        load_cluster(cluster_file=str(path)),
        hostfile_out=str(tmp_path / "hostfile"),
        cluster_in=str(path),
        cpu_slots=2,
    )

    assert path.read_text() == (
        "# three boxes\nnodes:\n  - host: gpu-node-1   # rack A\n    slots: 2\n"
        "  - {host: gpu-node-2, slots: 2}   # rack B\n"
        "  - {host: gpu-node-3, slots: 2}   # the new one\n"
    )
