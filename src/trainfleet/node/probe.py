"""The node probe: doctor's one program on each node; sends one FactSheet (`answer.send`).

It never imports trainfleet outside this package: a node needs only python3 for doctor. In one
run it gathers facts (names, interfaces, routes, listeners, firewall, limits, memory, disk,
software, GPUs) and, at the same time, runs the active tests whose other end is the other
nodes' probes: it listens on the ports the launch node chose for it, connects to every peer's
ports, ssh's to every peer (itself included) and writes a token that peers look for (shared
storage). Every peer starts at the same moment, so a connect refused means "not listening yet"
and is retried until the deadline, while a timeout means a firewall dropped it.
`trainfleet.doctor.facts` parses the sheet and checks PROBE_VERSION.

The same moment, also on a busy machine: with `barrier` set, the probe says `started` on stderr
(MARK) as soon as it runs and `alive PHASE` every BEAT_S, gathers its facts, then waits for one
stdin line from the launch node before it tests anyone: which peers started (the only ones it
tests and waits for) and how many connections to expect. The launch node sends it once every
probe has started (`trainfleet.doctor.pace`), so ssh logins spread over half a minute do not
turn into closed ports.
"""

import json
import os
import shutil
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional, TypedDict, cast

from trainfleet.node import answer, gpus, jitlocks, network, peers, software, system

PROBE_VERSION = 1
ENV_PREFIXES = ("NCCL_", "GLOO_", "MASTER_", "TORCH_", "CUDA_", "DS_", "TP_SOCKET", "PDSH_")
TOOLS = ("nvcc", "ninja", "torchrun", "deepspeed", "pdsh", "nvidia-smi", "gcc")
MARK = "trainfleet-probe:"
BEAT_S = 1.0
CLIENT_NAME_LIMIT_S = 2.0
"""How long the master's reverse lookups of its clients may take (each rank's connection to
c10d's store pays one)."""


class Peer(TypedDict):
    """A node this probe tests (and, in `peers`, every node with an address)."""

    node: str
    address: str
    ports: List[int]
    """The ports its probe listens on."""
    ssh_argv: Optional[List[str]]
    """The ssh this node makes to it (None: `--quick`, no ssh test)."""


class BandwidthTarget(TypedDict):
    node: str
    address: str
    port: int


class ProbeParams(TypedDict):
    """`main`'s input: what `trainfleet.doctor.collect.plan_params` decided for this node."""

    node: str
    run_id: str
    """Names the shared-storage token directory, .trainfleet-doctor-RUN_ID."""
    master_name: str
    master_addr: Optional[str]
    workdir: str
    listen_ports: List[int]
    owner_ports: List[int]
    """Ports whose listening process is named (the master port)."""
    client_addresses: List[str]
    """Addresses whose reverse lookup c10d's store makes here."""
    peers: List[Peer]
    test_peers: List[str]
    """The names among `peers` this node tests (all of them up to FULL_MATRIX_UP_TO nodes)."""
    inbound: int
    """Connections its listeners wait for (replaced by the go line's behind the barrier)."""
    quick: bool
    barrier: bool
    """Say `started`, then wait for the go line before any peer test."""
    share_token: bool
    """Write the shared-storage token (False: `launch --dry-run`, nothing written)."""
    extensions_dir: Optional[str]
    connect_timeout: float
    skew: float
    """How much later than this one a peer's probe may start."""
    ssh_timeout: float
    ssh_parallel: int
    """At most this many ssh handshakes at once from this node."""
    bandwidth_to: Optional[BandwidthTarget]
    bandwidth_from: bool
    bandwidth_seconds: float


class GoLine(TypedDict):
    """The barrier's stdin line (`trainfleet.doctor.collect.go_lines`)."""

    peers: List[str]
    """The nodes whose probes started: the only ones tested and waited for."""
    inbound: int
    bandwidth_from: bool


NO_GO = GoLine(peers=[], inbound=0, bandwidth_from=False)
"""Stdin ended without the go line: no peer is tested."""


class FactSheet(TypedDict):
    """`main`'s answer, parsed once by `trainfleet.doctor.facts.parse_fact_sheet` (which reads
    each value by its type: a node's words are untrusted)."""

    probe_version: int
    node: str
    pid: int
    time: float
    hostname: str
    fqdn: str
    resolve: Dict[str, Any]
    interfaces: List[Dict[str, Any]]
    route_to_master: Optional[Dict[str, Any]]
    client_names: Dict[str, Any]
    resolver: Dict[str, Any]
    listening: List[Dict[str, Any]]
    firewall: Dict[str, Any]
    ipv6_disabled: Optional[str]
    port_range: Optional[str]
    limits: Dict[str, Any]
    shm: Optional[Dict[str, Any]]
    memory: Dict[str, Any]
    workdir: Dict[str, Any]
    python: Dict[str, str]
    packages: Dict[str, str]
    tools: Dict[str, Optional[str]]
    path: str
    cuda_home: Optional[str]
    env: Dict[str, str]
    gpus: Any
    infiniband: Any
    jit_locks: List[Dict[str, Any]]
    code: Optional[str]
    active: Dict[str, Any]
    """The peer tests' results (`peers.active_tests`), the listeners', the token's."""
    seconds: float


def say(words):
    """One line for the launch node (MARK, then `words`) on stderr, where the sheet is not."""
    sys.stderr.write("%s %s\n" % (MARK, words))
    sys.stderr.flush()


class Beat:
    """`alive PHASE` every BEAT_S from a thread of its own: the probe works while it says so."""

    def __init__(self, phase):
        self.phase = phase
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()

    def _run(self):
        while True:
            time.sleep(BEAT_S)
            say("alive " + self.phase)


