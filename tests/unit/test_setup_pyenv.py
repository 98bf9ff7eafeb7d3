"""`setup pyenv` without nodes: which wheels a node can take and why not, what a node's report
may hold, the package set, and wheels packed back from this environment that pip installs
(the sandbox run, nodes and all, is in tests/cluster/test_setup.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from trainfleet import node as node_programs
from trainfleet.cluster import load_cluster
from trainfleet.errors import SetupError
from trainfleet.node import answer
from trainfleet.node import pyenv as node_pyenv
from trainfleet.setup.pyenv import dsops, wheels
from trainfleet.setup.pyenv import step as pyenv_step
from trainfleet.setup.pyenv.step import NodeEnv, parse_node_env, plan_node
from trainfleet.setup.pyenv.wheels import Dist, cannot_take, driver_too_old

pytestmark = pytest.mark.unit

LINUX = {"glibc": "2.36", "machine": "x86_64"}


@pytest.mark.parametrize(
    ("tag", "python", "why"),
    [
        ("cp311-cp311-manylinux_2_28_x86_64", "3.11", None),
        ("cp311-cp311-manylinux_2_28_x86_64", "3.10", "built for Python 3.11, the node's is 3.10"),
        ("cp310-abi3-manylinux2014_x86_64", "3.12", None),  # the stable ABI: 3.10 and newer
        ("cp312-abi3-manylinux2014_x86_64", "3.11", "built for Python 3.12, the node's is 3.11"),
        ("py311-none-any", "3.10", "built for Python 3.11, the node's is 3.10"),
        ("py3-none-any", "3.8", None),
        ("cp311-cp311-manylinux_2_39_x86_64", "3.11",
         "needs glibc 2.39 or newer, the node has 2.36"),
        ("cp311-cp311-manylinux_2_28_aarch64", "3.11", "built for aarch64, the node is x86_64"),
        ("cp311-cp311-musllinux_1_2_x86_64", "3.11",
         "built for musl libc (Alpine), the node has glibc 2.36"),
    ],
)  # fmt: skip
def test_which_wheels_a_node_can_take(tag, python, why):
    assert cannot_take(tag, python=python, **LINUX) == why


def test_a_cuda_torch_needs_a_driver_new_enough_and_a_node_without_one_is_not_judged():
    assert driver_too_old("2.7.1+cu126", "535.104.05") is None
    assert driver_too_old("2.7.1+cu126", "470.82.01") == (
        "torch 2.7.1+cu126 is built for CUDA 12.6, which needs NVIDIA driver 525.60.13 or "
        "newer; the node has 470.82.01"
    )
    assert driver_too_old("2.7.1+cu126", None) is None
    assert driver_too_old("2.13.0+cpu", "470.82.01") is None


def test_a_nodes_report_is_data_and_nonsense_is_refused():
    report = {"version": "3.11.2", "libc": "glibc", "libc_version": "2.36", "machine": "x86_64",
              "in_target": True, "packages": {"Torch": "2.4.0", "evil; rm -rf /": "1",
                                              "numpy": "$(reboot)"}}  # fmt: skip
    report = {**dict.fromkeys(node_pyenv.EnvFacts.__required_keys__), **report}

    def said(report: dict) -> str:
        return f"chatty bashrc line\n{answer.MARK}{json.dumps(report)}\n"

    env = parse_node_env(said(report), node="n1")
    assert env.packages == {"torch": "2.4.0"} and env.glibc == "2.36" and env.in_target
    with pytest.raises(ValueError, match="python version"):
        parse_node_env(said({**report, "version": "3.11\n[x]"}), node="n1")
    with pytest.raises(ValueError, match="it printed no answer line"):
        parse_node_env("Traceback ...", node="n1")


TORCH = Dist(name="torch", version="2.13.0+cpu", tags=("cp311-cp311-manylinux_2_28_x86_64",))
PEFT = Dist(name="peft", version="0.21.2", tags=("py3-none-any",))


def test_a_node_gets_what_it_lacks_or_has_at_another_version_and_nothing_else():
    node = NodeEnv(version="3.11.2", packages={"torch": "2.4.0", "peft": "0.21.2"}, **LINUX)
    assert plan_node(node, [TORCH, PEFT], python="3.11") == ([TORCH], [])
    node.packages["torch"] = "2.13.0+cpu"
    assert plan_node(node, [TORCH, PEFT], python="3.11") == ([], [])


def test_a_node_that_cannot_take_the_environment_is_named_with_the_reason():
    old = NodeEnv(version="3.9.18", **LINUX)
    _, why = plan_node(old, [TORCH], python="3.11")
    assert why == ["its newest python3 found Python is 3.9.18, this machine's is 3.11: the "
                   "wheels are built for 3.11; install python3.11 there"]  # fmt: skip
    pypy = NodeEnv(version="3.11.9", implementation="pypy", **LINUX)
    assert plan_node(pypy, [PEFT], python="3.11")[1] == [
        "its python is pypy, this machine's is cpython"
    ]
    locked = NodeEnv(version="3.11.2", writable=False, **LINUX)
    assert plan_node(locked, [PEFT], python="3.11")[1] == ["cannot write there (permissions)"]
    big = Dist(name="torch", version="2.13.0+cpu", tags=TORCH.tags, installed_bytes=2_000_000_000)
    full = NodeEnv(version="3.11.2", free_bytes=1_000_000_000, **LINUX)
    assert plan_node(full, [big], python="3.11")[1] == [
        "needs about 3.0 GB free there, the disk has 1.0 GB"
    ]


def test_nothing_is_installed_anywhere_when_one_node_cannot_take_it(monkeypatch, tmp_path):
    cluster = load_cluster(hosts="gpu-node-1,gpu-node-2")
    envs = {"gpu-node-1": NodeEnv(version="3.11.2", **LINUX),
            "gpu-node-2": NodeEnv(version="3.11.2", glibc="2.17", machine="x86_64")}  # fmt: skip
    monkeypatch.setattr(pyenv_step, "inspect_nodes", lambda *a: envs)
    monkeypatch.setattr(pyenv_step, "_install_everywhere", lambda *a: pytest.fail("installed"))
    with pytest.raises(SetupError) as raised:
        pyenv_step.setup_pyenv(cluster, target=str(tmp_path / "env"), confirm=lambda *a: True,
                          cluster_in=None, cluster_out=str(tmp_path / "c.yaml"))  # fmt: skip
    assert raised.value.what.startswith("nothing was installed anywhere: gpu-node-2 cannot take")
    assert "torch 2.13.0+cpu: needs glibc 2.28 or newer, the node has 2.17" in raised.value.what
    assert "gpu-node-1" not in raised.value.what and not (tmp_path / "c.yaml").exists()


def test_the_package_set_is_the_training_stack_and_what_it_requires_installed_here():
    dists, missing = wheels.closure(["accelerate", "no-such-package"])
    names = {d.name for d in dists}
    assert {"accelerate", "torch", "numpy", "psutil", "pyyaml"} <= names
    assert "pytest" not in names and missing == ["no-such-package"]
    assert all(d.version == wheels.installed()[d.name].version for d in dists)


def test_requirements_files_give_names_and_a_bad_line_is_named(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("# ours\n-e .\npeft>=0.15  # LoRA\ndatasets[audio]==4.0\n")
    assert wheels.requirement_names(str(req)) == ["peft", "datasets"]
    req.write_text("peft\n???\n")
    with pytest.raises(ValueError, match=r"requirements.txt:2: '\?\?\?'"):
        wheels.requirement_names(str(req))


def test_packed_wheels_install_with_no_index_into_a_new_environment(tmp_path):
    """What the node job does, here: a venv made without pip, pip run from its packed wheel,
    a package with a console script and one with a plain script (deepspeed's `bin/ds_report`
    kind) installed; the scripts run with the new environment's python."""
    dists = {d.name: d for d in wheels.closure(["pip", "hjson", "deepspeed"])[0]}
    cache = tmp_path / "cache"
    files = pyenv_step.gather([dists["pip"], dists["hjson"], dists["deepspeed"]], wheel_dirs=[],
                         cache=cache)  # fmt: skip
    with zipfile.ZipFile(files["deepspeed"]) as packed:
        names = packed.namelist()
        script = packed.read("deepspeed-0.19.8.data/scripts/ds_report")
    assert not [n for n in names if "__pycache__" in n or n.endswith(("INSTALLER", ".pyc"))]
    assert script.startswith(b"#!python\n")
    target = tmp_path / "env"
    wheel_dir = target / pyenv_step.WHEEL_DIR
    wheel_dir.mkdir(parents=True)
    for name in ("pip", "hjson"):
        (wheel_dir / files[name].name).write_bytes(files[name].read_bytes())
    job = {"target": str(target), "dir": str(wheel_dir), "pip": files["pip"].name,
           "wheels": [files["pip"].name, files["hjson"].name]}  # fmt: skip
    argv = node_programs.argv(sys.executable, node_pyenv.install)
    done = subprocess.run(
        argv, capture_output=True, input=node_programs.line(node_pyenv.install, job)
    )
    assert done.returncode == 0, done.stderr.decode()
    assert not wheel_dir.exists()  # trainfleet's own directory, removed once installed
    assert list(target.glob("lib/python3*/site-packages/hjson/__pycache__/*.pyc"))  # compiled
    assert (target / "bin" / "hjson").read_text().startswith(f"#!{target}/bin/python")
    listed = subprocess.run([target / "bin" / "python", "-m", "pip", "list", "--format=json"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    versions = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}
    assert versions == {"pip": dists["pip"].version, "hjson": dists["hjson"].version}
    again = pyenv_step.gather([dists["hjson"]], wheel_dirs=[], cache=cache)
    assert again["hjson"] == files["hjson"]  # packed once, kept


def test_without_pip_here_nothing_is_asked_of_the_nodes(monkeypatch, tmp_path):
    """A venv made by uv (or --without-pip) has no pip to give the nodes: said before any node
    is looked at."""
    monkeypatch.setattr(wheels, "closure", lambda roots: ([TORCH, PEFT], []))
    monkeypatch.setattr(pyenv_step, "inspect_nodes", lambda *a: pytest.fail("nodes asked"))
    with pytest.raises(SetupError, match="pip is not installed here") as raised:
        pyenv_step.setup_pyenv(load_cluster(hosts="gpu-node-1"), target=str(tmp_path / "env"),
                          confirm=lambda *a: True)  # fmt: skip
    assert "-m ensurepip" in raised.value.fix


def test_a_dry_run_lists_the_deepspeed_ops_each_node_lacks_and_builds_none(monkeypatch, tmp_path):
    """A node whose environment matches but lacks the ops, and a fresh node: both are listed
    with the ops (the fresh one is not asked: it has no environment yet); nothing is built."""
    deepspeed = Dist(name="deepspeed", version="0.19.8", tags=("py3-none-any",))
    pip = Dist(name="pip", version="25.0", tags=("py3-none-any",))
    monkeypatch.setattr(wheels, "closure", lambda roots: ([TORCH, deepspeed, pip], []))
    have = {d.name: d.version for d in (TORCH, deepspeed, pip)}
    envs = {"gpu-node-1": NodeEnv(version="3.11.2", packages=have, in_target=True, **LINUX),
            "gpu-node-2": NodeEnv(version="3.11.2", **LINUX)}  # fmt: skip
    monkeypatch.setattr(pyenv_step, "inspect_nodes", lambda *a: envs)
    asked = []

    def survey(cluster, hosts, argv_for, target, ops, job_envs):
        asked.append(list(hosts))
        assert job_envs["gpu-node-1"]["PATH"].startswith(f"{target}/bin:")
        return {h: dsops.OpsState(root="/h/ext", ops=dict.fromkeys(ops, "stale")) for h in hosts}

    monkeypatch.setattr(dsops, "survey", survey)
    monkeypatch.setattr(dsops, "prepare", lambda *a, **k: pytest.fail("built"))
    cluster = load_cluster(hosts="gpu-node-1,gpu-node-2")
    result = pyenv_step.setup_pyenv(
        cluster,
        target=str(tmp_path / "env"),
        confirm=lambda *a: pytest.fail("asked"),
        cluster_out=str(tmp_path / "c.yaml"),
        dry_run=True,
        ds_ops="fused_adam,cpu_adam",
    )
    assert asked == [["gpu-node-1"]]
    ops = [(c.node, c.what) for c in result.changes if "DeepSpeed" in c.what]
    assert ops == [
        ("gpu-node-1", "would build DeepSpeed ops fused_adam, cpu_adam (on one node, copied to "
                       "the others)"),
        ("gpu-node-2", "would build DeepSpeed ops fused_adam, cpu_adam (on one node, copied to "
                       "the others)"),
    ]  # fmt: skip
    assert not (tmp_path / "c.yaml").exists()
