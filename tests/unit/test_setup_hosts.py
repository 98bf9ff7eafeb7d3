"""`setup hosts` without nodes: the lines it plans from doctor's facts, the node job that edits
/etc/hosts in place, the state file --revert trusts, and what a silent resolver costs a launch.
(Against real nodes whose resolver never answers: tests/cluster/test_setup.py.)"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest
from doctor_fixtures import MASTER, MASTER_ADDR, make_survey, reparsed, sheets_of

from trainfleet import node
from trainfleet.doctor.checks import network
from trainfleet.doctor.collect import _named_by
from trainfleet.doctor.facts.sheet import Resolver
from trainfleet.errors import SetupError
from trainfleet.node import files
from trainfleet.node import network as node_network
from trainfleet.setup import etchosts

pytestmark = pytest.mark.unit

N2, N3 = "gpu-node-2", "gpu-node-3"
SILENT = {"error": "no answer in 2s", "seconds": 2.0}
"""What the probe records when the lookup outlasts its bound (a resolver that never answers)."""


def _edit(path, **job) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert (
            files.edit_hosts(files.HostsJob(**{"file": str(path), "add": [], "remove": [], **job}))
            == 0
        )
    return node.read_answer(out.getvalue(), files.HostsAnswer, node="here")


def test_the_node_job_adds_once_removes_only_exact_lines_and_keeps_every_other_byte(tmp_path):
    hosts = tmp_path / "hosts"
    original = "127.0.0.1\tlocalhost\n# a comment the admin wrote\n10.0.0.2 gpu-node-2"  # no \n
    hosts.write_text(original)
    ours = etchosts.hosts_line("10.0.0.2", "gpu-node-2")

    assert _edit(hosts, add=[ours, ours]) == {"added": [ours], "removed": []}
    assert hosts.read_text() == original + "\n" + ours + "\n"
    assert _edit(hosts, add=[ours]) == {"added": [], "removed": []}
    inode = hosts.stat().st_ino
    # A line that only resembles ours (no tag) is the admin's: never removed.
    assert _edit(hosts, remove=[ours, "10.0.0.2 gpu-node-2 "]) == {"added": [], "removed": [ours]}
    assert hosts.read_text() == original + "\n"
    assert hosts.stat().st_ino == inode  # edited in place: /etc/hosts is often a bind mount


def test_each_address_gets_a_name_of_its_own_and_only_those_lines_count_as_ours():
    assert etchosts.hosts_line("10.0.0.12", "gpu-node-2") == (
        "::ffff:10.0.0.12\tgpu-node-2-ipv4-mapped\t# trainfleet setup hosts"
    )
    # A hostfile of addresses: the address itself would not make a usable name.
    assert network.mapped_name("10.0.0.12", "10.0.0.12") == "ipv4-mapped-10-0-0-12"
    for odd in ("bad name;rm", "gpu-ñode-2", "x" * 201):  # the state file's check must pass
        assert network.mapped_name(odd, "10.0.0.12") == "ipv4-mapped-10-0-0-12"
    assert etchosts.is_ours(etchosts.hosts_line("10.0.0.12", "10.0.0.12"))
    for line in ("127.0.0.1\tlocalhost", "::ffff:10.0.0.1\tx\t# trainfleet setup hosts\nevil",
                 "10.0.0.1\tgpu-node-1\t# trainfleet setup hosts", 7):  # fmt: skip
        assert not etchosts.is_ours(line), line


def test_revert_refuses_a_state_file_that_names_another_line(tmp_path):
    path = tmp_path / "cluster.yaml.hosts.json"
    state = {"version": 1, "file": "/etc/hosts", "nodes": {"gpu-node-1": ["127.0.0.1 localhost"]}}
    path.write_text(json.dumps(state))
    with pytest.raises(SetupError, match="does not write"):
        etchosts.load_state(str(path))
    with pytest.raises(SetupError, match="nothing recorded to revert"):
        etchosts.load_state(str(tmp_path / "missing.json"), must_exist=True)
    state["nodes"] = {"gpu-node-1": [etchosts.hosts_line("10.0.0.2", "gpu-node-2")]}
    etchosts.save_state(str(path), state)
    assert etchosts.load_state(str(path)) == state
    state["nodes"]["gpu-node-1"] = []
    etchosts.save_state(str(path), state)
    assert not path.exists()  # nothing recorded: no file


def test_the_master_names_every_client_and_every_other_node_names_the_master():
    addresses = {MASTER: "10.0.0.1", N2: "10.0.0.2", N3: None, "v6": "fd00::4"}
    assert _named_by(MASTER, MASTER, addresses) == ["10.0.0.1", "10.0.0.2"]
    assert _named_by(N2, MASTER, addresses) == ["10.0.0.1"]


def test_lines_are_planned_where_the_names_are_missing_and_the_warning_gives_the_wait(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    n2 = survey.addresses[N2]
    named = {"name": "x-ipv4-mapped", "seconds": 0.001}
    sheets[MASTER]["client_names"] = {a: dict(named) for a in survey.addresses.values()}
    sheets[N2]["client_names"] = {MASTER_ADDR: dict(SILENT)}
    sheets[N2]["resolver"] = {"nameservers": ["10.0.0.53"], "timeout": 5, "attempts": 2}
    sheets[MASTER]["client_names"][n2] = dict(SILENT)
    survey = reparsed(survey, sheets)

    assert etchosts.plan_lines(survey) == {
        MASTER: [etchosts.hosts_line(n2, N2)],
        N2: [etchosts.hosts_line(MASTER_ADDR, MASTER)],
    }
    (finding,) = network.check_client_names(survey)
    assert set(finding.nodes) == {MASTER, N2}
    text = "\n".join(finding.evidence)
    assert f"on {N2}, ::ffff:{MASTER_ADDR} ({MASTER}) has no name" in text
    # The probe stopped waiting at 2 s; the resolver's settings say 10 s (5 s x 2 tries).
    assert "up to 10 s, on gpu-node-2" in text and "about 20 s more to start" in text
    assert "trainfleet setup hosts" in finding.fix and "2 /etc/hosts line(s)" in finding.fix
    assert network.mapped_lookup_wait(survey) == (10, N2)


def test_a_lookup_that_fails_at_once_costs_only_its_log_line(tmp_path):
    survey = make_survey(tmp_path)
    sheets = sheets_of(survey)
    sheets[N3]["client_names"] = {MASTER_ADDR: {"error": "[Errno -2] not known", "seconds": 0.01}}
    survey = reparsed(survey, sheets)
    (finding,) = network.check_client_names(survey)
    assert finding.nodes == (N3,) and "more to start" not in "\n".join(finding.evidence)
    assert network.mapped_lookup_wait(survey) == (0.01, N3)


def test_the_resolver_settings_as_glibc_reads_them(tmp_path, monkeypatch):
    conf = tmp_path / "resolv.conf"
    conf.write_text("# generated\nnameserver 10.0.0.53 # site\nnameserver 10.0.0.54\n"
                    "search example.org\noptions ndots:2 timeout:3\n")  # fmt: skip
    monkeypatch.delenv("RES_OPTIONS", raising=False)
    assert node_network.resolver(str(conf)) == {
        "nameservers": ["10.0.0.53", "10.0.0.54"], "timeout": 3, "attempts": 2}  # fmt: skip
    monkeypatch.setenv("RES_OPTIONS", "attempts:1 timeout:1")  # per process, over the file
    assert node_network.resolver(str(conf))["timeout"] == 1
    assert "error" in node_network.resolver(str(tmp_path / "none"))
    assert Resolver(nameservers=("a", "b"), timeout=3, attempts=2).unanswered_s == 12
    assert Resolver(nameservers=("a",), timeout=0, attempts=9).unanswered_s == 5  # clamped
    assert Resolver(nameservers=(), timeout=5, attempts=2).unanswered_s is None
