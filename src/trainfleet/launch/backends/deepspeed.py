"""The `deepspeed` backend: DeepSpeed's own runner (pdsh) starts the ranks, and each node still
gets its own environment. Plan pure, like the ssh backend's; the runner is one channel, which
SIGINT stops (it then stops its nodes).

    >>> plan = plan_deepspeed(cluster, facts, options, master_addr="10.0.0.11", python="python3",
    ...     launch_env={}, launch_cwd="/w", run_dir=Path("r"))  # doctest: +SKIP

What DeepSpeed's runner does by itself: the same exports on every node (only NCCL*, PYTHON*,
UCX*, MV2*, MLFLOW* and .deepspeed_env), `cd` to the launch directory, `python -m
deepspeed.launcher.launch` with the launch node's python path. What trainfleet adds:

- a hostfile and an explicit `--include` (every node and slot of the cluster spec);
- `--master_addr` (the runner's own guess is the first address of `hostname -I` on the first
  node, a docker0 as readily as the data network);
- its ssh options for pdsh (PDSH_SSH_ARGS_APPEND), and --no_ssh_check (the runner's own check
  ignores them; trainfleet's preflight has checked ssh to every node, inside a Slurm job too,
  where doctor itself reaches the nodes with srun);
- the rank shim as the script: on each node it sets that node's own environment (interface,
  DS_ACCELERATOR, cluster.yaml env, secrets) from a table written beforehand, over ssh, to a
  private directory on every node (0700/0600), and removed after the run. Each node gets only
  its own entry of the table. Secrets, by name or in a value, never appear in the pdsh command
  line, which every node's `ps` shows;
- the user's ~/.deepspeed_env and ./.deepspeed_env (or $DS_ENV_FILE) are read here, as the
  runner reads them, into that table: the runner's DS_ENV_FILE then names trainfleet's own
  file, and nothing of the user's is lost;
- `--force_multi` when a node is remote: with one node left (`-i worker-1`) the runner would
  start the ranks on this machine instead. With one local node the runner starts the ranks
  itself without pdsh and reads no env file: trainfleet's variables go in its environment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainfleet import node as node_programs
from trainfleet.cluster import Cluster
from trainfleet.cluster.dshostfile import hostfile_text
from trainfleet.doctor import DoctorReport
from trainfleet.errors import TrainfleetError
from trainfleet.launch import environment
from trainfleet.launch.backend import Channel, ChannelLine, LaunchBackend, StopBy, head_line
from trainfleet.launch.backends import over_ssh
from trainfleet.launch.environment import RUNNER_EXPORTS, env_lines, node_env
from trainfleet.launch.masking import holds_secret, masked, masked_argv
from trainfleet.launch.options import LaunchFacts, LaunchOptions, master_port
from trainfleet.node import isolated, shim
from trainfleet.node.files import put_private
from trainfleet.node.procs import kill_run
from trainfleet.privatefiles import write_private
from trainfleet.remote import run_on_nodes, ssh_options

NODE_TABLE = "node_env.json"
"""The table's index, which TRAINFLEET_NODE_ENV names: per node, its ranks and its own file."""


def node_env_file(node_rank: int) -> str:
    """The file beside the index that holds one node's variables, secrets included."""
    return f"node_env.{node_rank}.json"


@dataclass(kw_only=True, slots=True, frozen=True)
class NodeTableEntry:
    """One node of the table the shim reads: its entry goes to that node only
    (`node_files`)."""

    host: str
    first_rank: int
    slots: int
    env: dict[str, str]
    """Secrets included: the table is written 0600 on the nodes."""
    sources: dict[str, str]
    """Where each variable of env came from (environment.py's sources)."""

    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.slots)


