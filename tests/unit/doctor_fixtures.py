"""Doctor test helpers: a `Survey` built from the recorded healthy 3-node fact sheets.

    >>> survey = make_survey(tmp_path)                      # doctest: +SKIP
    >>> sheets = sheets_of(survey)                          # the JSON, to edit
    >>> sheets["gpu-node-2"]["interfaces"][1]["mtu"] = 1280
    >>> survey = reparsed(survey, sheets)                   # parsed as collect parses

`healthy3.json` was recorded by `collect()` on a clean 3-node sandbox (gpu-node-1..3 on
ens14f0..2, master gpu-node-1); each test derives its broken variant by editing a deep copy of
the JSON sheets, which then go through `parse_fact_sheet`, as a node's answer does in collect.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import random
import types
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from trainfleet.cluster import load_cluster, parse_cluster_yaml
from trainfleet.doctor.checks import software
from trainfleet.doctor.collect import Survey, plan_params
from trainfleet.doctor.facts import NodeFacts, parse_fact_sheet
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.node import probe
from trainfleet.remote import NodeResult

FIXTURE = Path(__file__).parent / "fixtures" / "doctor" / "healthy3.json"
NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
MASTER = "gpu-node-1"
MASTER_ADDR = "10.213.207.11"
IFACE = {"gpu-node-1": "ens14f0", "gpu-node-2": "ens14f1", "gpu-node-3": "ens14f2"}


def probe_params(**given) -> probe.ProbeParams:
    """The probe parameters `plan_params` makes for a one-node cluster `solo` at 127.0.0.1
    (quick, not behind the barrier, master name `localhost`), with `given` in their place: a
    test names what it is about, the probe still gets every key."""
    params, _ = plan_params(
        load_cluster(hosts="solo"), {"solo": "127.0.0.1"}, quick=True, rng=random.Random(0)
    )
    return probe.ProbeParams(
        **{**params["solo"], "barrier": False, "master_name": "localhost", **given}
    )


@functools.cache
def _recorded_text() -> str:
    return FIXTURE.read_text()


def recorded() -> dict:
    """A fresh copy of the whole recording (cluster_yaml, addresses, ports, facts)."""
    return json.loads(_recorded_text())


def _env_block(env: Mapping[str, str], indent: str) -> list[str]:
    return [f"{indent}env:"] + [f"{indent}  {k}: {json.dumps(v)}" for k, v in env.items()]


def cluster_yaml(
    nodes: Iterable[str] = NODES,
    *,
    env: Mapping[str, str] | None = None,
    node_env: Mapping[str, Mapping[str, str]] | None = None,
    slots: Mapping[str, int] | None = None,
) -> str:
    """The recorded cluster.yaml with its `nodes:` list (and env) replaced."""
    head = recorded()["cluster_yaml"].split("\nnodes:\n")[0]
    lines = [head] + (_env_block(env, "") if env else []) + ["nodes:"]
    for host in nodes:
        lines += [f"- host: {host}", f"  slots: {(slots or {}).get(host, 1)}"]
        if node_env and host in node_env:
            lines += _env_block(node_env[host], "  ")
    return "\n".join(lines) + "\n"


def recorded_sheets(nodes: Iterable[str] = NODES) -> dict[str, dict]:
    """The recorded JSON fact sheets for `nodes` (fresh copies, to edit); a node beyond the
    recording is a copy of gpu-node-3 under its own name."""
    data = recorded()
    sheets = {}
    for host in nodes:
        if host in data["facts"]:
            sheets[host] = copy.deepcopy(data["facts"][host])
        else:
            sheets[host] = copy.deepcopy(data["facts"]["gpu-node-3"])
            sheets[host].update(node=host, hostname=host, fqdn=host)
            sheets[host]["resolve"] = {
                host: {"addresses": ["10.213.207.99"]},
                MASTER: {"addresses": [MASTER_ADDR]},
            }
    return sheets


def facts_of(sheet: dict, node: str = "node") -> NodeFacts:
    """A (partial) JSON fact sheet parsed as collect parses a node's: the probe's version is
    filled in when the sheet does not say it."""
    return parse_fact_sheet({"probe_version": probe.PROBE_VERSION, **sheet}, node=node)


def make_survey(
    tmp_path: Path,
    *,
    nodes: Iterable[str] = NODES,
    sheets: Mapping[str, dict] | None = None,
    env: Mapping[str, str] | None = None,
    node_env: Mapping[str, Mapping[str, str]] | None = None,
    slots: Mapping[str, int] | None = None,
    failed: Mapping[str, NodeResult] | None = None,
    launch_env: Mapping[str, str] | None = None,
) -> Survey:
    """A Survey of the recorded facts for `nodes` (or of `sheets`, the recording as edited by
    a test), each sheet parsed by `parse_fact_sheet`. Nodes in `failed` get no fact sheet."""
    nodes = tuple(nodes)
    data = recorded()
    path = tmp_path / "cluster.yaml"
    path.write_text(cluster_yaml(nodes, env=env, node_env=node_env, slots=slots))
    cluster = parse_cluster_yaml(path.read_text(), str(path))
    raw = recorded_sheets(nodes) if sheets is None else sheets
    facts = {
        host: parse_fact_sheet(raw[host], node=host)
        for host in nodes
        if host in raw and host not in (failed or {})
    }
    return Survey(
        cluster=cluster,
        addresses={h: data["addresses"].get(h, "10.213.207.99") for h in nodes},
        master_addr=data["master_addr"],
        ports={h: data["ports"].get(h, [45000, 45001]) for h in nodes},
        facts=facts,
        failed=dict(failed or {}),
        quick=False,
        launch_env=dict(launch_env or {}),
    )


def sheets_of(survey: Survey) -> dict[str, dict]:
    """The recorded JSON sheets of the survey's examined nodes, to edit and then parse again
    with `reparsed` (the survey's own facts are frozen)."""
    return recorded_sheets(survey.facts)


def reparsed(survey: Survey, sheets: Mapping[str, dict]) -> Survey:
    """`survey` with its facts parsed from `sheets` (as edited by a test), as collect parses."""
    facts = {host: parse_fact_sheet(sheet, node=host) for host, sheet in sheets.items()}
    return dataclasses.replace(survey, facts=facts)


def window() -> tuple[float, float]:
    """(started, finished) around the recorded probe times, as run_doctor would measure."""
    times = [f["time"] for f in recorded()["facts"].values()]
    return min(times) - 1.0, max(times) + 1.0


def stub_which(monkeypatch: pytest.MonkeyPatch, present: Iterable[str] = ("pdsh",)) -> None:
    """What `shutil.which` finds on this (the launch) machine, for the software checks only."""
    present = set(present)

    def which(name: str, *args: object, **kwargs: object) -> str | None:
        return f"/usr/bin/{name}" if name in present else None

    monkeypatch.setattr(software, "shutil", types.SimpleNamespace(which=which))


def with_id(findings: Iterable[Finding], pitfall_id: str) -> list[Finding]:
    return [f for f in findings if f.id == pitfall_id]


def expect_one(
    findings: Iterable[Finding],
    pitfall_id: str,
    severity: Severity,
    nodes: tuple[str, ...],
    *,
    evidence: Iterable[str] = (),
    fix: Iterable[str] = (),
    nodes_in_evidence: bool = True,
) -> Finding:
    """The one finding with `pitfall_id`: its severity, nodes, and the words the user needs to
    see in its evidence and fix (each node named is also required in the evidence)."""
    found = with_id(findings, pitfall_id)
    assert len(found) == 1, f"expected one {pitfall_id}, got {found}"
    finding = found[0]
    assert finding.severity is severity, finding
    assert finding.nodes == nodes, finding
    assert finding.evidence and all(line.strip() for line in finding.evidence), finding
    assert finding.fix.strip(), finding
    text = "\n".join(finding.evidence)
    for word in (*(nodes if nodes_in_evidence else ()), *evidence):
        assert word in text, f"{word!r} not in evidence of {finding}"
    for word in fix:
        assert word in finding.fix, f"{word!r} not in fix of {finding}"
    return finding
