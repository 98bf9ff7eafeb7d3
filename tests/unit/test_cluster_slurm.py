"""A Slurm allocation as the cluster: its host list expanded as Slurm writes it, its GPUs per
node from the variables Slurm sets, and its nodes reached as steps of its job (srun)."""

from __future__ import annotations

import pytest

from trainfleet.cluster import load_cluster
from trainfleet.cluster.model import SlurmStep
from trainfleet.cluster.slurm import allocation
from trainfleet.errors import TrainfleetError
from trainfleet.launch.environment import node_env, user_env
from trainfleet.launch.options import LaunchFacts
from trainfleet.nodeset import expand_names, fold_names
from trainfleet.remote.argv import node_argv

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("gpu-node-1", ["gpu-node-1"]),
        ("gpu-node-[1-3]", ["gpu-node-1", "gpu-node-2", "gpu-node-3"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("a[1,3],b", ["a1", "a3", "b"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu-node-[1-2]-ib,login", ["gpu-node-1-ib", "gpu-node-2-ib", "login"]),
    ],
)
def test_host_lists_expand_as_scontrol_show_hostnames_prints_them(hostlist, names):
    assert expand_names(hostlist) == names


def test_folding_and_expanding_are_inverse():
    names = ["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-5", "login"]
    assert expand_names(fold_names(names)) == names


@pytest.mark.parametrize("bad", ["n[1-", "n[a-b]", "n[3-1]", "n]1["])
def test_a_malformed_host_list_is_refused(bad):
    with pytest.raises(ValueError, match=r"n"):
        expand_names(bad)


@pytest.mark.parametrize(
    ("env", "gpus"),
    [
        ({"SLURM_GPUS_ON_NODE": "8"}, 8),
        ({"SLURM_JOB_GPUS": "0,1,2,3"}, 4),
        ({"SLURM_GPUS_PER_NODE": "h100:8"}, 8),
        ({}, None),
    ],
)
def test_gpus_per_node_come_from_what_slurm_sets(env, gpus):
    found = allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", **env})
    assert found is not None and found.gpus_per_node == gpus


def test_outside_an_allocation_there_is_none_and_a_bad_list_is_named():
    assert allocation({"SLURM_JOB_ID": "7"}) is None
    with pytest.raises(TrainfleetError, match="SLURM_JOB_NODELIST='n\\[1-'"):
        allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-"})


def test_the_allocation_is_the_default_cluster_and_its_nodes_are_steps_of_its_job():
    slurm = allocation({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu-node-[1-2]",
                        "SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_CPUS_PER_NODE": "96,48"})  # fmt: skip
    cluster = load_cluster(slurm=slurm)
    assert [(n.host, n.slots, n.slurm) for n in cluster.nodes] == [
        ("gpu-node-1", 8, SlurmStep(job="42", cpus=96)),
        ("gpu-node-2", 8, SlurmStep(job="42", cpus=48)),
    ]
    assert cluster.master == "gpu-node-1" and cluster.source == "Slurm job 42"
    assert cluster.master_port == 29542  # from the job id: another job's first node differs
    node = cluster.nodes[1]
    assert not node.is_local and not node.via_ssh
    argv = node_argv(node, ["python3", "-c", "print('a b')"])
    assert argv[:2] == ["srun", "--jobid=42"] and "--nodelist=gpu-node-2" in argv
    assert "--cpus-per-task=48" in argv  # srun 22.05-23.02 would give the task one CPU
    assert argv[-4:] == ["--", "python3", "-c", "print('a b')"]  # srun execs it: no quoting
    # A hostfile given inside an allocation wins, as the user asked for it.
    assert load_cluster(hosts="a,b", slurm=slurm).nodes[0].slurm is None
    # -e works on an allocation as on a hostfile.
    assert [n.host for n in load_cluster(slurm=slurm, exclude="gpu-node-1").nodes] == ["gpu-node-2"]


def test_on_a_shared_node_each_step_keeps_the_gpus_slurm_gave_it(tmp_path):
    """Slurm gave this job GPUs 4 and 5 of the first node (SLURM_JOB_GPUS, and the batch step's
    CUDA_VISIBLE_DEVICES), maybe others on the second. Each node's step gets its own
    CUDA_VISIBLE_DEVICES from Slurm; a rank's LOCAL_RANK 0..N-1 counts within it. So the slots
    are 0..N-1 and trainfleet neither sets CUDA_VISIBLE_DEVICES nor carries the launch shell's
    to other nodes (DeepSpeed's runner read it as slot numbers: "No slot '4' specified",
    deepspeedai/DeepSpeed#7155)."""
    shell = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu-node-[1-2]",
             "SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "4,5", "PATH": "/usr/bin",
             "HOME": str(tmp_path)}  # fmt: skip
    cluster = load_cluster(slurm=allocation(shell), visible_devices=shell["CUDA_VISIBLE_DEVICES"])
    assert [(n.slots, n.gpu_ids) for n in cluster.nodes] == [(2, (0, 1)), (2, (0, 1))]
    user = user_env(shell, str(tmp_path))
    for node in cluster.nodes:
        env, _ = node_env(cluster, node.host, LaunchFacts(gpus=2), user)
        assert "CUDA_VISIBLE_DEVICES" not in env.values, env.values
        assert env.values["PATH"] == "/usr/bin"