@dataclass(kw_only=True, slots=True)
class DeepSpeedPlan:
    options: LaunchOptions
    master: str
    master_addr: str
    master_port: int
    hostfile: str
    """Text of the hostfile the runner reads."""
    node_table: list[NodeTableEntry]
    node_dir: str
    """Where the shim and the table go on every node."""
    ds_env: str
    """Text of the DS_ENV_FILE (.deepspeed_env): trainfleet's own variables, no secrets."""
    argv: list[str]
    """The runner, run on this machine."""
    env: dict[str, str]
    """Set over this machine's environment for the runner."""
    unset: list[str]
    """Variables removed from the runner's environment because they hold a secret, by name or
    in their value (MLFLOW_TRACKING_URI=https://u:pw@host): it would put them on pdsh's command
    line (it exports NCCL*, PYTHON*, UCX*, MV2*, MLFLOW* as is); the node table carries them."""
    cwd: str
    notes: list[str]

    @property
    def world_size(self) -> int:
        return sum(entry.slots for entry in self.node_table)

    def rank_ranges(self) -> dict[str, range]:
        return {entry.host: entry.ranks() for entry in self.node_table}


def _pdsh_ssh_args(cluster: Cluster) -> str:
    """One set of ssh options for every node (pdsh takes one), without the host."""
    per_node = {tuple(ssh_options(n.ssh, multiplex=False)) for n in cluster.nodes}
    if len(per_node) > 1:
        raise TrainfleetError(
            "the nodes have different ssh options, and pdsh (DeepSpeed's runner) takes one set",
            "use the ssh backend (the default), or move the options to ~/.ssh/config",
        )
    args = list(per_node.pop())
    if any(" " in a for a in args):
        raise TrainfleetError(
            "an ssh option holds a space, which pdsh's PDSH_SSH_ARGS_APPEND cannot carry",
            "use paths without spaces, or the ssh backend",
        )
    return " ".join(args)


