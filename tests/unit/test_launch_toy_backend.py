"""A third backend is one module that implements `launch/backend.py`'s `LaunchBackend` and is
registered: this test module is that module for a toy backend, and a job runs through it end to
end from `trainfleet launch --backend toy` (the CLI's choices come from the registry), through
`prepare` (the toy's preflight), `launch` and the real supervisor, with real local processes.

The toy starts each node's one rank on this machine, under trainfleet's real rank shim: the
first node's through trainfleet's bootstrap (its stdin the lifeline: keepalives, stopped by
closing it), the others' directly (stopped by SIGINT), so that both ways a channel says it is
stopped are gone through. Its stack dumper reads the ranks' own /proc status.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trainfleet import node as node_programs
from trainfleet.cli.main import main
from trainfleet.cluster import Cluster
from trainfleet.doctor import DoctorReport, NodeSummary
from trainfleet.launch import backends
from trainfleet.launch.backend import LIFELINE_S, Channel, StopBy, head_line
from trainfleet.launch.options import LaunchFacts, LaunchOptions
from trainfleet.node import bootstrap

pytestmark = pytest.mark.unit

JOB = """\
import os, sys, time
from pathlib import Path

from trainfleet import heartbeat

rank = int(os.environ["RANK"])
Path(sys.argv[1], f"rank{rank}.pid").write_text(str(os.getpid()))
print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']} on {os.environ['TRAINFLEET_NODE']}")
what = sys.argv[2] if len(sys.argv) > 2 else "done"
if what == "hang":
    heartbeat.beat(1)
    time.sleep(120)
