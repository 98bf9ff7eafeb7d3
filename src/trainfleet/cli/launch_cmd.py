"""`trainfleet launch`: start a training script on every node, watch it, explain its end.

trainfleet launch -c cluster.yaml -- train.py --lr 1e-4
trainfleet launch --hostfile hostfile --dry-run -m my_pkg.train
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainfleet.cli.common import (
    CLUSTER_YAML_EXAMPLE,
    add_cluster_arguments,
    add_hang_timeout_argument,
    add_startup_timeout_argument,
    cluster_from_args,
    command_after_dashes,
    preflight_lines,
)
from trainfleet.cli.slurm_job import (
    add_slurm_arguments,
    in_job,
    requeue_if_signalled,
    submit_job,
    submits_job,
)
from trainfleet.errors import TrainfleetError
from trainfleet.launch import backends
from trainfleet.untrusted import printable_lines

if TYPE_CHECKING:
    from trainfleet.doctor import DoctorReport
    from trainfleet.doctor.findings import Finding
    from trainfleet.launch.backend import Plan
    from trainfleet.launch.result import LaunchResult

HELP = "start a training script on every node (torchrun over ssh), fail fast, explain hangs"
DESCRIPTION = """\
Runs a quick doctor first (its errors stop the launch; --no-preflight starts anyway), then
starts torchrun on every node over ssh (or, with --backend deepspeed, DeepSpeed's own runner)
with its node rank, the master address and port, one rank per slot, and the node's own
environment: NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME set to the
interface that reaches the master there, DS_ACCELERATOR=cpu where there is no GPU,
cluster.yaml's env, ~/.deepspeed_env and ./.deepspeed_env (or $DS_ENV_FILE) as DeepSpeed's
runner reads them, and from this shell what DeepSpeed's runner exports (NCCL*, PYTHON*, UCX*,
MV2*, MLFLOW*) plus PATH, LD_LIBRARY_PATH, CUDA_HOME, HF_*, WANDB_*, TORCH_*. A global
NCCL_SOCKET_IFNAME that would not work on a node is reported (iface-mismatch) and that node
gets its own interface; --dry-run shows where each variable came from. Secrets (names with
TOKEN, KEY, SECRET, PASSWORD...) reach the nodes over ssh stdin and are masked in every output
and file.

What runs: a .py file or -m MODULE with the node's python; a console script of that python
(pip's wrappers) the same way; anything else (a shell script, a binary) as an executable with
torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...), as --no-python forces.
A command that starts its own launcher (torchrun, deepspeed, accelerate launch) is refused with
the command to use instead; llamafactory-cli train, axolotl train and trl sft run the module
their launcher starts.