def wait_for_go(params: ProbeParams, beat: Beat) -> Optional[GoLine]:
    """The launch node's GoLine; None where the probe is not run behind the barrier, NO_GO
    where stdin ended without it."""
    if not params["barrier"]:
        return None
    beat.phase = "waiting"
    line = sys.stdin.readline()
    try:
        go = json.loads(line)
    except ValueError:
        return NO_GO
    if not isinstance(go, dict):
        return NO_GO
    return cast(GoLine, go)  # the launch node's own line (collect.go_lines), read as sent


def tested(params: ProbeParams, go: Optional[GoLine]) -> ProbeParams:
    """The parameters of the active tests: those of `params`, but for the peers that did not
    start (behind the barrier)."""
    if go is None:
        return params
    names = set(go["peers"])
    params = params.copy()
    params["peers"] = [p for p in params["peers"] if p["node"] in names]
    params["inbound"] = go["inbound"]
    params["bandwidth_from"] = go["bandwidth_from"]
    target = params["bandwidth_to"]
    if target and target["node"] not in names:
        params["bandwidth_to"] = None
    return params


def main(params: ProbeParams) -> None:
    """Gathers the facts, runs the peer tests, sends the FactSheet (`answer.send`)."""
    if params["barrier"]:
        say("started")
    beat = Beat("facts")
    started = time.time()
    workdir = params["workdir"]
    me = params["node"]
    active: Dict[str, Any] = {}
    listeners = peers.Listeners(params["listen_ports"])
    active["listen_since"] = time.time()
    token_dir = os.path.join(workdir, ".trainfleet-doctor-%s" % params["run_id"])
    # No token (and no shared-storage facts) where the launcher promised to write nothing.
    share_token = bool(params["peers"]) and params["share_token"]
    if share_token:
        try:
            os.mkdir(token_dir)  # never makedirs: a missing workdir is a finding, not created
            open(os.path.join(token_dir, me), "w").write(str(os.getpid()))
            active["token"] = "written"
        except OSError as exc:
            active["token"] = "not written: %s" % (exc.strerror or exc)

    hostname = socket.gethostname()
    dists = software.dist_infos()
    versions = software.package_versions(dists)
    facts: FactSheet = {
        "probe_version": PROBE_VERSION,
        "node": me,
        "pid": os.getpid(),
        "time": time.time(),
        "hostname": hostname,
        "fqdn": socket.getfqdn(),
        "resolve": {name: network.resolve(name) for name in {hostname, params["master_name"]}},
        "interfaces": network.interfaces(),
        "route_to_master": network.route_to(params["master_addr"]),
        "client_names": network.client_names(params["client_addresses"], CLIENT_NAME_LIMIT_S),
        "resolver": network.resolver(),
        "listening": network.listening(set(params["owner_ports"])),
        "firewall": network.firewall(),
        "ipv6_disabled": system.read_first("/proc/sys/net/ipv6/conf/all/disable_ipv6"),
        "port_range": system.read_first("/proc/sys/net/ipv4/ip_local_port_range"),
        "limits": system.limits(),
        "shm": system.statvfs("/dev/shm"),
        "memory": system.memory(),
        "workdir": {
            "path": workdir,
            "exists": os.path.isdir(workdir),
            "disk": system.statvfs(workdir),
        },
        "python": {"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3]},
        "packages": versions,
        "tools": {tool: shutil.which(tool) for tool in TOOLS},
        "path": os.environ.get("PATH", ""),
        "cuda_home": os.environ.get("CUDA_HOME"),
        "env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)},
        "gpus": gpus.facts(),
        "infiniband": system.infiniband(),
        "jit_locks": jitlocks.jit_locks(params["extensions_dir"]),
        "code": None
        if params["quick"] or not os.path.isdir(workdir)
        else system.code_hash(workdir),
        "active": active,  # filled in below: the peer tests come after the barrier
        "seconds": 0.0,  # set when sent
    }
    waiting = time.time()
    go = wait_for_go(params, beat)
    window = time.time() if go is not None else started  # the peers' tests are timed from go
    if go is not None:
        active["go_wait"] = round(window - waiting, 3)
    beat.phase = "peers"
    params = tested(params, go)
    threads = peers.active_tests(params, active) if params["peers"] else []
    for thread in threads:
        thread.join()
    target = params["bandwidth_to"]
    if target:
        tested_ports = active.get("tcp", {}).get(target["node"], {})
        if tested_ports.get(str(target["port"])) != "open":
            active["bandwidth_send"] = "skipped: the port is not reachable"
        else:
            active["bandwidth_send"] = peers.send_stream(
                target["address"], target["port"], params["bandwidth_seconds"]
            )
    others = [p for p in params["peers"] if p["node"] != me]
    listeners.close_when(
        params["inbound"] + (1 if params["bandwidth_from"] else 0),
        window + params["connect_timeout"] + 2 * params["skew"],
    )
    active["listen"] = listeners.status
    active["listen_until"] = listeners.closed_at
    by_address = {p["address"]: p["node"] for p in others}
    active["bandwidth_in"] = {
        by_address.get(addr, addr): {"bytes": n, "seconds": round(last - first, 4)}
        for addr, (n, first, last) in listeners.streams.items()
        if n > 1 << 16
    }
    beat.phase = "sheet"
    if share_token:
        seen = set(os.listdir(token_dir)) if os.path.isdir(token_dir) else set()
        active["shared"] = {p["node"]: p["node"] in seen for p in others}
    facts["seconds"] = round(time.time() - started, 3)
    answer.send(facts)
