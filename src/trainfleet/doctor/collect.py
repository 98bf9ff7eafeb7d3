"""Gather facts: one probe per node, all at once, each testing its peers while it gathers.

    >>> from trainfleet.cluster import load_cluster
    >>> survey = collect(load_cluster(), quick=True)  # doctest: +SKIP
    >>> survey.facts["localhost"].hostname  # doctest: +SKIP

The launch node decides everything the probes need before they start (each node's address as
ssh resolves it, the random ports each node listens on, the ssh command each node uses for each
peer), so that the probes never have to talk to each other through the launch node.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from trainfleet import node as node_programs
from trainfleet.cluster import DEFAULT_CONNECT_TIMEOUT, Cluster, Node
from trainfleet.doctor.facts import FactSheetError, NodeFacts, read_fact_sheet
from trainfleet.doctor.pace import GoLine, Pace, ProbeTimes
from trainfleet.node import probe
from trainfleet.node.probe import MARK
from trainfleet.remote import Failure, NodeResult, run_on_nodes, ssh_hostnames, ssh_options

EPHEMERAL_PORTS = (40000, 60000)
"""Where the test listeners go: inside Linux's default ip_local_port_range (32768-60999),
where NCCL's and gloo's own listeners land."""
PORTS_PER_NODE = 2
PAIR_CONNECT_TIMEOUT_S = 3
"""How long a peer connect may take before it counts as dropped by a firewall."""
START_SKEW_S = 2
"""How long a probe keeps listening after its own tests, for peers that started later..."""
SKEW_SECONDS_PER_NODE = 0.1
"""...plus this per node: the launch node starts one ssh session per node, so the last probe
starts later on a larger cluster (on a clean cluster the probes stop waiting as soon as every
peer got through, so this costs nothing there)."""


def start_skew(count: int) -> float:
    return START_SKEW_S + SKEW_SECONDS_PER_NODE * count


FULL_MATRIX_UP_TO = 16
"""Up to this many nodes, every node tests every node (TCP to each port it listens on, and
ssh). Beyond, each node tests the master and the nodes 1, 2, 4, 8, ... places after it in the
cluster's order, and the master tests every node: each node is still the source and the target
of log2(N) + 1 tests or more, so a node that cannot reach or cannot be reached is named by
several peers, while the tests per node grow as log N, not N (32 nodes: 6 peers each instead of
31; 64: 7 instead of 63). Whatever launches the job connects every rank to the master, and
DeepSpeed's pdsh runner ssh's from the master to every node: both are tested in full.
`--all-pairs` tests every pair whatever the size."""
PEER_SSH_TIMEOUT_S = 10
"""ssh's ConnectTimeout node to node (the probe stops such an ssh after PEER_SSH_LIMIT_S)."""
PEER_SSH_LIMIT_S = 25
PEER_SSH_PARALLEL = 8
"""At most this many ssh handshakes at once from one node: N probes each opening N at the same
moment starve each other into timeouts on a loaded machine."""
PROBE_SECONDS_PER_NODE = 1
"""Extra time the full probe gets per node of the cluster (its node-to-node ssh matrix)."""
BANDWIDTH_SECONDS = 0.3
"""How long each node streams to its ring successor for the slow-link check."""
START_SPARE_S = 10
"""A probe is waited for at least ssh's connect timeout and this much to start (`Pace`), so
that a node that does not answer ssh is named by ssh's own error."""
CAP_FACTOR = 3
"""A started probe may run this many times the time its plan needs on an idle cluster
(`probe_budget`), at least CAP_MIN_S, while it says it is alive (`Pace`)."""
CAP_MIN_S = 60


@dataclass(kw_only=True, slots=True)
class Survey:
    """What the probes found: facts per reachable node, the ssh result for the others."""

    cluster: Cluster
    addresses: dict[str, str | None]
    """Each node's address as the launch node resolves it (ssh's HostName)."""
    master_addr: str | None
    ports: dict[str, list[int]]
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    """Each node's fact sheet, parsed (`doctor/facts.py`)."""
    failed: dict[str, NodeResult] = field(default_factory=dict)
    """Nodes whose probe did not run or did not answer with a fact sheet this trainfleet reads
    (then a COMMAND_FAILED result whose stderr says why, naming the node and the fix)."""
    quick: bool = False
    launch_env: dict[str, str] = field(default_factory=dict)
    times: dict[str, ProbeTimes] = field(default_factory=dict)
    """What the launch node saw of each probe: when it started, why it was stopped (`Pace`)."""


