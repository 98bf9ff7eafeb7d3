"""The launch backends behind one protocol (launch/backend.py): the registry the CLI reads
(launch/backends/), and a channel that carries several nodes' output (DeepSpeed's runner over
pdsh) read by its own backend."""

from __future__ import annotations

import base64
import dataclasses
import inspect
import io
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from trainfleet import node
from trainfleet.cli.main import build_parser
from trainfleet.cluster import parse_cluster_yaml
from trainfleet.errors import TrainfleetError
from trainfleet.launch.backend import Channel, LaunchBackend, StopBy
from trainfleet.launch.backends import BACKENDS, backend_for, deepspeed
from trainfleet.launch.backends.deepspeed import (
    DeepSpeedPlan,
    NodeTableEntry,
    pdsh_line,
    plan_deepspeed,
    render_deepspeed,
)
from trainfleet.launch.options import LaunchFacts, LaunchOptions
from trainfleet.launch.output import MergedOutput
from trainfleet.launch.runfacts import RunFacts
from trainfleet.node import files, shim
from trainfleet.remote.failures import Failure, NodeResult

pytestmark = pytest.mark.unit

PROTOCOL = {
    name: inspect.signature(member)
    for name, member in vars(LaunchBackend).items()
    if callable(member) and not name.startswith("_")
}


def _launch_parser_backend():
    launch = build_parser()._subparsers._group_actions[0].choices["launch"]
    return next(a for a in launch._actions if a.dest == "backend")


def test_every_backend_the_cli_offers_is_registered_and_has_the_whole_protocol():
    offered = _launch_parser_backend()
    assert list(offered.choices) == list(BACKENDS) == ["ssh", "deepspeed", "slurm"]
    # No default in the parser: the cluster decides (`default_for`: slurm inside a Slurm job).
    assert offered.default is None and offered.help == (
        "ssh: torchrun on every node over ssh (default); deepspeed: DeepSpeed's own runner"
        " (pdsh), each node still given its own environment; slurm: torchrun on every node of"
        " the Slurm job, all started by one step of it (srun); from a login node, the command is"
        " submitted with sbatch and followed here (default inside a Slurm job)"
    )
    assert set(PROTOCOL) == {
        "preflight", "plan", "render", "node_envs", "start", "dump_stacks", "stop"
    }  # fmt: skip
    for name, backend in BACKENDS.items():
        assert backend.name == name and backend.summary and backend.lookup_rounds in (1, 2)
        for method, signature in PROTOCOL.items():
            mine = inspect.signature(getattr(type(backend), method))
            assert list(mine.parameters) == list(signature.parameters), (name, method)


def test_an_unknown_backend_is_an_error_naming_the_known_ones():
    with pytest.raises(TrainfleetError) as err:
        backend_for("mpirun")
    assert "no launch backend 'mpirun'" in str(err.value)
    assert err.value.fix == "use one of ssh, deepspeed, slurm"


def _ds_plan() -> DeepSpeedPlan:
    table = [
        NodeTableEntry(host="gpu-node-1", first_rank=0, slots=2, env={}, sources={}),
        NodeTableEntry(host="gpu-node-2", first_rank=2, slots=2, env={}, sources={}),
    ]
    return DeepSpeedPlan(
        options=LaunchOptions(command=("train.py",), backend="deepspeed", run_id="r1"),
        master="gpu-node-1", master_addr="10.0.0.1", master_port=29500, hostfile="",
        node_table=table, node_dir="/tmp/trainfleet-r1", ds_env="", argv=[], env={}, unset=[],
        cwd="/w", notes=[],
    )  # fmt: skip


def test_pdsh_output_is_split_by_node_and_rank_and_a_node_s_end_is_noted(tmp_path):
    plan = _ds_plan()
    out = io.StringIO()
    facts = RunFacts(plan)
    merged = MergedOutput(plan, tmp_path, out, 0.0, facts)
    runner = Channel(name="deepspeed", argv=[], demux=pdsh_line)
    merged.line(runner, "stdout", "gpu-node-2: [default1]:loss 1.5")
    merged.line(runner, "stderr", "pdsh@launch: gpu-node-2: ssh exited with exit code 3")
    merged.line(runner, "stdout", "a line of the runner itself")
    merged.close()
    shown = out.getvalue().splitlines()
    assert shown[0].split() == ["[gpu-node-2:3]", "loss", "1.5"]
    assert shown[-1].split(maxsplit=1) == ["[deepspeed]", "a line of the runner itself"]
    assert facts.node_exits == [("gpu-node-2", 3)]
    assert "loss 1.5" in (tmp_path / "logs" / "gpu-node-2.rank3.log").read_text()


