"""Hosts and slots as DeepSpeed's runner computes them: every case of DeepSpeed's own launcher
tests (deepspeedai/DeepSpeed tests/unit/launcher/test_run.py at 83daee0d), written from the
facts in that file as trainfleet tests. Where DeepSpeed returns hosts and slots, trainfleet
gives the same; where it raises, trainfleet raises SpecError with a message naming the flag or
the file and line. Where trainfleet is deliberately stricter, the test says why.

No GPU exists on this machine: this machine's GPU count is passed in (`local_gpus`), as
DeepSpeed's own test fakes its accelerator's device count.
"""

from __future__ import annotations

import pytest

from trainfleet.cluster import load_cluster, parse_hostfile
from trainfleet.errors import SpecError

pytestmark = pytest.mark.unit

ONE = "worker-0:4"
TWO = "worker-0:4,worker-1:4"


def slots(hosts: str, **kwargs) -> dict[str, list[int]]:
    """{host: slot ids} of the cluster `--hosts hosts` after the filters in kwargs."""
    cluster = load_cluster(hosts=hosts, **kwargs)
    return {node.host: list(node.gpu_ids) for node in cluster.nodes}


def test_include_and_exclude_are_mutually_exclusive():
    with pytest.raises(SpecError, match="mutually exclusive"):
        slots(ONE, include="worker-0", exclude="worker-0:1")


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {"worker-0": [0, 1, 2, 3]}),
        ({"exclude": "worker-0:1"}, {"worker-0": [0, 2, 3]}),
        ({"exclude": "worker-0:1,2"}, {"worker-0": [0, 3]}),
        ({"include": "worker-0:1"}, {"worker-0": [1]}),
        ({"include": "worker-0:1,1"}, {"worker-0": [1]}),  # a slot named twice
        ({"include": "worker-0:1@worker-0:0,1"}, {"worker-0": [0, 1]}),  # a host named twice
        ({"include": "worker-0"}, {"worker-0": [0, 1, 2, 3]}),  # a bare host: every slot
    ],
)
def test_one_node(kwargs, expected):
    assert slots(ONE, **kwargs) == expected


@pytest.mark.parametrize("exclude", ["worker-0", "worker-0:0,1,2,3"])
def test_excluding_everything_is_an_error_where_deepspeed_returns_no_hosts(exclude):
    # DeepSpeed returns {} and then fails later ("no GPU resources"); nothing to run is
    # said here, naming the flag.
    with pytest.raises(SpecError, match="no node is left"):
        slots(ONE, exclude=exclude)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}),
        ({"include": "worker-1:0,3"}, {"worker-1": [0, 3]}),
        ({"exclude": "worker-1"}, {"worker-0": [0, 1, 2, 3]}),
        ({"exclude": "worker-0:0,1@worker-1:3"}, {"worker-0": [2, 3], "worker-1": [0, 1, 2]}),
        ({"include": "worker-0"}, {"worker-0": [0, 1, 2, 3]}),
        ({"include": "worker-0@worker-1:0,2"}, {"worker-0": [0, 1, 2, 3], "worker-1": [0, 2]}),
        ({"include": "worker-1:0,2"}, {"worker-1": [0, 2]}),
        ({"exclude": "worker-0:1"}, {"worker-0": [0, 2, 3], "worker-1": [0, 1, 2, 3]}),
    ],
)
def test_two_nodes(kwargs, expected):
    assert slots(TWO, **kwargs) == expected


@pytest.mark.parametrize("spec", ["worker-0:4", "worker-0:99", "worker-0:0,4"])
@pytest.mark.parametrize("flag", ["include", "exclude"])
def test_a_slot_beyond_the_node_is_an_error_for_include_and_exclude(spec, flag):
    with pytest.raises(SpecError, match="no slot 4|no slot 99"):
        slots(ONE, **{flag: spec})


@pytest.mark.parametrize(
    ("flag", "spec"),
    [
        ("include", "jeff"),
        ("exclude", "jeff"),
        ("include", "worker-1:4"),
        ("exclude", "worker-1:4"),
        ("exclude", "worker-1@worker-0:1@5"),  # '5' is read as a host, as DeepSpeed reads it
    ],
)
def test_unknown_hosts_and_slots_are_errors(flag, spec):
    with pytest.raises(SpecError) as err:
        slots(TWO, **{flag: spec})
    assert f"--{flag}" in str(err.value)