def plan_deepspeed(
    cluster: Cluster,
    facts: Mapping[str, LaunchFacts],
    options: LaunchOptions,
    *,
    master_addr: str,
    launch_env: Mapping[str, str],
    launch_cwd: str,
    run_dir: Path,
    python: str,
) -> DeepSpeedPlan:
    """The runner's argv and environment, the hostfile, and each node's environment table."""
    if cluster.workdir and cluster.workdir != launch_cwd:
        raise TrainfleetError(
            f"DeepSpeed's runner runs the job in the launch directory ({launch_cwd}), not in "
            f"cluster.yaml's workdir ({cluster.workdir})",
            f"cd {cluster.workdir} first, or use the ssh backend",
        )
    ipv6 = [n.host for n in cluster.nodes if ":" in n.host]
    if ipv6:
        raise TrainfleetError(
            f"DeepSpeed's runner cannot name the IPv6 address {ipv6[0]} (its --include and "
            "pdsh's host list both split at ':')",
            "give the node a name in /etc/hosts or a Host alias in ~/.ssh/config and use it in "
            "the hostfile, or use the ssh backend (the default), which takes IPv6 addresses",
        )
    port, notes = master_port(cluster, facts, options)
    notes += outside_the_job_steps(cluster)
    unset = sorted(
        k for k, v in launch_env.items() if k.startswith(RUNNER_EXPORTS) and holds_secret(k, v)
    )
    user = environment.user_env(launch_env, launch_cwd)
    table, first_rank, include = [], 0, []
    for node in cluster.nodes:
        env, env_notes = node_env(cluster, node.host, facts.get(node.host, LaunchFacts()), user)
        notes += env_notes
        # DeepSpeed's launch sets CUDA_VISIBLE_DEVICES from --include.
        env.drop("CUDA_VISIBLE_DEVICES")
        table.append(
            NodeTableEntry(
                host=node.host,
                first_rank=first_rank,
                slots=node.slots,
                env=env.values,
                sources=env.sources,
            )
        )
        include.append(f"{node.host}:{','.join(str(i) for i in node.gpu_ids)}")
        first_rank += node.slots
    node_dir = f"/tmp/trainfleet-{options.run_id}"
    no_gpus = all(facts.get(n.host, LaunchFacts()).gpus == 0 for n in cluster.nodes)
    ds_env = {
        shim.RUN_ID_ENV: options.run_id,
        shim.RESTART_ENV: str(options.restart),
        "TRAINFLEET_NODE_ENV": f"{node_dir}/{NODE_TABLE}",
        # DeepSpeed's launcher passes --local_rank itself; the shim passes it on.
        shim.LOCAL_RANK_ARG_ENV: "never",
        # DeepSpeed's launcher gives a node's ranks one stdout: the shim prefixes each line
        # with its local rank, as torchrun does, so that lines can be told apart.
        "TRAINFLEET_PREFIX_OUTPUT": "1",
        **({shim.NO_PYTHON_ENV: "1"} if options.no_python else {}),
        **({"DS_ACCELERATOR": "cpu"} if no_gpus else {}),
    }
    # The runner reads DS_ENV_FILE's name under ~ and under the launch directory: an absolute
    # path is this run's file in both places, and the user's files reach the nodes in the table.
    runner_env = {
        "DS_ENV_FILE": str((run_dir / "deepspeed_env").resolve()),
        "PDSH_RCMD_TYPE": "ssh",
        "PDSH_SSH_ARGS_APPEND": _pdsh_ssh_args(cluster),
        **({"DS_ACCELERATOR": "cpu"} if no_gpus else {}),
    }
    remote = not all(node.is_local for node in cluster.nodes)
    if not remote and len(cluster.nodes) == 1:
        # One local node: the runner starts deepspeed.launcher.launch here, reading no env
        # file; its environment is what the ranks inherit.
        runner_env.update(ds_env)
    # Run in the launch directory (the runner has every node `cd` to its own), importing
    # nothing from it (`trainfleet.node.isolated`).
    runner = [
        "--hostfile",
        str((run_dir / "hostfile").resolve()),
        "--include",
        "@".join(include),
        f"--master_addr={master_addr}",
        f"--master_port={port}",
        "--no_ssh_check",
        # One remote node (`-i worker-1`) would otherwise run its ranks on this machine.
        *(["--force_multi"] if remote else []),
        f"{node_dir}/shim.py",
        *options.command,
    ]
    hostfile = hostfile_text({n.host: max(n.gpu_ids) + 1 for n in cluster.nodes})
    return DeepSpeedPlan(
        options=options,
        master=cluster.master,
        master_addr=master_addr,
        master_port=port,
        hostfile=hostfile,
        node_table=table,
        node_dir=node_dir,
        ds_env="".join(f"{k}={v}\n" for k, v in ds_env.items()),
        argv=isolated.module_argv(
            python,
            "deepspeed.launcher.runner",
            runner,
            unbuffered=True,
            version=sys.version_info if python == sys.executable else None,
        ),
        env=runner_env,
        unset=unset,
        cwd=launch_cwd,
        notes=notes,
    )


def render_deepspeed(plan: DeepSpeedPlan) -> str:
    lines = [
        head_line(plan),
        *plan.notes,
        "",
        f"on this machine, in {plan.cwd}:",
        f"  argv: {shlex.join(masked_argv(plan.argv))}",
        "  env:",
        *(f"    {k}={shlex.quote(v)}" for k, v in sorted(masked(plan.env).items())),
        *(f"    (unset {k}: a secret; the nodes get it from the table)" for k in plan.unset),
        "  hostfile:",
        *(f"    {line}" for line in plan.hostfile.splitlines()),
        "  DS_ENV_FILE (exported on every node by the runner):",
        *(f"    {line}" for line in plan.ds_env.splitlines()),
    ]
    for node_rank, entry in enumerate(plan.node_table):
        lines += [
            "",
            f"{entry.host}: ranks {entry.first_rank}-{entry.ranks()[-1]}; set in each rank by"
            f" trainfleet ({plan.node_dir}/{node_env_file(node_rank)}, 0600,"
            f" on {entry.host} only):",
        ]
        lines += env_lines(masked(entry.env), entry.sources)
    return "\n".join(lines)