def test_a_channel_without_demux_keeps_every_line_as_its_node_s():
    line = Channel(name="gpu-node-1", argv=[]).split("gpu-node-2: not a prefix here")
    assert (line.node, line.text, line.node_exit) == (None, "gpu-node-2: not a prefix here", None)


def test_a_beat_behind_a_progress_bar_on_the_same_line_is_still_a_beat(tmp_path):
    """tqdm ends its updates with a carriage return, so the shim's beat for a Hugging Face
    Trainer step arrives behind the bar on one line (seen in TRL's SFT run): the bar is output,
    the beat is progress."""
    plan = _ds_plan()
    out = io.StringIO()
    facts = RunFacts(plan)
    merged = MergedOutput(plan, tmp_path, out, 0.0, facts)
    runner = Channel(name="deepspeed", argv=[], demux=pdsh_line)
    bar = " 33%|###3      | 1/3 [00:00<00:00,  4.33it/s]"
    beat = '@@trainfleet:r1:beat:2:{"step": 1, "pid": 7, "total_steps": 3}'
    merged.line(runner, "stderr", f"gpu-node-2: [default0]:{bar}{beat}")
    merged.line(runner, "stderr", f"gpu-node-2: [default0]:\r{beat.replace('1, ', '2, ')}")
    merged.close()
    assert facts.progress.rows[2]["step"] == 2 and facts.progress.rows[2]["total_steps"] == 3
    shown = out.getvalue()
    assert bar in shown and "@@trainfleet" not in shown
    assert len(shown.splitlines()) == 1  # the bare "\r" before the second beat is no line


JUMP_PASSWORD = "jump-pw-7"
NODE_2_SECRET = "node-2-only-secret"
TRACKING_URI = "https://ci:S3cr3tPassw0rd@mlflow.example.com"
CLUSTER = f"""\
master: gpu-node-1
ssh:
  options: ["-o", "ProxyCommand=sshpass\\t-p\\t{JUMP_PASSWORD}\\tssh\\t-W\\t%h:%p\\tjump"]
nodes:
  - host: gpu-node-1
    slots: 2
  - host: gpu-node-2
    slots: 2
    env: {{WANDB_API_KEY: {NODE_2_SECRET}}}
"""
LAUNCH_ENV = {
    "HOME": "/nonexistent-home",  # no ~/.deepspeed_env
    "NCCL_DEBUG": "INFO",
    "MLFLOW_TRACKING_URI": TRACKING_URI,
}


def _planned(tmp_path: Path) -> DeepSpeedPlan:
    """A two-node plan of the deepspeed backend, its node directory under tmp_path."""
    plan = plan_deepspeed(
        parse_cluster_yaml(CLUSTER, "cluster.yaml"),
        {host: LaunchFacts(interface="eth0", gpus=2) for host in ("gpu-node-1", "gpu-node-2")},
        LaunchOptions(command=("train.py",), backend="deepspeed", run_id="r1"),
        master_addr="10.0.0.11",
        launch_env=LAUNCH_ENV,
        launch_cwd="/w",
        run_dir=tmp_path,
        python="/usr/bin/python3",
    )
    return dataclasses.replace(plan, node_dir=str(tmp_path / "trainfleet-r1"))


def _started(plan: DeepSpeedPlan, tmp_path: Path, monkeypatch) -> tuple[Channel, dict[str, bytes]]:
    """The runner's channel, and what each node was sent on stdin to write its files (the
    nodes answer ok without being reached)."""
    sent: dict[str, bytes] = {}

    def run_on_nodes(nodes, argv, *, stdin, timeout):
        # As remote.run_on_nodes reads `stdin`: one value for every node, or one per node.
        per_node = stdin if isinstance(stdin, Mapping) else {n.host: stdin for n in nodes}
        sent.update(per_node)
        return [
            NodeResult(node=n.host, returncode=0, stdout="", stderr="", duration_s=0.0,
                       failure=Failure.NONE)
            for n in nodes
        ]  # fmt: skip

    monkeypatch.setattr(deepspeed, "run_on_nodes", run_on_nodes)
    for name, value in LAUNCH_ENV.items():
        monkeypatch.setenv(name, value)
    cluster = parse_cluster_yaml(CLUSTER, "cluster.yaml")
    [runner] = deepspeed.BACKEND.start(plan, cluster, tmp_path)
    return runner, sent


def _put_node_files(job: bytes) -> None:
    """Runs a node's files job here, as the node runs it."""
    done = subprocess.run(node.argv(sys.executable, files), input=job, capture_output=True)
    assert done.returncode == 0, done.stderr


def _shim_env(plan: DeepSpeedPlan, directory: Path, rank: int, monkeypatch) -> dict[str, str]:
    """The variables the shim of `rank` sets, its table in `directory` under the name the
    runner exports (DS_ENV_FILE's TRAINFLEET_NODE_ENV)."""
    exported = dict(line.split("=", 1) for line in plan.ds_env.splitlines())
    monkeypatch.setenv(
        "TRAINFLEET_NODE_ENV", str(directory / Path(exported["TRAINFLEET_NODE_ENV"]).name)
    )
    monkeypatch.setenv("RANK", str(rank))
    return shim.node_env()


