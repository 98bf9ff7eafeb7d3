"""`trainfleet launch`: any training script on every node from one command; fail fast; explain
hangs.

    >>> from trainfleet.cluster import load_cluster
    >>> from trainfleet.launch import LaunchOptions, prepare, launch
    >>> cluster = load_cluster(cluster_file="cluster.yaml")  # doctest: +SKIP
    >>> run_dir = Path("trainfleet-runs/r1")
    >>> options = LaunchOptions(command=("train.py", "--lr", "1e-4"))
    >>> plan, report = prepare(cluster, options, run_dir=run_dir)  # doctest: +SKIP
    >>> result = launch(plan, cluster, run_dir=run_dir)  # doctest: +SKIP

`prepare` runs a quick doctor (the preflight: its facts give each node's interface, GPUs and
the master's busy ports; its errors stop the launch) and makes the plan for the backend
(`plan.py` for ssh, `deepspeed.py` for DeepSpeed's runner; both pure); `launch` executes it
(`supervisor.py`) and, when ranks did not join, asks doctor why.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from trainfleet.cluster import Cluster
from trainfleet.doctor import DoctorReport, run_doctor
from trainfleet.doctor.checks.network import listeners_besides_probe
from trainfleet.doctor.findings import Severity
from trainfleet.errors import TrainfleetError
from trainfleet.files import write_private
from trainfleet.launch import shim, stacks
from trainfleet.launch.deepspeed import (
    DeepSpeedPlan,
    node_files_argv,
    node_files_job,
    plan_deepspeed,
    remove_job,
)
from trainfleet.launch.plan import (
    Backend,
    LaunchFacts,
    LaunchOptions,
    LaunchPlan,
    masked,
    masked_argv,
    plan_launch,
)
from trainfleet.launch.supervisor import (
    AnyPlan,
    Channel,
    LaunchResult,
    RunState,
    bootstrap_channels,
    supervise,
)
from trainfleet.remote import run_on_nodes

__all__ = ["LaunchOptions", "LaunchPlan", "LaunchResult", "RunState", "launch", "prepare"]

HANDLED_BY_LAUNCH = ("port-in-use", "hostname-loopback", "iface-mismatch")
"""Findings the launch resolves itself: a busy master port (it moves to a free one), a host
name that resolves to loopback (MASTER_ADDR is an address and gloo/NCCL get an interface, so
no rank binds or connects by that name), one interface variable for nodes whose interfaces
differ (every node's ranks get NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME set to its own interface,
over the launch shell's, cluster.yaml's and the login shell's; the plan says so per node)."""


class PreflightFailed(TrainfleetError):
    def __init__(self, report: DoctorReport) -> None:
        super().__init__(
            "the preflight doctor found errors: nothing was started",
            "fix them (see above), or pass --no-preflight to launch anyway",
        )
        self.report = report


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def launch_facts(report: DoctorReport) -> dict[str, LaunchFacts]:
    survey = report.survey
    facts = {}
    for host, info in report.nodes.items():
        if not info.get("reachable"):
            continue
        listening: set[int] = set()
        if survey and host == survey.cluster.master:
            sheet = survey.facts.get(host)
            held = listeners_besides_probe(sheet) if sheet else []
            listening = {e.port for e in held if e.port is not None}
            if any(f.id == "port-in-use" for f in report.findings):  # (doctor's own verdict)
                listening.add(survey.cluster.master_port)
        facts[host] = LaunchFacts(
            interface=info.get("interface"), gpus=info.get("gpus") or 0, listening=tuple(listening)
        )
    return facts


def blocking(report: DoctorReport) -> list:
    return [
        f for f in report.findings if f.severity is Severity.ERROR and f.id not in HANDLED_BY_LAUNCH
    ]


def check_slots(cluster: Cluster, facts: Mapping[str, LaunchFacts]) -> None:
    """A slot beyond a node's GPUs (a hostfile's `slots=8` on a 4-GPU node, `-i node:5`) is an
    error before anything starts; DeepSpeed's runner would start the ranks and fail there.
    Nodes without GPUs run their ranks on CPU and are not checked."""
    for node in cluster.nodes:
        gpus = facts.get(node.host, LaunchFacts()).gpus
        beyond = [i for i in node.gpu_ids if gpus and i >= gpus]
        if beyond:
            raise TrainfleetError(
                f"{node.host} has {gpus} GPU(s) (0-{gpus - 1}), but its slots name GPU "
                f"{beyond[0]} ({cluster.source})",
                f"give {node.host} at most slots={gpus} in the hostfile, or pick GPUs it has "
                f"with -i {node.host}:0,1",
            )


def prepare(
    cluster: Cluster,
    options: LaunchOptions,
    *,
    preflight: bool = True,
    run_dir: Path,
    dry_run: bool = False,
) -> tuple[AnyPlan, DoctorReport]:
    """The quick doctor, then the plan for options.backend. Raises PreflightFailed on its
    errors (with preflight), or TrainfleetError when a node could not be examined at all.
    `dry_run`: nothing is written anywhere, on the nodes or here (the run dir is only named)."""
    report = run_doctor(cluster, quick=True, read_only=dry_run)
    if preflight and blocking(report):
        raise PreflightFailed(report)
    unreachable = [h for h, info in report.nodes.items() if not info.get("reachable")]
    if unreachable:
        raise TrainfleetError(
            f"cannot reach {', '.join(unreachable)}", "run `trainfleet doctor` for the cause"
        )
    check_slots(cluster, launch_facts(report))
    master_addr = options.master_addr or (report.survey.master_addr if report.survey else None)
    if not master_addr:
        raise TrainfleetError(
            f"the master {cluster.master} has no address this machine can resolve",
            "use its address in the cluster spec, or add it to /etc/hosts",
        )
    common = dict(master_addr=master_addr, launch_env=dict(os.environ), launch_cwd=os.getcwd())
    if options.backend == Backend.DEEPSPEED:
        if shutil.which("pdsh") is None:
            raise TrainfleetError(
                "DeepSpeed's runner needs pdsh on this machine", "apt-get install pdsh"
            )
        plan = plan_deepspeed(
            cluster, launch_facts(report), options, run_dir=run_dir, python=sys.executable, **common
        )
    else:
        plan = plan_launch(cluster, launch_facts(report), options, **common)
    return plan, report


def _env_record(plan: AnyPlan) -> str:
    """Each node's environment, secrets masked: what the run dir keeps."""
    if isinstance(plan, DeepSpeedPlan):
        envs = {e["host"]: e["env"] for e in plan.node_table}
    else:
        envs = {n.host: n.env for n in plan.nodes}
    return "".join(
        f"{host}: {k}={v}\n" for host, env in envs.items() for k, v in sorted(masked(env).items())
    )


def launch(
    plan: AnyPlan, cluster: Cluster, *, run_dir: Path, out=None, restarts: list | None = None
) -> LaunchResult:
    """Run the plan; a run whose ranks did not all join gets doctor's findings as diagnosis."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(run_dir / "env.txt", _env_record(plan))
    about = {
        "run_id": plan.options.run_id,
        "backend": plan.options.backend,
        "command": masked_argv(plan.options.command),
        "master": f"{plan.master_addr}:{plan.master_port}",
        "world_size": plan.world_size,
        "ranks": {host: [r.start, r.stop - 1] for host, r in plan.rank_ranges().items()},
    }
    write_private(run_dir / "run.json", json.dumps(about, indent=2) + "\n")

    def diagnose() -> list:
        report = run_doctor(cluster, quick=True)
        return [f for f in report.findings if f.severity >= Severity.WARNING]

    def dump_stacks(pids: dict[str, dict[int, int]]) -> dict[str, str]:
        nodes = [n for n in cluster.nodes if n.host in pids]
        argv = {
            n.host: [n.python, "-c", stacks.JOB, *(f"{r}={pid}" for r, pid in pids[n.host].items())]
            for n in nodes
        }
        # Bounded: a node whose link is down must not hold up the stop for long.
        results = run_on_nodes(nodes, argv, timeout=stacks.DUMP_TIMEOUT_S + 5)
        return {r.node: r.stdout if r.ok else _no_dump(pids[r.node], r.reason()) for r in results}

    if not isinstance(plan, DeepSpeedPlan):
        channels = bootstrap_channels(plan, cluster)
        return supervise(plan, channels, run_dir=run_dir, out=out, diagnose=diagnose,
                         dump_stacks=dump_stacks, restarts=restarts)  # fmt: skip

    (run_dir / "hostfile").write_text(plan.hostfile)
    write_private(run_dir / "deepspeed_env", plan.ds_env)
    python = {n.host: node_files_argv(n.python) for n in cluster.nodes}
    shim_source = Path(shim.__file__).read_text()
    pushed = run_on_nodes(
        cluster.nodes, python, stdin=node_files_job(plan, shim_source), timeout=60
    )
    failed = [r for r in pushed if not r.ok]
    if failed:
        raise TrainfleetError(
            f"could not write the run's files on {failed[0].node}: {failed[0].reason()}",
            f"check that {plan.node_dir} can be created there",
        )
    env = {k: v for k, v in os.environ.items() if k not in plan.unset} | plan.env
    runner = Channel(name="deepspeed", argv=plan.argv, pdsh=True, cwd=plan.cwd, env=env)
    try:
        return supervise(plan, [runner], run_dir=run_dir, out=out, diagnose=diagnose,
                         dump_stacks=dump_stacks, restarts=restarts)  # fmt: skip
    finally:
        # DeepSpeed's runner stops its ranks by name (pkill -f); trainfleet then ends whatever
        # still carries this run's id in its environment, and removes the run's files.
        stop = {
            n.host: [n.python, "-c", KILL_BY_RUN_ID, plan.options.run_id] for n in cluster.nodes
        }
        run_on_nodes(cluster.nodes, stop, timeout=30)
        run_on_nodes(cluster.nodes, python, stdin=remove_job(plan), timeout=30)


def _no_dump(pids: dict[int, int], why: str) -> str:
    """stacks.JOB's output for ranks whose node did not answer."""
    return "".join(f"@@rank {r} pid {pid}\nno stack: the node did not answer ({why})\n"
                   for r, pid in pids.items())  # fmt: skip


KILL_BY_RUN_ID = """\
import os, signal, sys, time
tag = ("TRAINFLEET_RUN_ID=" + sys.argv[1]).encode() + b"\\0"
def job():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if tag in f.read() and int(pid) != os.getpid():
                    found.append(int(pid))
        except OSError:
            pass
    return found
for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
    for pid in job():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    deadline = time.time() + wait
    while job() and time.time() < deadline:
        time.sleep(0.1)
"""
"""Ends every process on a node whose environment carries the run's id (python 3.8 syntax)."""
