"""The node probe: doctor's one program on each node; prints one JSON fact sheet.

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

from trainfleet.node import jitlocks, network, peers, software, system

PROBE_VERSION = 1
ENV_PREFIXES = ("NCCL_", "GLOO_", "MASTER_", "TORCH_", "CUDA_", "DS_", "TP_SOCKET", "PDSH_")
TOOLS = ("nvcc", "ninja", "torchrun", "deepspeed", "pdsh", "nvidia-smi", "gcc")
MARK = "trainfleet-probe:"
BEAT_S = 1.0
CLIENT_NAME_LIMIT_S = 2.0
"""How long the master's reverse lookups of its clients may take (each rank's connection to
c10d's store pays one)."""


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


def wait_for_go(params, beat):
    """The launch node's word that every peer started: {"peers": [names], "inbound": count,
    "bandwidth_from": whether a peer streams to this one};
    None where the probe is not run behind the barrier, {} where stdin ended without it."""
    if not params.get("barrier"):
        return None
    beat.phase = "waiting"
    line = sys.stdin.readline()
    try:
        go = json.loads(line)
    except ValueError:
        return {}
    return go if isinstance(go, dict) else {}


def tested(params, go):
    """The parameters of the active tests: those of `params`, but for the peers that did not
    start (behind the barrier)."""
    if go is None:
        return params
    names = set(go.get("peers") or [])
    params = dict(params)
    params["peers"] = [p for p in params.get("peers", []) if p["node"] in names]
    params["inbound"] = go.get("inbound", 0)
    params["bandwidth_from"] = bool(go.get("bandwidth_from"))
    target = params.get("bandwidth_to")
    if target and target.get("node") not in names:
        params["bandwidth_to"] = None
    return params


def main(params):
    if params.get("barrier"):
        say("started")
    beat = Beat("facts")
    started = time.time()
    workdir = params.get("workdir") or os.getcwd()
    me = params["node"]
    active = {}
    listeners = peers.Listeners(params.get("listen_ports", []))
    active["listen_since"] = time.time()
    token_dir = os.path.join(workdir, ".trainfleet-doctor-%s" % params.get("run_id", "x"))
    # No token (and no shared-storage facts) where the launcher promised to write nothing.
    share_token = bool(params.get("peers")) and params.get("share_token", True)
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
    facts = {
        "probe_version": PROBE_VERSION,
        "node": me,
        "pid": os.getpid(),
        "time": time.time(),
        "hostname": hostname,
        "fqdn": socket.getfqdn(),
        "resolve": {
            name: network.resolve(name)
            for name in {hostname, params.get("master_name") or hostname}
        },
        "interfaces": network.interfaces(),
        "route_to_master": network.route_to(params.get("master_addr")),
        "client_names": network.client_names(
            params.get("client_addresses", []), CLIENT_NAME_LIMIT_S
        ),
        "resolver": network.resolver(),
        "listening": network.listening(set(params.get("owner_ports", []))),
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
        "gpus": system.gpus(),
        "infiniband": system.infiniband(),
        "jit_locks": jitlocks.jit_locks(params.get("extensions_dir")),
        "code": None
        if params.get("quick") or not os.path.isdir(workdir)
        else system.code_hash(workdir),
    }
    waiting = time.time()
    go = wait_for_go(params, beat)
    window = time.time() if go is not None else started  # the peers' tests are timed from go
    if go is not None:
        active["go_wait"] = round(window - waiting, 3)
    beat.phase = "peers"
    params = tested(params, go)
    threads = peers.active_tests(params, active) if params.get("peers") else []
    for thread in threads:
        thread.join()
    target = params.get("bandwidth_to")
    reachable = (
        active.get("tcp", {})
        .get((target or {}).get("node"), {})
        .get(str((target or {}).get("port")))
        == "open"
    )
    if target and not reachable:
        active["bandwidth_send"] = "skipped: the port is not reachable"
    elif target:
        active["bandwidth_send"] = peers.send_stream(
            target["address"], target["port"], params.get("bandwidth_seconds", 0.3)
        )
    others = [p for p in params.get("peers", []) if p["node"] != me]
    inbound = params.get("inbound", len(others) * len(listeners.sockets))
    listeners.close_when(
        inbound + (1 if params.get("bandwidth_from") else 0),
        window + params.get("connect_timeout", 3) + 2 * params.get("skew", 2),
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
    facts["active"] = active
    facts["seconds"] = round(time.time() - started, 3)
    sys.stdout.write(json.dumps(facts) + "\n")