def test_the_deepspeed_dry_run_masks_the_ssh_options_it_gives_pdsh(tmp_path):
    """#33 (review Part 3): --dry-run printed PDSH_SSH_ARGS_APPEND as is, a ProxyCommand's
    sshpass password with it."""
    plan = _planned(tmp_path)
    shown = render_deepspeed(plan)
    assert "PDSH_SSH_ARGS_APPEND=" in shown and "sshpass" in shown
    assert JUMP_PASSWORD not in shown
    assert JUMP_PASSWORD in plan.env["PDSH_SSH_ARGS_APPEND"]  # pdsh's ssh still needs it


def test_a_password_in_a_runner_exported_value_stays_off_pdsh_s_command_line(tmp_path, monkeypatch):
    """#33 (review F4): DeepSpeed's runner writes `export MLFLOW_TRACKING_URI=...` into pdsh's
    command line (every node's `ps`); only secret names were kept from it, not a URL's
    password. The nodes get it from their own table instead."""
    plan = _planned(tmp_path)
    runner, _ = _started(plan, tmp_path, monkeypatch)
    assert not any("S3cr3tPassw0rd" in value for value in runner.env.values())
    assert runner.env["NCCL_DEBUG"] == "INFO"  # what holds no secret is still exported
    assert all(entry.env["MLFLOW_TRACKING_URI"] == TRACKING_URI for entry in plan.node_table)
    assert "S3cr3tPassw0rd" not in render_deepspeed(plan)


def test_each_node_is_sent_only_its_own_variables(tmp_path, monkeypatch):
    """#33 (review Part 3): node_env.json carried every node's variables to every node, so
    gpu-node-1 held gpu-node-2's own secret from cluster.yaml."""
    plan = _planned(tmp_path)
    _, sent = _started(plan, tmp_path, monkeypatch)
    assert NODE_2_SECRET.encode() not in base64.b64decode(sent["gpu-node-1"])
    assert NODE_2_SECRET.encode() in base64.b64decode(sent["gpu-node-2"])
    directory = Path(plan.node_dir)
    _put_node_files(sent["gpu-node-1"])
    assert not any(NODE_2_SECRET in f.read_text() for f in directory.iterdir())


def test_the_shim_finds_its_node_s_variables_alone_and_in_a_directory_nodes_share(
    tmp_path, monkeypatch
):
    """Each node on its own machine, then every node writing into one directory (nodes that
    share /tmp, as the sandbox's do): each rank gets its own node's variables."""
    plan = _planned(tmp_path)
    _, sent = _started(plan, tmp_path, monkeypatch)
    directory = Path(plan.node_dir)
    for host, rank in (("gpu-node-1", 1), ("gpu-node-2", 2)):
        _put_node_files(sent[host])
        env = _shim_env(plan, directory, rank, monkeypatch)
        assert env["TRAINFLEET_NODE"] == host
        assert env.get("WANDB_API_KEY") == (NODE_2_SECRET if host == "gpu-node-2" else None)
        shutil.rmtree(directory)
    for host in ("gpu-node-1", "gpu-node-2"):
        _put_node_files(sent[host])
    assert _shim_env(plan, directory, 0, monkeypatch)["TRAINFLEET_NODE"] == "gpu-node-1"
    assert _shim_env(plan, directory, 3, monkeypatch)["WANDB_API_KEY"] == NODE_2_SECRET


def test_each_backend_s_channels_say_how_they_are_stopped(tmp_path, monkeypatch):
    """The supervisor stops a channel as the channel says: a node's bootstrap by closing its
    stdin (its lifeline, with keepalives), DeepSpeed's runner by SIGINT (it has no stdin)."""
    from trainfleet.launch.backends import ssh

    runner, _ = _started(_planned(tmp_path), tmp_path, monkeypatch)
    assert runner.stop_by is StopBy.SIGINT and not runner.lifeline and not runner.has_stdin
    cluster = parse_cluster_yaml(CLUSTER, "cluster.yaml")
    plan = ssh.plan_launch(cluster, {}, LaunchOptions(command=("train.py",)),
                           master_addr="10.0.0.11", launch_env={}, launch_cwd="/w")  # fmt: skip
    bootstraps = ssh.BACKEND.start(plan, cluster, tmp_path)
    assert [c.name for c in bootstraps] == ["gpu-node-1", "gpu-node-2"]
    assert all(c.stop_by is StopBy.CLOSING_STDIN and c.lifeline and c.payload for c in bootstraps)