Every line comes back as `[node:rank] ...` and is kept in RUN_DIR/logs. When a rank fails or
a node's connection drops, every rank on every node is stopped within seconds, the first
real error across all nodes is printed with its node and rank, and trainfleet exits with
that rank's exit code. When not every rank has joined the rendezvous within --join-timeout,
the run is stopped and doctor's checks say why. Ctrl-C stops everything the same way.
With --hang-timeout (default 300 s; 0: off), a run whose ranks send heartbeats
(trainfleet.heartbeat.beat) and stop advancing is stopped after every rank's stack is dumped
and the collective it is stuck in is read from every rank's Flight Recorder (which ranks
entered it, which never did); beats with a phase before the first step (loading,
tokenizing), and the time after every rank's last step (a final save, an export), are judged
by --startup-timeout instead. With --max-restarts N, a run that failed, hung or stalled is
started again after the quick preflight, TRAINFLEET_RESTART=1, 2... telling the script.
`trainfleet status` shows the run's progress from another terminal."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument(
        "--backend",
        choices=list(backends.BACKENDS),
        help=backends.help_text(),
    )
    add_slurm_arguments(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print each node's exact argv and environment (secrets masked); start nothing "
        "and write nothing, on the nodes or here",
    )
    parser.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=int,
        metavar="PORT",
        help="the rendezvous port on the master (default: cluster.yaml's, else 29500; a busy "
        "one moves to the next free port, and says so)",
    )
    parser.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        metavar="ADDR",
        help="the address every rank connects to for the rendezvous (default: the master's "
        "address as this machine resolves it, checked by the preflight)",
    )
    parser.add_argument(
        "--join-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="stop and diagnose when not every rank joined the rendezvous by then (default 60)",
    )
    add_hang_timeout_argument(parser)
    add_startup_timeout_argument(parser)
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="after a crash, a lost node, a hang or a rendezvous timeout: stop everything, "
        "rerun the quick preflight and start the command again, up to N times; every rank "
        "gets TRAINFLEET_RESTART=1, 2... so the script can resume from its checkpoint; each "
        "cause goes to RUN_DIR/restarts.jsonl (default 0)",
    )
    parser.add_argument(
        "--no-preflight",
        dest="preflight",
        action="store_false",
        help="start even when the quick doctor finds errors",
    )
    parser.add_argument(
        "--local-rank-arg",
        choices=("auto", "always", "never"),
        default="auto",
        help="pass --local_rank=N to the script (auto: when its source defines the option)",
    )
    parser.add_argument(
        "--run-dir", metavar="DIR", help="logs go here (default: trainfleet-runs/RUN_ID)"
    )
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON at the end")
    parser.add_argument(
        "--no-python",
        "--no_python",
        dest="no_python",
        action="store_true",
        help="run the first word as an executable, not with python (torchrun's --no-python); "
        "without it, a first word that is no .py file and no Python console script of the "
        "node's python runs as an executable anyway",
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module (python -m)")
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- SCRIPT.py [ARGS]",
        help="what to run: a .py file, -m MODULE, a console script (llamafactory-cli train, "
        "axolotl train, trl sft run their module), a shell script or any executable on the nodes",
    )
    parser.epilog = CLUSTER_YAML_EXAMPLE


def _command(args: argparse.Namespace) -> tuple[str, ...]:
    """What every rank runs; a launcher inside it (torchrun, deepspeed, accelerate launch) is
    refused with the command to use instead (launch/entry.py)."""
    from trainfleet.launch.entry import entry_command

    rest = command_after_dashes(args.command)
    if args.module:
        rest = ["-m", args.module, *rest]
    if not rest:
        raise TrainfleetError("no script given", "trainfleet launch [options] -- train.py [ARGS]")
    command, note = entry_command(tuple(rest), os.environ)
    if note:
        print(f"trainfleet: {note}", file=sys.stderr)
    return command


def _render_findings(findings: Sequence[Finding]) -> list[str]:
    from trainfleet.doctor.report import finding_lines

    return [line for f in findings for line in finding_lines(f, indent="  ", max_evidence=6)]


def render_outcome(result: LaunchResult, plan: Plan) -> str:
    from trainfleet.launch import RunState
    from trainfleet.launch.collectives import describe
    from trainfleet.launch.rootcause import known_fix

    logs = result.run_dir / "logs"
    head = f"trainfleet: {result.state.value} after {result.seconds:.1f} s"
    lines = [head]
    if result.state is RunState.DONE:
        lines[0] += f": all {plan.world_size} rank(s) on {len(plan.rank_ranges())} node(s) finished"
    root = result.root_cause
    if root and result.state is not RunState.DONE:
        where = f"{root.node} rank {root.rank}" if root.rank is not None else root.node
        lines.append(f"root cause: {where}: {root.text}")
        fix = known_fix(root.text)
        if fix:
            lines.append(f"  fix: {fix}")
        log = f"{root.node}.rank{root.rank}.log" if root.rank is not None else f"{root.node}.log"
        lines.append(f"  its log: {logs / log}")
    elif result.state is RunState.FAILED and result.first_failure:
        lines.append(f"root cause: {result.first_failure} ended first (no error text seen)")
    if result.state is RunState.HUNG and result.hang:
        hang, report = result.hang, result.hang.report
        finding, headline = hang.headline()
        lines.append(f"{finding}: {headline}; behind:")
        lines += [f"  {b.node} rank {b.rank}: {b.where}" for b in hang.behind]
        nodes = {r: host for host, ranks in plan.rank_ranges().items() for r in ranks}
        stuck = report.collectives if report else None
        lines += [f"  stuck in {describe(c, nodes)}" for c in stuck or ()]
        lines.append(f"  every rank's stack: {report.stacks if report else None}")
    if result.state is RunState.STALLED:
        missing = [
            f"{node} (rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))})"
            for node, r in result.not_joined.items()
        ]
        lines.append(f"not joined: {', '.join(missing)}")
        if result.diagnosis:
            lines.append("why (doctor, between the nodes):")
            lines += _render_findings(result.diagnosis)
        else:
            lines.append(
                "doctor found no network cause between the nodes: see the ranks' last lines "
                f"in {logs}"
            )
    if result.restarts:
        lines.append(f"after {len(result.restarts)} restart(s):")
        lines += [f"  {r['attempt']}. {r['cause']}" for r in result.restarts]
    lines.append(f"exit code {result.exit_code}; logs: {logs}")
    return printable_lines("\n".join(lines))  # it quotes ranks, py-spy and nodes


