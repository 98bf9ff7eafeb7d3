"""setup env's decisions per node, from doctor's facts and the node's login shell."""

from __future__ import annotations

import pytest
import yaml
from doctor_fixtures import facts_of, make_survey

from trainfleet.cluster import load_cluster
from trainfleet.remote import Failure, NodeResult
from trainfleet.setup import env
from trainfleet.setup.env import parse_login, plan_node_env

pytestmark = pytest.mark.unit


def _facts(**extra):
    facts = {
        "python": {"executable": "/opt/conda/envs/train/bin/python"},
        "tools": {"ninja": None, "deepspeed": None, "torchrun": None, "nvcc": None},
        "route_to_master": {"dev": "ens14f1"},
        "interfaces": [{"name": "ens14f1", "up": True, "ipv4": ["10.0.0.12/24"]}],
        "cuda_home": None,
        "gpus": {"devices": []},
    }
    facts.update(extra)
    return facts_of(facts)


def test_login_output_is_read_from_marked_lines_only():
    chatty = (
        "Welcome to node 2!\nconda activate train\n"
        "TRAINFLEET_PATH=/opt/conda/envs/train/bin:/usr/bin\nTRAINFLEET_CUDA_HOME=\n"
        "TRAINFLEET_TOOL=ninja=/opt/conda/envs/train/bin/ninja\nTRAINFLEET_TOOL=nvcc=\n"
    )
    login = parse_login(chatty)
    assert login["path"] == "/opt/conda/envs/train/bin:/usr/bin"
    assert "cuda_home" not in login
    assert login["tools"] == {"ninja": "/opt/conda/envs/train/bin/ninja", "nvcc": None}


def test_interface_and_python_are_recorded_and_nothing_else_when_all_is_there():
    fields, notes = plan_node_env(
        _facts(), {"tools": {}}, interface=None, env={}, master_addr="10.0.0.11"
    )
    assert fields == {"interface": "ens14f1", "python": "/opt/conda/envs/train/bin/python"}
    assert notes == []
    pinned, _ = plan_node_env(
        _facts(), {"tools": {}}, interface="ens14f1", env={}, master_addr="10.0.0.11"
    )
    assert "interface" not in pinned  # already right: nothing to change


def test_tools_only_on_the_login_path_record_that_path():
    login = {"path": "/opt/conda/envs/train/bin:/usr/bin", "tools": {"ninja": "/opt/x/ninja"}}
    fields, notes = plan_node_env(_facts(), login, interface=None, env={}, master_addr=None)
    assert fields["env"] == {"PATH": "/opt/conda/envs/train/bin:/usr/bin"}
    assert notes == ["ninja only on the login PATH: that PATH recorded"]
    same, _ = plan_node_env(
        _facts(), login, interface=None, env={"PATH": login["path"]}, master_addr=None
    )
    assert "env" not in same


def test_cuda_home_on_gpu_nodes_only():
    gpu = _facts(gpus={"devices": [{"index": 0}]})
    login = {"tools": {"nvcc": "/usr/local/cuda-12.4/bin/nvcc"}}
    fields, _ = plan_node_env(gpu, login, interface=None, env={}, master_addr=None)
    assert fields["env"] == {"CUDA_HOME": "/usr/local/cuda-12.4"}  # as torch derives it
    fields, _ = plan_node_env(_facts(), login, interface=None, env={}, master_addr=None)
    assert "env" not in fields


def test_a_node_whose_python_is_missing_gets_the_login_shells_python3():
    login = {"tools": {"python3": "/opt/conda/bin/python3"}}
    fields, notes = plan_node_env(None, login, interface=None, env={}, master_addr=None)
    assert fields == {"python": "/opt/conda/bin/python3"}
    assert "check that it has the training environment" in notes[0]


def test_tools_beside_the_nodes_python_put_its_directory_first_on_path():
    facts = _facts(path="/usr/bin:/bin")
    login = {"path": "/usr/bin:/bin", "tools": {}, "beside_python": {"deepspeed": "x"}}
    fields, notes = plan_node_env(facts, login, interface=None, env={}, master_addr=None)
    assert fields["env"] == {"PATH": "/opt/conda/envs/train/bin:/usr/bin:/bin"}
    assert notes == ["deepspeed beside its python, not on the ssh PATH: PATH recorded"]


def test_beside_python_output_is_parsed():
    login = parse_login("TRAINFLEET_BESIDE=ninja=/opt/env/bin/ninja\n")
    assert login["beside_python"] == {"ninja": "/opt/env/bin/ninja"}


USER_FILE = """\
# the lab's three boxes; ask before changing the port
master: gpu-node-1
master_port: 29500   # 29400 is the old job's
nodes:
  - host: gpu-node-1   # rack A
    slots: 1
  - gpu-node-2         # rack B
  - slots: 1
    host: gpu-node-3
    # set by hand after the reinstall
    env: {NCCL_DEBUG: WARN}
"""


def test_setup_env_edits_cluster_yaml_in_place_keeping_comments_and_key_order(
    tmp_path, monkeypatch
):
    """setup env used to write cluster.yaml back through a YAML dump: every comment but the
    leading block was lost. It now edits the file as doctor --fix does."""
    survey = make_survey(tmp_path)
    path = tmp_path / "mine.yaml"
    path.write_text(USER_FILE)
    login = (
        "TRAINFLEET_PATH=/opt/env/bin:/usr/bin\nTRAINFLEET_TOOL=torchrun=/opt/env/bin/torchrun\n"
    )
    monkeypatch.setattr(env.verify, "survey", lambda *args, **kwargs: survey)
    monkeypatch.setattr(
        env,
        "run_on_nodes",
        lambda nodes, argv, **kwargs: [
            NodeResult(node=n.host, returncode=0, stdout=login, stderr="", duration_s=0.1,
                       failure=Failure.NONE)
            for n in nodes
        ],
    )  # fmt: skip

    result = env.setup_env(load_cluster(cluster_file=str(path)), cluster_in=str(path))

    text = path.read_text()
    untouched = [line for line in USER_FILE.splitlines() if "gpu-node-2" not in line]
    untouched.remove("    env: {NCCL_DEBUG: WARN}")
    assert [line for line in text.splitlines() if line in untouched] == untouched
    [short] = [line for line in text.splitlines() if "gpu-node-2" in line]
    assert short.startswith("  - {host: gpu-node-2, ") and short.endswith("}         # rack B")
    doc = yaml.safe_load(text)
    assert list(doc) == ["master", "master_port", "nodes"]
    assert [list(entry) for entry in doc["nodes"]] == [
        ["host", "interface", "python", "env", "slots"],
        ["host", "interface", "python", "env"],
        ["slots", "host", "interface", "python", "env"],
    ]
    written = load_cluster(cluster_file=str(path))
    python = survey.facts["gpu-node-1"].python.executable
    assert [(n.interface, n.python) for n in written.nodes] == [
        ("ens14f0", python),
        ("ens14f1", python),
        ("ens14f2", python),
    ]
    assert dict(written.node("gpu-node-3").env) == {
        "NCCL_DEBUG": "WARN",
        "PATH": "/opt/env/bin:/usr/bin",
    }
    [backup] = [p for p in tmp_path.iterdir() if p.name.startswith("mine.yaml.")]
    assert backup.read_text() == USER_FILE
    said = {change.node: change.what for change in result.changes}
    assert (
        said["gpu-node-3"] == f"interface: ens14f2, python: {python}, PATH: /opt/env/bin:/usr/bin"
    )