def node_files(plan: DeepSpeedPlan, node_rank: int) -> dict[str, str]:
    """What goes in the run's private directory on the node_rank-th node: the shim, the index
    (the same on every node, no values) and that node's own variables. No node gets another
    node's variables, whose per-node secrets (cluster.yaml's node `env:`) are not its to read.
    Every file has its own name, so nodes that share the directory (one machine's /tmp, as the
    sandbox's nodes do) do not overwrite each other's."""
    index = [
        {
            "host": entry.host,
            "first_rank": entry.first_rank,
            "slots": entry.slots,
            "env_file": node_env_file(entry_rank),
        }
        for entry_rank, entry in enumerate(plan.node_table)
    ]
    return {
        "shim.py": node_programs.source("shim"),
        NODE_TABLE: json.dumps(index),
        node_env_file(node_rank): json.dumps(dataclasses.asdict(plan.node_table[node_rank])),
    }


def node_files_jobs(plan: DeepSpeedPlan) -> dict[str, bytes]:
    """Per node, its files into the run's private directory
    (`trainfleet.node.files.put_private`, which refuses a directory someone else made)."""
    return {
        entry.host: node_programs.line(
            put_private,
            {"dir": plan.node_dir, "files": node_files(plan, node_rank), "remove": False},
        )
        for node_rank, entry in enumerate(plan.node_table)
    }


def remove_job(plan: DeepSpeedPlan) -> bytes:
    return node_programs.line(put_private, {"dir": plan.node_dir, "files": {}, "remove": True})


_PDSH_PREFIX = re.compile(r"^([^\s:]+): (.*)$", re.DOTALL)
_PDSH_EXIT = re.compile(r"^pdsh@\S+: ([^\s:]+): ssh exited with exit code (\d+)")


def pdsh_line(text: str) -> ChannelLine:
    """`gpu-node-2: text` is gpu-node-2's; `pdsh@launch: gpu-node-2: ssh exited with exit code
    1` reports gpu-node-2's end.

    >>> pdsh_line("pdsh@launch: gpu-node-2: ssh exited with exit code 1").node_exit
    ('gpu-node-2', 1)
    """
    exited = _PDSH_EXIT.match(text)
    prefixed = _PDSH_PREFIX.match(text)
    return ChannelLine(
        node=prefixed.group(1) if prefixed else None,
        text=prefixed.group(2) if prefixed else text,
        node_exit=(exited.group(1), int(exited.group(2))) if exited else None,
    )


SSH_CHECK_TIMEOUT_S = 20.0
"""How long `ssh NODE true` may take inside a Slurm job before the node counts as unreachable."""


def ssh_reaches_job_nodes(cluster: Cluster) -> None:
    """Inside a Slurm job, doctor reaches the nodes as steps of the job, but DeepSpeed's runner
    still reaches them with pdsh over ssh, which Slurm clusters block or allow only for nodes
    where the user holds a job (pam_slurm_adopt). Refused before anything starts where ssh does
    not get through, naming the node and the backend that needs no ssh."""
    in_job = [dataclasses.replace(node, slurm=None) for node in cluster.nodes if node.slurm]
    if not in_job:
        return
    failed = [r for r in run_on_nodes(in_job, ["true"], timeout=SSH_CHECK_TIMEOUT_S) if not r.ok]
    if failed:
        raise TrainfleetError(
            f"--backend deepspeed starts ranks with pdsh over ssh, and ssh to {failed[0].node}"
            f" fails inside this Slurm job ({failed[0].reason()}"
            + (f"; {len(failed) - 1} more node(s) too" if len(failed) > 1 else "")
            + ")",
            "use --backend slurm (the default inside a job: torchrun on every node as a step"
            " of the job, DeepSpeed's ZeRO unchanged), or ask for ssh to the job's nodes",
        )