def run(args: argparse.Namespace) -> int:
    from trainfleet.launch import LaunchOptions, PreflightFailed, new_run_id, prepare
    from trainfleet.launch.restarts import launch_with_restarts, slurm_restart

    if args.max_restarts < 0:
        raise TrainfleetError(f"--max-restarts {args.max_restarts}", "pass 0 or more")
    command = _command(args)
    run_id = new_run_id()
    run_dir = Path(args.run_dir or f"trainfleet-runs/{run_id}")
    if submits_job(args):
        return submit_job(args, run_dir=str(run_dir.absolute()), directory=run_dir)
    cluster = cluster_from_args(args)
    job = in_job(args)
    requeued = []
    if job.restart and job.job_id:  # Slurm started this job again: the script resumes
        requeued = slurm_restart(run_dir / "restarts.jsonl", job=job.job_id,
                                 restart=job.restart, run_id=run_id)  # fmt: skip
        run_dir = run_dir.with_name(f"{run_dir.name}.requeue-{job.restart}")
    options = LaunchOptions(
        command=command,
        backend=args.backend or backends.default_for(cluster),
        master_port=args.master_port,
        master_addr=args.master_addr,
        local_rank_arg=args.local_rank_arg,
        no_python=args.no_python,
        run_id=run_id,
        join_timeout=args.join_timeout,
        hang_timeout=args.hang_timeout or None,
        startup_timeout=args.startup_timeout or None,
        preempt_signal=job.preempt_signal,
        restart=job.restart,
    )

    def print_notes(plan: Plan, _report: DoctorReport) -> None:
        for note in plan.notes:
            print(printable_lines(f"trainfleet: {note}"), file=sys.stderr)

    try:
        if args.dry_run:
            plan, _ = prepare(
                cluster, options, preflight=args.preflight, run_dir=run_dir, dry_run=True
            )
            print(backends.backend_for(plan).render(plan))
            return 0
        result, plan = launch_with_restarts(
            cluster,
            options,
            max_restarts=args.max_restarts,
            run_dir_of=lambda o: (
                run_dir
                if o.run_id == options.run_id
                else run_dir.with_name(f"{run_dir.name}.restart-{o.restart}")
            ),
            log=run_dir / "restarts.jsonl",
            then="the command starts again with TRAINFLEET_RESTART set (resuming is the script's)",
            preflight=args.preflight,
            on_first_plan=print_notes,
            # With --json, stdout holds only the JSON outcome: the ranks' lines go to stderr.
            out=sys.stderr if args.json else sys.stdout,
            requeued=requeued,
        )
    except PreflightFailed as exc:
        print("\n".join(preflight_lines(exc.report.findings, args)), file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(render_outcome(result, plan), file=sys.stderr)
    if requeue_if_signalled(job, result.signalled):
        return 0
    return result.exit_code
