"""The slurm backend's one step for a whole launch: its srun argv, each node's bootstrap picking
its own job from the stdin every task reads (run here for real), the step's labelled lines
split back into nodes, and the node srun names as the one that failed first. The sandbox
tests (tests/cluster/test_slurm_sandbox.py) run it under a real slurmd."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainfleet import node
from trainfleet.cluster import load_cluster
from trainfleet.cluster.slurm import allocation
from trainfleet.errors import TrainfleetError
from trainfleet.launch.backend import StopBy
from trainfleet.launch.backends import slurm
from trainfleet.launch.options import LaunchFacts, LaunchOptions
from trainfleet.launch.result import RunState
from trainfleet.launch.supervisor import _Run
from trainfleet.node import bootstrap

pytestmark = pytest.mark.unit

HOSTS = ["gpu-node-1", "gpu-node-2"]


def _planned(tmp_path: Path, cpus: str = "96,48", launch_env: dict | None = None):
    shell = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu-node-[1-2]",
             "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_CPUS_PER_NODE": cpus}  # fmt: skip
    cluster = load_cluster(slurm=allocation(shell))
    plan = slurm.BACKEND.plan(
        cluster,
        {host: LaunchFacts(interface="eth0", gpus=2) for host in HOSTS},
        LaunchOptions(command=("train.py",), backend="slurm", run_id="r1"),
        master_addr="10.0.0.11",
        launch_env={"HOME": str(tmp_path), "PATH": "/usr/bin", **(launch_env or {})},
        launch_cwd="/w",
        run_dir=tmp_path,
    )
    return cluster, plan


def test_one_step_starts_every_node_s_bootstrap_with_the_job_s_fewest_cpus(tmp_path):
    cluster, plan = _planned(tmp_path)
    [channel] = slurm.BACKEND.start(plan, cluster, tmp_path)
    assert channel.name == "srun" and channel.nodes == tuple(HOSTS)
    assert channel.stop_by is StopBy.CLOSING_STDIN and channel.lifeline and channel.payload
    argv = channel.argv
    assert argv[:3] == ["srun", "--jobid=42", "--overlap"]
    for word in ("--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                 "--nodelist=gpu-node-1,gpu-node-2", "--label", "--input=all", "--export=ALL",
                 "--cpus-per-task=48"):  # fmt: skip
        assert word in argv, (word, argv)
    assert argv[-1] == "trainfleet-bootstrap"
    assert any("have 48 and 96 CPUs" in n and "torchrun 48 (" in n for n in plan.notes), plan.notes
    assert not any("CPUs" in n for n in _planned(tmp_path, cpus="8(x2)")[1].notes)


def test_the_step_s_lines_go_back_to_their_nodes_and_srun_names_a_node_s_end():
    split = slurm.srun_lines(HOSTS)
    assert split("0: [default1]:hello") == slurm.ChannelLine(node="gpu-node-1",
                                                             text="[default1]:hello")  # fmt: skip
    assert split(" 1: padded").node == "gpu-node-2"
    assert split("7: no such task").node is None  # not one of ours: the channel's own line
    assert split("srun: error: Unable to create step for job 42").node_exit is None
    ends = {
        "Exited with exit code 3": 3,
        "Killed": 137,
        "Terminated": 143,
        "Segmentation fault (core dumped)": 139,
    }
    for how, code in ends.items():
        assert split(f"srun: error: gpu-node-2: task 1: {how}").node_exit == ("gpu-node-2", code)


def test_a_secret_that_differs_between_nodes_is_not_handed_to_every_node(tmp_path):
    cluster, plan = _planned(tmp_path, launch_env={"HF_TOKEN": "hf_same"})
    slurm.BACKEND.start(plan, cluster, tmp_path)  # the same secret everywhere: fine
    plan.nodes[1].env["HF_TOKEN"] = "hf_other"
    with pytest.raises(TrainfleetError, match="HF_TOKEN holds a secret and differs between"):
        slurm.BACKEND.start(plan, cluster, tmp_path)
    plan.nodes[1].env["HF_TOKEN"] = "hf_same"
    plan.nodes[1].env["NCCL_SOCKET_IFNAME"] = "ib0"  # no secret: each node keeps its own
    slurm.BACKEND.start(plan, cluster, tmp_path)


def _step_task(task: str, nodename: str) -> tuple[int, str, str]:
    """One task of the step as slurmd starts it, every node's job on its stdin, which stays
    open (the lifeline) until it ends: (exit code, stdout, stderr)."""
    jobs = [
        bootstrap.BootstrapJob(
            run_id="r1",
            cwd=None,
            env={"WHO": host},
            grace=1,
            lifeline=0,
            argv=["sh", "-c", 'echo "$WHO ran"'],
            shim="",
        )  # fmt: skip
        for host in HOSTS
    ]
    proc = subprocess.Popen(
        node.argv(sys.executable, bootstrap.step),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "SLURM_PROCID": task, "SLURMD_NODENAME": nodename},
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(node.line(bootstrap.step, HOSTS, "# the shim", jobs))
    proc.stdin.flush()
    out, err = proc.stdout.read(), proc.stderr.read()
    code = proc.wait(timeout=30)
    proc.stdin.close()
    return code, out.decode(), err.decode()


def test_each_task_runs_its_own_node_s_job_and_refuses_another_node():
    code, out, err = _step_task("1", "gpu-node-2")
    assert (code, out) == (0, "gpu-node-2 ran\n"), err
    code, out, err = _step_task("1", "gpu-node-1")  # task 1 elsewhere: refused, not mislabelled
    assert (code, out) == (1, ""), err
    assert "Slurm started task 1 of this launch's step on gpu-node-1, planned for gpu-node-2" in err


def test_the_node_srun_names_failed_first_not_the_step(tmp_path):
    """srun exits with the highest code of its tasks (143: a task it ended); the run failed on
    the node srun says ended first, with that node's code."""
    cluster, plan = _planned(tmp_path)
    [channel] = slurm.BACKEND.start(plan, cluster, tmp_path)
    said = (
        "echo '1: boom' >&2; echo 'srun: error: gpu-node-2: task 1: Exited with exit code 3' >&2;"
        " echo 'srun: error: gpu-node-1: task 0: Terminated' >&2; exit 143"
    )
    fake_srun = dataclasses.replace(channel, argv=["sh", "-c", said])

    async def run_it() -> _Run:
        run = _Run(plan, tmp_path, io.StringIO())
        await run.start([fake_srun])
        await run.watch()
        await run.stop()
        return run

    run = asyncio.run(run_it())
    assert run.state is RunState.FAILED
    assert (run.first_failure, run.failure_code) == ("gpu-node-2", 3)
    assert run.result().node_codes == {"srun": 143, "gpu-node-1": 143, "gpu-node-2": 3}