def outside_the_job_steps(cluster: Cluster) -> list[str]:
    """Inside a Slurm job (where ssh to its nodes gets through), what the runner's ranks miss.

    >>> from trainfleet.cluster import Node
    >>> from trainfleet.cluster.model import SlurmStep
    >>> n1 = Node(host="n1", slots=1, gpu_ids=(0,), python="python3", slurm=SlurmStep(job="42"))
    >>> outside_the_job_steps(Cluster(nodes=(n1,), master="n1"))[0].split(",")[0]
    'inside Slurm job 42'
    """
    job = next((node.slurm.job for node in cluster.nodes if node.slurm), None)
    if job is None:
        return []
    return [
        f"inside Slurm job {job}, DeepSpeed's runner starts the ranks over ssh (pdsh), not"
        " as steps of the job: they get no SLURM_* variables, and Slurm keeps them to the"
        " job's CPUs and GPUs only where the nodes adopt ssh sessions into the job"
        " (pam_slurm_adopt); --backend slurm starts them as steps"
    ]


class DeepSpeedBackend:
    name = "deepspeed"
    summary = "DeepSpeed's own runner (pdsh), each node still given its own environment"
    lookup_rounds = 1  # DeepSpeed's launcher joins no rendezvous of its own: the ranks only

    def preflight(self, cluster: Cluster, *, read_only: bool) -> DoctorReport:
        ssh_reaches_job_nodes(cluster)
        return over_ssh.preflight(cluster, read_only=read_only)

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
    ) -> DeepSpeedPlan:
        if shutil.which("pdsh") is None:
            raise TrainfleetError(
                "DeepSpeed's runner needs pdsh on this machine", "apt-get install pdsh"
            )
        return plan_deepspeed(
            cluster,
            facts,
            options,
            master_addr=master_addr,
            launch_env=launch_env,
            launch_cwd=launch_cwd,
            run_dir=run_dir,
            python=sys.executable,
        )

    def render(self, plan: DeepSpeedPlan) -> str:
        return render_deepspeed(plan)

    def node_envs(self, plan: DeepSpeedPlan) -> dict[str, Mapping[str, str]]:
        return {entry.host: entry.env for entry in plan.node_table}

    def start(self, plan: DeepSpeedPlan, cluster: Cluster, run_dir: Path) -> list[Channel]:
        """The runner's hostfile and env file here; the shim and each node's own part of the
        node table on every node; then the runner."""
        (run_dir / "hostfile").write_text(plan.hostfile)
        write_private(run_dir / "deepspeed_env", plan.ds_env)
        python = {n.host: node_programs.argv(n.python, put_private) for n in cluster.nodes}
        pushed = run_on_nodes(cluster.nodes, python, stdin=node_files_jobs(plan), timeout=60)
        failed = [r for r in pushed if not r.ok]
        if failed:
            raise TrainfleetError(
                f"could not write the run's files on {failed[0].node}: {failed[0].reason()}",
                f"check that {plan.node_dir} can be created there",
            )
        env = {k: v for k, v in os.environ.items() if k not in plan.unset} | plan.env
        # SIGINT: the runner then stops its nodes (stdin is no lifeline: it has none).
        runner = Channel(name=self.name, argv=plan.argv, stop_by=StopBy.SIGINT, demux=pdsh_line,
                         cwd=plan.cwd, env=env)  # fmt: skip
        return [runner]

    def dump_stacks(
        self, plan: DeepSpeedPlan, cluster: Cluster, pids: dict[str, dict[int, int]]
    ) -> dict[str, str]:
        return over_ssh.dump_stacks(cluster, pids)

    def stop(self, plan: DeepSpeedPlan, cluster: Cluster) -> None:
        """DeepSpeed's runner stops its ranks by name (pkill -f); trainfleet then ends whatever
        still carries this run's id in its environment, and removes the run's files."""
        procs = {n.host: node_programs.argv(n.python, kill_run) for n in cluster.nodes}
        kill = node_programs.line(kill_run, plan.options.run_id)
        run_on_nodes(cluster.nodes, procs, stdin=kill, timeout=30)
        files = {n.host: node_programs.argv(n.python, put_private) for n in cluster.nodes}
        run_on_nodes(cluster.nodes, files, stdin=remove_job(plan), timeout=30)


BACKEND: LaunchBackend[DeepSpeedPlan] = DeepSpeedBackend()