def test_cuda_visible_devices_gives_this_machines_slots():
    """CUDA_VISIBLE_DEVICES=0,2 on a 4-GPU machine with no hostfile: slots 0 and 2."""
    assert slots_local("0,2", gpus=4) == {"localhost": [0, 2]}
    cluster = load_cluster(visible_devices="0,2", local_gpus=4)
    assert cluster.world_size == 2


def test_cuda_visible_devices_naming_a_gpu_the_machine_lacks_is_an_error():
    """DeepSpeed: "No slot '2' specified on host 'localhost'" when the pool has 2 GPUs."""
    with pytest.raises(SpecError, match="names GPU 2, but this machine has 2"):
        slots_local("0,2", gpus=2)
    with pytest.raises(SpecError, match="not a list of GPU indices"):
        slots_local("GPU-8f2c4b1e", gpus=4)


def test_cuda_visible_devices_is_ignored_when_slots_are_chosen_otherwise():
    """DeepSpeed ignores the mask with --include/--exclude/--num_gpus/--num_nodes>1."""
    cluster = load_cluster(visible_devices="0,2", local_gpus=4, include="localhost:1")
    assert [list(n.gpu_ids) for n in cluster.nodes] == [[1]]
    cluster = load_cluster(visible_devices="0,2", local_gpus=4, num_gpus=3)
    assert [list(n.gpu_ids) for n in cluster.nodes] == [[0, 1, 2]]
    # A hostfile (here --hosts) is never masked: the mask is the launch machine's.
    assert slots(TWO, visible_devices="0,2") == slots(TWO)


def slots_local(visible: str, *, gpus: int) -> dict[str, list[int]]:
    cluster = load_cluster(visible_devices=visible, local_gpus=gpus)
    return {node.host: list(node.gpu_ids) for node in cluster.nodes}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_nodes": 1, "include": "worker-0"},
        {"num_nodes": 1, "num_gpus": 1, "include": "worker-0"},
        {"num_gpus": 1, "include": "worker-0"},
        {"num_nodes": 1, "exclude": "worker-1"},
        {"num_nodes": 1, "num_gpus": 1, "exclude": "worker-1"},
        {"num_gpus": 1, "exclude": "worker-1"},
    ],
)
def test_num_nodes_and_num_gpus_cannot_be_combined_with_include_or_exclude(kwargs):
    with pytest.raises(SpecError, match="cannot be combined with --include/--exclude"):
        slots(TWO, **kwargs)


def test_num_nodes_takes_the_first_nodes_and_num_gpus_the_first_slots():
    assert slots(TWO, num_nodes=1) == {"worker-0": [0, 1, 2, 3]}
    assert slots(TWO, num_gpus=2) == {"worker-0": [0, 1], "worker-1": [0, 1]}
    assert slots(TWO, num_nodes=1, num_gpus=1) == {"worker-0": [0]}
    # Stricter: DeepSpeed would start 8 ranks on a 4-slot node and fail there.
    with pytest.raises(SpecError, match="worker-0 has 4"):
        slots(TWO, num_gpus=8)
    # DeepSpeed: "Num nodes is >1 but no extra nodes available via hostfile".
    with pytest.raises(SpecError, match="no hostfile names other nodes"):
        load_cluster(num_nodes=2, local_gpus=1)


def test_hostfile_with_blank_lines_comments_and_an_address():
    text = """
    worker-1 slots=2
    worker-2 slots=2

    localhost slots=1
    123.23.12.10 slots=2

    #worker-1 slots=3
    # this is a comment

    """
    pool = parse_hostfile(text)
    assert {host: n for host, (n, _line) in pool.items()} == {
        "worker-1": 2,
        "worker-2": 2,
        "localhost": 1,
        "123.23.12.10": 2,
    }


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("worker-1 slots=2\nworker-2 slots=1\nworker-1 slots=1\n", 3, "appears twice"),
        ("this is bad slots=1\n", 1, "bad entry"),
        ("missingslots\n", 1, "bad entry"),
        ("worker-1 slots=2\nthis is bad slots=1\nworker-2 slots=4\nmissingslots\n", 2, "bad"),
    ],
)
def test_bad_hostfiles_name_the_line(text, line, says):
    with pytest.raises(SpecError) as err:
        parse_hostfile(text, "hostfile")
    assert err.value.line == line and says in str(err.value)


def test_an_empty_hostfile_is_an_error():
    # DeepSpeed raises; trainfleet says which file and what a line looks like.
    with pytest.raises(SpecError, match="no hosts in hostfile"):
        parse_hostfile("\n    \n", "hostfile")