elif what.startswith("fail"):
    if rank == int(what[4:]):
        other, deadline = Path(sys.argv[1], f"rank{1 - rank}.pid"), time.time() + 60
        while not other.exists() and time.time() < deadline:  # fail once the other one runs
            time.sleep(0.05)
        print("RuntimeError: the toy rank failed", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(120)
"""


@dataclass(kw_only=True, slots=True, frozen=True)
class ToyNode:
    host: str
    rank: int
    env: dict[str, str]
    through_bootstrap: bool


@dataclass(kw_only=True, slots=True)
class ToyPlan:
    options: LaunchOptions
    master: str
    master_addr: str
    master_port: int
    nodes: list[ToyNode]
    cwd: str
    notes: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return len(self.nodes)

    def rank_ranges(self) -> dict[str, range]:
        return {n.host: range(n.rank, n.rank + 1) for n in self.nodes}


class ToyBackend:
    name = "toy"
    summary = "every node's rank a process on this machine"
    lookup_rounds = 1

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.dumped: dict[str, dict[int, int]] = {}

    def preflight(self, cluster: Cluster, *, read_only: bool) -> DoctorReport:
        self.calls.append(f"preflight read_only={read_only}")
        summary = NodeSummary(reachable=True, address=None)
        return DoctorReport(findings=[], nodes={n.host: summary for n in cluster.nodes})

    def plan(
        self,
        cluster: Cluster,
        facts: Mapping[str, LaunchFacts],
        options: LaunchOptions,
        *,
        master_addr: str,
        launch_env: Mapping[str, str],
        launch_cwd: str,
        run_dir: Path,
    ) -> ToyPlan:
        self.calls.append("plan")
        world = len(cluster.nodes)
        nodes = [
            ToyNode(
                host=node.host,
                rank=rank,
                env={
                    "RANK": str(rank),
                    "LOCAL_RANK": "0",
                    "WORLD_SIZE": str(world),
                    "TRAINFLEET_NODE": node.host,
                    "TRAINFLEET_RUN_ID": options.run_id,
                    "TRAINFLEET_LOCAL_RANK_ARG": "never",
                    "TRAINFLEET_PREFIX_OUTPUT": "1",  # `[default0]:` before each line
                },
                through_bootstrap=rank == 0,
            )
            for rank, node in enumerate(cluster.nodes)
        ]
        port = options.master_port or cluster.master_port
        return ToyPlan(
            options=options,
            master=cluster.master,
            master_addr=master_addr,
            master_port=port,
            nodes=nodes,
            cwd=launch_cwd,
        )

    def render(self, plan: ToyPlan) -> str:
        how = {True: "through trainfleet's bootstrap", False: "directly"}
        nodes = [f"{n.host}: rank {n.rank}, {how[n.through_bootstrap]}" for n in plan.nodes]
        return "\n".join([head_line(plan), *nodes])

    def node_envs(self, plan: ToyPlan) -> dict[str, Mapping[str, str]]:
        return {n.host: n.env for n in plan.nodes}

    def start(self, plan: ToyPlan, cluster: Cluster, run_dir: Path) -> list[Channel]:
        self.calls.append("start")
        shim = run_dir / "shim.py"
        shim.write_text(node_programs.source("shim"))
        channels = []
        for n in plan.nodes:
            argv = [sys.executable, str(shim), *plan.options.command]
            if not n.through_bootstrap:
                env = {**os.environ, **n.env}
                channels.append(
                    Channel(name=n.host, argv=argv, stop_by=StopBy.SIGINT, cwd=plan.cwd, env=env)
                )
                continue
            job: bootstrap.BootstrapJob = {
                "run_id": plan.options.run_id,
                "cwd": plan.cwd,
                "env": n.env,
                "argv": [sys.executable, "{SHIM}", *plan.options.command],
                "shim": shim.read_text(),
                "grace": plan.options.grace,
                "lifeline": LIFELINE_S,
            }
            argv = node_programs.argv(sys.executable, bootstrap.main)
            payload = node_programs.line(bootstrap.main, job)
            channels.append(
                Channel(name=n.host, argv=argv, payload=payload, stop_by=StopBy.CLOSING_STDIN)
            )
        return channels

    def dump_stacks(
        self, plan: ToyPlan, cluster: Cluster, pids: dict[str, dict[int, int]]
    ) -> dict[str, str]:
        self.dumped = pids
        return {
            host: "".join(f"@@rank {rank} pid {pid}\n{_status(pid)}" for rank, pid in ranks.items())
            for host, ranks in pids.items()
        }

    def stop(self, plan: ToyPlan, cluster: Cluster) -> None:
        self.calls.append("stop")


def _status(pid: int) -> str:
    """The process's State line, as `trainfleet.node.procs.dump_stacks` gives it first."""
    status = Path(f"/proc/{pid}/status")
    state = next(line for line in status.read_text().splitlines() if line.startswith("State:"))
    return state + "\n"


@pytest.fixture
def toy():
    backend = backends.register(ToyBackend())
    yield backend
    del backends.BACKENDS[backend.name]


def _launch(tmp_path: Path, *args: str, job: tuple[str, ...] = ()) -> int:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    run_dir = tmp_path / "run"
    return main(["launch", "--hosts", "toy-1:1,toy-2:1", "--backend", "toy", "--master-addr",
                 "127.0.0.1", "--run-dir", str(run_dir), *args, "--", str(script),
                 str(tmp_path), *job])  # fmt: skip


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_backend_registered_from_outside_runs_a_job_end_to_end(toy, tmp_path, capsys):
    """`--backend toy` is offered once registered; --dry-run is the toy's own text after its
    read-only preflight; a run goes preflight, plan, start, stop, each rank's line prefixed
    `[node:rank]` and logged, exit code 0."""
    assert _launch(tmp_path, "--dry-run") == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown == [
        "backend toy: 2 node(s), world size 2, master toy-1 (127.0.0.1:29500)",
        "toy-1: rank 0, through trainfleet's bootstrap",
        "toy-2: rank 1, directly",
    ]
    assert toy.calls == ["preflight read_only=True", "plan"]

    toy.calls.clear()
    assert _launch(tmp_path) == 0
    out, err = capsys.readouterr()
    assert sorted(line.split(maxsplit=1) for line in out.splitlines()) == [  # either first
        ["[toy-1:0]", "hello from rank 0 of 2 on toy-1"],
        ["[toy-2:1]", "hello from rank 1 of 2 on toy-2"],
    ]
    assert "all 2 rank(s) on 2 node(s) finished" in err and "exit code 0" in err
    assert toy.calls == ["preflight read_only=False", "plan", "start", "stop"]
    log = (tmp_path / "run" / "logs" / "toy-2.rank1.log").read_text()
    assert "hello from rank 1 of 2 on toy-2" in log


@pytest.mark.parametrize("failing", [0, 1])
def test_a_failing_rank_stops_the_other_through_its_channel(toy, tmp_path, capsys, failing):
    """Rank 1 fails: rank 0's bootstrap is stopped by closing its stdin (it then ends its job
    and exits 143); rank 0 fails: rank 1 is stopped by SIGINT. Neither is cut off after the
    grace period; the run's exit code is the failing rank's, and nothing is left."""
    assert _launch(tmp_path, "--json", job=(f"fail{failing}",)) == 3
    out, err = capsys.readouterr()
    result = json.loads(out)
    host, other = f"toy-{failing + 1}", 1 - failing
    assert result["state"] == "failed" and result["first_failure"] == host
    assert (result["root_cause"]["node"], result["root_cause"]["rank"]) == (host, failing)
    assert "RuntimeError: the toy rank failed" in result["root_cause"]["error"]
    stopped = {0: 143, 1: -signal.SIGINT}  # the bootstrap's code for "stopped by the launcher"
    assert result["node_codes"] == {host: 3, f"toy-{other + 1}": stopped[other]}
    assert "cutting it off" not in err
    assert toy.calls[-1] == "stop"
    pid = int((tmp_path / f"rank{other}.pid").read_text())
    assert _gone(pid), f"rank {other} (pid {pid}) still runs"


def test_a_hung_run_has_its_stacks_dumped_by_its_backend(toy, tmp_path, capsys):
    """Both ranks beat step 1 and sleep: past --hang-timeout the supervisor asks the toy for
    every rank's stack (by the pids in their heartbeats) before it stops them."""
    assert _launch(tmp_path, "--hang-timeout", "1", job=("hang",)) == 1
    err = capsys.readouterr().err
    pids = {rank: int((tmp_path / f"rank{rank}.pid").read_text()) for rank in (0, 1)}
    assert toy.dumped == {"toy-1": {0: pids[0]}, "toy-2": {1: pids[1]}}
    assert "rank-hung: no rank advanced past step 1" in err
    assert all(_gone(pid) for pid in pids.values())