def _resolve(name: str) -> str | None:
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    address = infos[0][4][0] if infos else None
    return address if isinstance(address, str) else None  # AF_INET's (host, port): a str


def node_addresses(cluster: Cluster) -> dict[str, str | None]:
    names = ssh_hostnames(cluster.nodes)
    addresses = {host: _resolve(name) for host, name in names.items()}
    unknown = [n for n in cluster.nodes if addresses[n.host] is None and n.slurm]
    if unknown:  # a login node need not resolve the compute nodes' names: they do
        addresses.update(_own_addresses(unknown))
    return addresses


def _own_addresses(nodes: list[Node]) -> dict[str, str | None]:
    """Each node's address as it resolves its own name (`getent ahostsv4`), never loopback."""
    results = run_on_nodes(
        nodes, {n.host: ["getent", "ahostsv4", n.host] for n in nodes}, timeout=15
    )
    found: dict[str, str | None] = {}
    for result in results:
        words = [line.split()[0] for line in result.stdout.splitlines() if line.split()]
        found[result.node] = next((w for w in words if not w.startswith("127.")), None)
    return found


def _probe_argv(node: Node) -> list[str]:
    """The probe runs with the PATH cluster.yaml gives the node (what `launch` exports there,
    e.g. recorded by `trainfleet setup env`), so its tool checks see what the job will see."""
    if "PATH" in node.env:
        return ["env", f"PATH={node.env['PATH']}", *node_programs.argv(node.python, probe.main)]
    return node_programs.argv(node.python, probe.main)


def _peer_ssh_argv(peer: Node) -> list[str]:
    # A connect timeout shorter than the probe's own limit for it, so that ssh reports why.
    timeout = min(peer.ssh.connect_timeout or PEER_SSH_TIMEOUT_S, PEER_SSH_TIMEOUT_S)
    options = ssh_options(replace(peer.ssh, connect_timeout=timeout), multiplex=False)
    # Strict host keys: the N x N check must fail where a launcher's ssh would.
    # -N -v: the probe stops it at "Authenticated to"; no remote shell starts.
    return ["ssh", *options, "-oStrictHostKeyChecking=yes", "-N", "-v", "--", peer.host]


def peer_sample(hosts: list[str], master: str, *, all_pairs: bool = False) -> dict[str, list[str]]:
    """Which peers each node tests (FULL_MATRIX_UP_TO); each list includes the node itself
    (its ssh to itself), in the cluster's order.

        >>> sample = peer_sample([f"n{i}" for i in range(32)], "n0")
        >>> sample["n5"]
        ['n0', 'n5', 'n6', 'n7', 'n9', 'n13', 'n21']
        >>> len(sample["n0"]), min(sum(h in s for s in sample.values()) for h in sample)
        (32, 6)
    """
    if all_pairs or len(hosts) <= FULL_MATRIX_UP_TO:
        return {host: list(hosts) for host in hosts}
    sample = {}
    for i, host in enumerate(hosts):
        if host == master:
            sample[host] = list(hosts)
            continue
        chosen = {i, hosts.index(master)} if master in hosts else {i}
        step = 1
        while step < len(hosts):
            chosen.add((i + step) % len(hosts))
            step *= 2
        sample[host] = [hosts[j] for j in sorted(chosen)]
    return sample


def _named_by(host: str, master: str, addresses: dict[str, str | None]) -> list[str]:
    """The IPv4 addresses c10d names on `host`, in their IPv4-mapped form: the master's store
    names every client as it accepts it, and every process names the master's address as it
    connects (torch's client socket, before the connection)."""
    ipv4 = {a for a in addresses.values() if a and ":" not in a}
    if host == master:
        return sorted(ipv4)
    master_address = addresses[master]
    return [master_address] if master_address in ipv4 else []


