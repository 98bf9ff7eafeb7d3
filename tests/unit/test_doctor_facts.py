"""The fact sheet parser (doctor/facts.py): a real probe's sheet parses with nothing lost that a
check reads, another probe version is refused naming the node, and values of the wrong type
become unknown instead of raising inside the checks."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import socket
import subprocess
import sys
from collections.abc import Mapping

import pytest
from doctor_fixtures import NODES, facts_of, make_survey, probe_params, recorded_sheets, window

from trainfleet import node
from trainfleet.cluster import load_cluster
from trainfleet.doctor import node_summaries
from trainfleet.doctor.checks import run_checks
from trainfleet.doctor.facts import (
    Disk,
    FactSheetError,
    Firewall,
    NodeFacts,
    parse_fact_sheet,
    read_fact_sheet,
)
from trainfleet.node import answer, probe
from trainfleet.remote import Failure, NodeResult

# The module, not the function trainfleet.doctor exports under the same name.
collect = importlib.import_module("trainfleet.doctor.collect")

pytestmark = pytest.mark.unit

N2 = "gpu-node-2"

RENAMED = {"memory.MemTotal": "total", "memory.MemAvailable": "available"}
NOT_KEPT = {
    "imports.cached",  # the probe's own cache, not a fact about the node
    "imports.nccl_error",  # shown nowhere; `nccl` stays None
    "imports.deepspeed_error",  # a missing package is in `packages`; the check reads `torch_error`
    "imports.transformers_error",
    "imports.accelerate_error",
}
"""What a probe reports that the parsed facts leave out on purpose (no check reads it)."""


def _lost(raw: object, parsed: object, path: str = "") -> list[str]:
    """Paths of the values in the probe's JSON that the parsed facts do not hold as they were."""
    if path in NOT_KEPT:
        return []
    if isinstance(raw, dict):
        if path == "infiniband":  # device -> port -> state: the checks read the device names
            return [] if tuple(raw) == parsed else [path]
        lost = []
        for key, value in raw.items():
            where = f"{path}.{key}" if path else key
            if isinstance(parsed, Mapping):
                got = parsed.get(key, "<missing>")
            else:
                got = getattr(parsed, RENAMED.get(where, key), "<missing>")
            lost += _lost(value, got, where)
        return lost
    if isinstance(raw, list):
        if not isinstance(parsed, tuple) or len(parsed) != len(raw):
            return [path]
        return [p for i, item in enumerate(raw) for p in _lost(item, parsed[i], f"{path}[{i}]")]
    return [] if raw == parsed and type(raw) is not dict else [path]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _full_probe_sheet(tmp_path) -> str:
    """This machine's full probe: a peer `other` (this machine again) that it connects and
    streams to, the master port it owns, a torch JIT lock under its extensions dir; its stdout."""
    workdir, lock = tmp_path / "code", tmp_path / "ext" / "fused_adam" / "lock"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('hi')\n")
    lock.parent.mkdir(parents=True)
    lock.touch()
    port = _free_port()
    here = {"address": "127.0.0.1", "ports": [port], "ssh_argv": None}
    params = probe_params(
        run_id="facts",
        workdir=str(workdir),
        listen_ports=[port],
        owner_ports=[port],
        client_addresses=["127.0.0.1"],
        peers=[{"node": "solo", **here}, {"node": "other", **here}],
        test_peers=["solo", "other"],
        inbound=1,  # "other" is this probe at the same port
        quick=False,
        extensions_dir=str(tmp_path / "ext"),
        connect_timeout=2,
        skew=0,
        bandwidth_to={"node": "other", "address": "127.0.0.1", "port": port},
        bandwidth_from=True,
        bandwidth_seconds=0.2,
    )
    proc = subprocess.run(
        node.argv(sys.executable, probe),
        input=node.line(probe.main, params),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def test_a_real_probe_sheet_parses_with_nothing_lost(tmp_path):
    stdout = _full_probe_sheet(tmp_path)
    sheet = node.read_answer(stdout, probe.FactSheet, node="solo")
    facts = read_fact_sheet(f"a login banner\n{stdout}", node="solo")
    assert _lost(sheet, facts) == []
    # the parts the checks read, present in this run (not only "nothing lost" of an empty sheet)
    assert facts.hostname == socket.gethostname() and facts.hostname in facts.resolve
    assert "lo" in {i.name for i in facts.interfaces} and facts.route_to_master.dev
    assert facts.python.executable == sys.executable and facts.packages.torch
    assert facts.imports is None  # the stack phase imports, not the probe (test_doctor_collective)
    assert facts.workdir.exists is True and facts.code.sha256 and facts.memory.available
    # The planted lock; a build running on this machine (the session's background build of
    # DeepSpeed's ops on a fresh machine) holds its own locks in the default root, seen too.
    mine = [lock.path for lock in facts.jit_locks if lock.path.startswith(str(tmp_path))]
    assert mine == [str(tmp_path / "ext/fused_adam/lock")]
    assert facts.active.token == "written" and facts.active.shared == {"other": False}
    assert set(facts.active.tcp["other"].values()) == {"open"}
    assert facts.active.bandwidth_in["other"].bytes > 0
    assert [e.pid for e in facts.listening if e.pid] == [facts.pid]
    assert facts.client_names["127.0.0.1"].seconds is not None


def test_the_recording_parses_with_nothing_lost():
    for host, sheet in recorded_sheets().items():
        assert _lost(sheet, parse_fact_sheet(sheet, node=host)) == [], host


@pytest.mark.parametrize("version", [0, 2, "1", 1.0, None, True])
def test_a_sheet_from_another_probe_version_is_refused_naming_the_node(version):
    sheet = recorded_sheets()[N2]
    sheet["probe_version"] = version
    with pytest.raises(FactSheetError) as raised:
        parse_fact_sheet(sheet, node=N2)
    assert N2 in raised.value.what and f"version {probe.PROBE_VERSION}" in raised.value.what
    assert N2 in raised.value.fix


def test_json_that_is_not_an_object_is_refused_naming_the_node():
    with pytest.raises(FactSheetError, match="gpu-node-2 answered with list JSON"):
        parse_fact_sheet([1, 2], node=N2)


def test_a_node_answering_with_another_version_fails_in_the_survey_with_the_fix(
    tmp_path, monkeypatch
):
    """collect parses each answer once: a sheet it cannot read makes the node a failed one,
    reported as doctor reports a crashed probe (not examined, the reason and its fix)."""
    cluster = load_cluster(hosts="a,b,c")
    # recorded before client_names, jit_locks and resolver: null where a probe sends them now
    good = {**dict.fromkeys(probe.FactSheet.__required_keys__), **recorded_sheets()["gpu-node-1"]}
    answers = {
        "a": answer.MARK + json.dumps(good),
        "b": answer.MARK + json.dumps({**good, "probe_version": probe.PROBE_VERSION + 1}),
        "c": "Welcome!\n",
    }

    def fake_run(nodes, argv, stdin=None, timeout=None, on_line=None, watch=None):
        return [
            NodeResult(
                node=n.host,
                returncode=0,
                stdout=answers[n.host],
                stderr="",
                duration_s=0.1,
                failure=Failure.NONE,
            )
            for n in nodes
        ]

    monkeypatch.setattr(collect, "node_addresses", lambda c: {n.host: "127.0.0.1" for n in c.nodes})
    monkeypatch.setattr(collect, "run_on_nodes", fake_run)
    monkeypatch.setattr(collect, "_remove_tokens", lambda *a: None)
    survey = collect.collect(cluster, quick=True)
    assert list(survey.facts) == ["a"] and isinstance(survey.facts["a"], NodeFacts)
    assert sorted(survey.failed) == ["b", "c"]
    version = survey.failed["b"]
    assert version.failure is Failure.COMMAND_FAILED
    assert f"b answered with a probe version {probe.PROBE_VERSION + 1} fact sheet" in (
        version.reason()
    )
    assert "nothing on b" in version.reason()
    assert "c's probe sent no fact sheet (it printed no answer line)" in survey.failed["c"].reason()
    summaries = node_summaries(survey)
    assert summaries["b"].reachable is False and "probe version" in summaries["b"].failure


GARBAGE = {
    "hostname": ["gpu-node-2"],
    "resolve": ["gpu-node-2", "10.0.0.12"],
    "interfaces": "ens14f1",
    "route_to_master": "ens14f1",
    "client_names": ["10.0.0.11"],
    "listening": {"port": 29500},
    "firewall": "off",
    "ipv6_disabled": 1,
    "limits": [1, 2],
    "shm": [],
    "memory": "lots",
    "workdir": "/data",
    "python": None,
    "packages": "torch",
    "imports": ["torch"],
    "tools": "ninja",
    "path": ["/usr/bin"],
    "env": "NCCL_SOCKET_IFNAME=eth0",
    "gpus": "8x H100",
    "infiniband": ["mlx5_0"],
    "jit_locks": "/tmp/lock",
    "code": ["abc"],
    "time": "now",
    "pid": "1",
    "active": {
        "tcp": ["gpu-node-1"],
        "tcp_last_attempt": {"gpu-node-1": "late"},
        "ssh": {"gpu-node-1": "denied", "gpu-node-3": {"rc": "255"}},
        "listen": ["29500"],
        "listen_since": "early",
        "shared": {"gpu-node-1": "yes"},
        "bandwidth_in": {"gpu-node-1": {"bytes": "many", "seconds": 0.3}},
    },
}


def _garbled(sheets: dict, fields) -> dict:
    sheets = copy.deepcopy(sheets)
    for field in fields:
        sheets[N2][field] = GARBAGE[field]
    return sheets


@pytest.mark.parametrize("field", [*GARBAGE, "every field at once"])
def test_values_of_the_wrong_type_are_unknown_and_no_check_raises(tmp_path, field):
    fields = list(GARBAGE) if field == "every field at once" else [field]
    sheets = _garbled(recorded_sheets(), fields)
    survey = make_survey(tmp_path, sheets=sheets)
    started, finished = window()
    run_checks(survey, started=started, finished=finished)
    assert node_summaries(survey)[N2].reachable is True


def test_the_wrong_types_read_as_unknown(tmp_path):
    facts = parse_fact_sheet(_garbled(recorded_sheets(), GARBAGE)[N2], node=N2)
    assert facts.hostname is None and facts.resolve == {} and facts.interfaces is None
    assert facts.route_to_master is None and facts.client_names == {} and facts.listening == ()
    assert facts.firewall == Firewall() and facts.ipv6_disabled is None
    assert facts.shm == Disk() and facts.memory.available is None and facts.workdir.path is None
    assert facts.python.executable is None and facts.packages.torch is None
    assert facts.imports is None and facts.tools == {} and facts.path == "" and facts.env == {}
    assert facts.gpus is None and facts.infiniband == () and facts.jit_locks == ()
    assert facts.code is None and facts.time is None and facts.pid is None
    active = facts.active
    assert active.tcp == {} and active.tcp_last_attempt == {"gpu-node-1": {}}
    assert active.ssh == {} and active.listen == {} and active.listen_since is None
    assert active.shared == {} and active.bandwidth_in == {}
    # a sheet of nothing but its version: every check runs on it and finds nothing to judge
    empty = {host: {"probe_version": probe.PROBE_VERSION} for host in NODES}
    survey = make_survey(tmp_path, sheets=empty)
    assert all(
        dataclasses.asdict(f) == dataclasses.asdict(NodeFacts()) for f in survey.facts.values()
    )
    started, finished = window()
    assert {f.id for f in run_checks(survey, started=started, finished=finished)} <= {
        "hostname-loopback",  # no address known for a node's own name: as before the parser
        "torch-missing",  # a warning: torch on no node
        "remote-env-differs",  # tools on this machine's PATH, on no node's
        "pdsh-missing",
    }


def test_partial_entries_keep_what_is_well_formed():
    facts = facts_of(
        {
            "interfaces": [{"name": "eth0", "up": True, "mtu": "1500"}, {"up": True}, "lo"],
            "gpus": {"devices": [{"index": "0", "memory.total": "81559"}, "H100"], "processes": {}},
            "jit_locks": [
                {"path": "/a/lock", "age_s": 90, "busy_pids": [12]},
                {"path": "/b/lock", "age_s": 90, "busy_pids": ["12"]},  # holders unreadable
            ],
            "tools": {"ninja": None, "nvcc": 3},
        }
    )
    assert [(i.name, i.up, i.mtu) for i in facts.interfaces] == [("eth0", True, None)]
    assert [d.memory_mib for d in facts.gpus.devices] == [81559] and facts.gpus.processes == ()
    assert [(lock.path, lock.busy_pids) for lock in facts.jit_locks] == [("/a/lock", (12,))]
    assert facts.tools == {"ninja": None}


def test_the_parsed_facts_are_frozen():
    facts = facts_of({"hostname": "gpu-node-1"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.hostname = "evil"  # type: ignore[misc]