def plan_params(
    cluster: Cluster,
    addresses: dict[str, str | None],
    *,
    quick: bool,
    rng: random.Random,
    read_only: bool = False,
    all_pairs: bool = False,
    tcp: bool = True,
) -> tuple[dict[str, probe.ProbeParams], dict[str, list[int]]]:
    """The probe parameters for every node (pure but for `rng`). `read_only`: the probes write
    nothing on the nodes (no shared-storage token, so no shared-storage facts). Without `tcp`
    no node listens or connects to another (no port, firewall or bandwidth facts): a probe
    then never waits out the connect bound on ports a firewall drops."""
    run_id = f"{rng.getrandbits(48):012x}"
    ports = {n.host: rng.sample(range(*EPHEMERAL_PORTS), PORTS_PER_NODE) for n in cluster.nodes}
    master_port = cluster.master_port
    listen: dict[str, list[int]] = {host: [] for host in ports}
    if tcp:
        listen = {h: p + ([master_port] if h == cluster.master else []) for h, p in ports.items()}
    peers = {
        n.host: probe.Peer(
            node=n.host,
            address=addresses[n.host] or "",  # kept only where there is one, below
            ports=listen[n.host],
            ssh_argv=_peer_ssh_argv(n) if n.via_ssh and not quick else None,
        )
        for n in cluster.nodes
    }
    hosts = [n.host for n in cluster.nodes]
    sample = peer_sample(hosts, cluster.master, all_pairs=all_pairs)
    inbound = {host: _inbound(host, hosts, sample, listen, addresses) for host in hosts}
    multi = len(cluster.nodes) > 1
    # Bandwidth in a ring, all links at once: node i streams to node i+1 (O(1) rounds).
    ring = [n.host for n in cluster.nodes if addresses[n.host]] if tcp else []
    successor = {h: ring[(i + 1) % len(ring)] for i, h in enumerate(ring)} if len(ring) > 2 else {}
    params = {}
    for node in cluster.nodes:
        after = successor.get(node.host)
        params[node.host] = probe.ProbeParams(
            node=node.host,
            run_id=run_id,
            master_name=cluster.master,
            master_addr=addresses[cluster.master],
            workdir=cluster.workdir or os.getcwd(),
            listen_ports=listen[node.host] if multi else [],
            owner_ports=[master_port],
            client_addresses=_named_by(node.host, cluster.master, addresses) if multi else [],
            peers=[p for p in peers.values() if p["address"]] if multi else [],
            test_peers=sample[node.host],
            inbound=inbound[node.host],
            quick=quick,
            barrier=True,
            share_token=not read_only,
            extensions_dir=node.env.get("TORCH_EXTENSIONS_DIR"),
            connect_timeout=PAIR_CONNECT_TIMEOUT_S,
            skew=start_skew(len(cluster.nodes)),
            ssh_timeout=PEER_SSH_LIMIT_S,
            ssh_parallel=PEER_SSH_PARALLEL,
            bandwidth_to=probe.BandwidthTarget(
                node=after, address=addresses[after] or "", port=ports[after][0]
            )
            if after
            else None,
            bandwidth_from=node.host in successor.values(),
            bandwidth_seconds=BANDWIDTH_SECONDS,
        )
    return params, ports


def _inbound(
    host: str,
    started: Collection[str],
    sample: dict[str, list[str]],
    listen: dict[str, list[int]],
    addresses: dict[str, str | None],
) -> int:
    """The connections `host`'s listeners wait for: one per port from every node in `started`
    whose sample holds it (a node without an address is no one's peer)."""
    if not addresses[host]:
        return 0
    return sum(len(listen[host]) for src in started if src != host and host in sample[src])


def go_lines(params: dict[str, probe.ProbeParams], addresses: dict[str, str | None]) -> GoLine:
    """The barrier's stdin line for each probe (`trainfleet.node.probe.wait_for_go`), given the
    nodes whose probes started: only those are tested and waited for."""
    sample = {host: p["test_peers"] for host, p in params.items()}
    listen = {host: p["listen_ports"] for host, p in params.items()}

    def line(host: str, started: frozenset[str]) -> bytes:
        go = probe.GoLine(peers=[], inbound=0, bandwidth_from=False)
        if host in started and params[host]["peers"]:
            go["peers"] = [h for h in params if h in started]
            go["inbound"] = _inbound(host, started, sample, listen, addresses)
            targets = (params[src]["bandwidth_to"] for src in started)
            go["bandwidth_from"] = any(t is not None and t["node"] == host for t in targets)
        return json.dumps(go).encode() + b"\n"

    return line


def probe_budget(count: int, quick: bool) -> float:
    """The seconds a probe needs on an idle cluster of `count` nodes (connects, skew, ssh)."""
    budget = PAIR_CONNECT_TIMEOUT_S + 2 * start_skew(count)
    budget += 5 if quick else PEER_SSH_LIMIT_S + 20
    if not quick:  # the master's probe makes N ssh handshakes: more time when N is large
        budget += PROBE_SECONDS_PER_NODE * count
    return budget


def strip_marks(result: NodeResult) -> NodeResult:
    """The result without the probe's lines for the launch node (`Pace`)."""
    kept = [ln for ln in result.stderr.splitlines(keepends=True) if not ln.startswith(MARK)]
    return replace(result, stderr="".join(kept))


def collect(
    cluster: Cluster,
    *,
    quick: bool = False,
    seed: int | None = None,
    read_only: bool = False,
    all_pairs: bool = False,
    tcp: bool = True,
) -> Survey:
    """Run the probe on every node at once and return what came back; with `read_only` the
    probes write nothing anywhere (what `launch --dry-run` promises); `all_pairs`: every node
    tests every node however many there are (FULL_MATRIX_UP_TO); without `tcp` no node-to-node
    TCP test (plan_params)."""
    addresses = node_addresses(cluster)
    rng = random.Random(seed if seed is not None else secrets.randbits(64))
    params, ports = plan_params(
        cluster, addresses, quick=quick, rng=rng, read_only=read_only, all_pairs=all_pairs, tcp=tcp
    )
    survey = Survey(
        cluster=cluster,
        addresses=addresses,
        master_addr=addresses.get(cluster.master),
        ports=ports,
        quick=quick,
        launch_env=dict(os.environ),
    )
    argv = {n.host: _probe_argv(n) for n in cluster.nodes}
    payloads = {host: node_programs.line(probe.main, p) for host, p in params.items()}
    budget = probe_budget(len(cluster.nodes), quick)
    connect = max(n.ssh.connect_timeout or DEFAULT_CONNECT_TIMEOUT for n in cluster.nodes)
    pace = Pace(
        [n.host for n in cluster.nodes],
        start_min=connect + START_SPARE_S,
        cap=max(CAP_FACTOR * budget, CAP_MIN_S),
        go_line=go_lines(params, addresses),
    )
    results = run_on_nodes(cluster.nodes, argv, stdin=payloads, watch=pace)
    results = [strip_marks(r) for r in results]
    survey.times = {n.host: pace.times(n.host) for n in cluster.nodes}
    for node, result in zip(cluster.nodes, results, strict=True):
        facts = _fact_sheet(result)
        if isinstance(facts, NodeFacts):
            survey.facts[node.host] = facts
        else:
            survey.failed[node.host] = facts
    _remove_tokens(cluster, results, params)
    return survey


def _fact_sheet(result: NodeResult) -> NodeFacts | NodeResult:
    """The node's facts, parsed once here; else the result to report: as it came when the probe
    did not succeed, or as a failed command saying why its answer is no fact sheet."""
    if not result.ok:
        return result
    try:
        return read_fact_sheet(result.stdout, node=result.node)
    except FactSheetError as exc:
        return replace(result, failure=Failure.COMMAND_FAILED, stderr=str(exc))


PROBE_RAN = (Failure.NONE, Failure.TIMED_OUT, Failure.COMMAND_FAILED)
"""Outcomes after which a node's probe may have written its shared-storage token."""


def _remove_tokens(
    cluster: Cluster, results: list[NodeResult], params: dict[str, probe.ProbeParams]
) -> None:
    """The shared-storage tokens: removed from every node whose probe ran, also where it timed
    out or its fact sheet did not come back (such runs left .trainfleet-doctor-* behind)."""
    ran = {r.node for r in results if r.failure in PROBE_RAN}
    nodes = [
        n
        for n in cluster.nodes
        if n.host in ran and params[n.host]["peers"] and params[n.host].get("share_token", True)
    ]
    if nodes:
        token_dir = {
            n.host: [
                "rm",
                "-rf",
                "--",
                os.path.join(
                    params[n.host]["workdir"], f".trainfleet-doctor-{params[n.host]['run_id']}"
                ),
            ]
            for n in nodes
        }
        run_on_nodes(nodes, token_dir, timeout=15)
