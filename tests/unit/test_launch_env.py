"""Each rank's environment as DeepSpeed's runner would build it (the launch shell's NCCL*,
PYTHON*, UCX*, MV2*, MLFLOW*; ~/.deepspeed_env then ./.deepspeed_env), merged under
cluster.yaml and the node's own values, on both backends; the runner's one- and single-node
paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainfleet.cluster import load_cluster, parse_cluster_yaml
from trainfleet.errors import SpecError, TrainfleetError
from trainfleet.launch.backends.deepspeed import plan_deepspeed, render_deepspeed
from trainfleet.launch.backends.ssh import plan_launch, render_plan
from trainfleet.launch.environment import interface_notes, parse_deepspeed_env
from trainfleet.launch.options import LaunchFacts, LaunchOptions

pytestmark = pytest.mark.unit

CLUSTER = """\
env: {NCCL_IB_HCA: mlx5_0}
nodes:
  - host: gpu-node-1
  - host: gpu-node-2
    env: {NCCL_DEBUG: WARN}
"""
FACTS = {
    "gpu-node-1": LaunchFacts(interface="ens14f0", gpus=0),
    "gpu-node-2": LaunchFacts(interface="ens14f1", gpus=0),
}


@pytest.fixture
def dirs(tmp_path) -> tuple[Path, Path]:
    """(home, launch directory), both empty."""
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    return home, cwd


def _ssh_plan(cluster, home: Path, cwd: Path, shell: dict[str, str]):
    return plan_launch(
        cluster,
        FACTS,
        LaunchOptions(command=("train.py",), run_id="r1"),
        master_addr="10.0.0.11",
        launch_env={"HOME": str(home), **shell},
        launch_cwd=str(cwd),
    )


def _ds_plan(cluster, home: Path, cwd: Path, shell: dict[str, str], facts=FACTS):
    return plan_deepspeed(
        cluster,
        facts,
        LaunchOptions(command=("train.py",), run_id="r1", backend="deepspeed"),
        master_addr="10.0.0.11",
        launch_env={"HOME": str(home), **shell},
        launch_cwd=str(cwd),
        run_dir=cwd / "run",
        python="/usr/bin/python3",
    )


SHELL = {
    "NCCL_DEBUG": "INFO",
    "NCCL_IB_GID_INDEX": "3",
    "PYTHONPATH": "/src",
    "UCX_TLS": "rc",
    "MV2_USE_CUDA": "1",
    "MLFLOW_TRACKING_URI": "http://mlflow:5000",
    "SSH_AUTH_SOCK": "/tmp/agent",
    "LANG": "C.UTF-8",
}


def test_the_runner_s_exports_reach_every_rank_on_both_backends(dirs):
    home, cwd = dirs
    cluster = parse_cluster_yaml(CLUSTER, "cluster.yaml")
    ssh = {n.host: n.env for n in _ssh_plan(cluster, home, cwd, SHELL).nodes}
    ds = {e.host: e.env for e in _ds_plan(cluster, home, cwd, SHELL).node_table}
    for envs in (ssh, ds):
        for host in ("gpu-node-1", "gpu-node-2"):
            env = envs[host]
            for name in ("NCCL_IB_GID_INDEX", "PYTHONPATH", "UCX_TLS", "MV2_USE_CUDA"):
                assert env[name] == SHELL[name], (host, name)
            assert env["MLFLOW_TRACKING_URI"] == SHELL["MLFLOW_TRACKING_URI"]
            assert "SSH_AUTH_SOCK" not in env and "LANG" not in env  # not the runner's either
            assert env["NCCL_IB_HCA"] == "mlx5_0"  # cluster.yaml, cluster-wide
        assert envs["gpu-node-1"]["NCCL_DEBUG"] == "INFO"  # the launch shell's
        assert envs["gpu-node-2"]["NCCL_DEBUG"] == "WARN"  # the node's own cluster.yaml value


def test_a_node_whose_resolver_does_not_answer_gets_short_lookups_unless_the_user_set_them(dirs):
    """doctor saw gpu-node-2's reverse lookups get no answer: its processes get RES_OPTIONS (1 s
    per lookup), on both backends; gpu-node-1 none; a RES_OPTIONS in cluster.yaml wins."""
    home, cwd = dirs
    facts = {**FACTS, "gpu-node-2": LaunchFacts(interface="ens14f1", silent_resolver=True)}
    cluster = parse_cluster_yaml(CLUSTER, "cluster.yaml")
    ssh = plan_launch(cluster, facts, LaunchOptions(command=("train.py",), run_id="r1"),
                      master_addr="10.0.0.11", launch_env={"HOME": str(home)},
                      launch_cwd=str(cwd))  # fmt: skip
    ds = _ds_plan(cluster, home, cwd, {}, facts=facts)
    for envs in ({n.host: n.env for n in ssh.nodes}, {e.host: e.env for e in ds.node_table}):
        assert envs["gpu-node-2"]["RES_OPTIONS"] == "timeout:1 attempts:1"
        assert "RES_OPTIONS" not in envs["gpu-node-1"]
    assert "RES_OPTIONS='timeout:1 attempts:1'  # the node's resolver does not answer" in (
        render_plan(ssh)
    )
    own = parse_cluster_yaml(CLUSTER.replace("{NCCL_IB_HCA: mlx5_0}",
                                             "{NCCL_IB_HCA: mlx5_0, RES_OPTIONS: 'attempts:3'}"),
                             "cluster.yaml")  # fmt: skip
    mine = plan_launch(own, facts, LaunchOptions(command=("train.py",), run_id="r1"),
                       master_addr="10.0.0.11", launch_env={"HOME": str(home)},
                       launch_cwd=str(cwd))  # fmt: skip
    assert {n.host: n.env["RES_OPTIONS"] for n in mine.nodes} == dict.fromkeys(
        ("gpu-node-1", "gpu-node-2"), "attempts:3"
    )


def test_deepspeed_env_files_are_read_home_then_launch_directory_and_merged(dirs):
    home, cwd = dirs
    (home / ".deepspeed_env").write_text("NCCL_IB_HCA=mlx5_1\nFROM_HOME=1\nBOTH=home\n")
    (cwd / ".deepspeed_env").write_text("# site settings\n\nBOTH=cwd\nNCCL_DEBUG = TRACE \n")
    cluster = load_cluster(hosts="gpu-node-1,gpu-node-2")
    for plan in (_ssh_plan(cluster, home, cwd, SHELL), _ds_plan(cluster, home, cwd, SHELL)):
        envs = (
            [n.env for n in plan.nodes]
            if hasattr(plan, "nodes")
            else [e.env for e in plan.node_table]
        )
        for env in envs:
            assert env["FROM_HOME"] == "1" and env["BOTH"] == "cwd"  # ./ after ~/
            assert env["NCCL_DEBUG"] == "TRACE"  # a file over the launch shell, stripped
            assert env["NCCL_IB_HCA"] == "mlx5_1"
    # The dry run says where each one came from.
    text = render_plan(_ssh_plan(cluster, home, cwd, SHELL))
    assert f"    FROM_HOME=1  # {home}/.deepspeed_env" in text
    assert f"    BOTH=cwd  # {cwd}/.deepspeed_env" in text
    assert "    PYTHONPATH=/src  # launch shell" in text
    assert "    NCCL_SOCKET_IFNAME=ens14f1  # interface to the master" in text
    ds_text = render_deepspeed(_ds_plan(cluster, home, cwd, SHELL))
    assert f"    FROM_HOME=1  # {home}/.deepspeed_env" in ds_text


def test_a_users_ds_env_file_names_the_file_and_the_runner_gets_trainfleets_own(dirs):
    home, cwd = dirs
    (home / "cluster.env").write_text("FROM_NAMED=1\n")
    (home / ".deepspeed_env").write_text("IGNORED=1\n")  # DS_ENV_FILE replaces the name
    cluster = load_cluster(hosts="gpu-node-1,gpu-node-2")
    shell = {"DS_ENV_FILE": "cluster.env"}
    plan = _ds_plan(cluster, home, cwd, shell)
    env = plan.node_table[0].env
    assert env["FROM_NAMED"] == "1" and "IGNORED" not in env
    # The runner reads trainfleet's file (an absolute path: the same under ~ and ./).
    assert plan.env["DS_ENV_FILE"] == str((cwd / "run" / "deepspeed_env").resolve())
    absolute = home / "abs.env"
    absolute.write_text("FROM_ABSOLUTE=yes\n")
    plan = _ssh_plan(cluster, home, cwd, {"DS_ENV_FILE": str(absolute)})
    assert plan.nodes[1].env["FROM_ABSOLUTE"] == "yes"


def test_a_malformed_deepspeed_env_line_names_the_file_and_line(dirs):
    home, cwd = dirs
    (cwd / ".deepspeed_env").write_text("GOOD=1\nexport BAD\n")
    with pytest.raises(SpecError) as err:
        _ssh_plan(load_cluster(hosts="a,b"), home, cwd, {})
    assert f"{cwd}/.deepspeed_env:2" in str(err.value) and "NAME=value" in str(err.value)
    with pytest.raises(SpecError, match="line 1|:1"):
        parse_deepspeed_env("1BAD=x\n", "f")
    # The runner's own split: at the first '=', both sides stripped.
    assert parse_deepspeed_env("A = b=c \n", "f") == {"A": "b=c"}


@pytest.mark.parametrize(
    ("spec", "interface", "fits"),
    [
        ("ens14f0", "ens14f0", True),
        ("ens14f", "ens14f1", True),  # a prefix
        ("=ens14f", "ens14f1", False),  # '=': exact names only
        ("=ens14f1", "ens14f1", True),
        ("^docker,lo", "ens14f1", True),  # '^': everything but
        ("^ens", "ens14f1", False),
        ("eth0,ens14f1", "ens14f1", True),
        ("eth0", "ens14f1", False),
        # One character: NCCL ignores the value (strlen > 1), so it selects nothing away.
        ("=", "ens14f1", True),
        ("^", "ens14f1", True),
        ("x", "ens14f1", True),
    ],
)
def test_launch_notes_follow_nccls_socket_ifname_rule(spec, interface, fits):
    """launch's iface-mismatch note reads NCCL_SOCKET_IFNAME with doctor's rule (netsel)."""
    notes = interface_notes("gpu-node-2", interface, {"NCCL_SOCKET_IFNAME": (spec, "launch shell")})
    expected = f"iface-mismatch: NCCL_SOCKET_IFNAME={spec} (launch shell) does not select"
    if fits:
        assert notes == []
    else:
        assert len(notes) == 1 and notes[0].startswith(expected)


def test_a_global_interface_variable_that_breaks_a_node_is_reported_not_sent(dirs):
    """Seed 000: NCCL_SOCKET_IFNAME=ens14f0 exported on the launch node, where the second node
    names its interface ens14f1."""
    home, cwd = dirs
    cluster = load_cluster(hosts="gpu-node-1,gpu-node-2")
    shell = {"NCCL_SOCKET_IFNAME": "ens14f0"}
    (cwd / ".deepspeed_env").write_text("GLOO_SOCKET_IFNAME=ens14f0\n")
    for plan in (_ssh_plan(cluster, home, cwd, shell), _ds_plan(cluster, home, cwd, shell)):
        mismatch = sorted(n for n in plan.notes if n.startswith("iface-mismatch"))
        assert len(mismatch) == 2, plan.notes  # NCCL's and gloo's, on gpu-node-2 only
        gloo, nccl = mismatch
        assert f"GLOO_SOCKET_IFNAME=ens14f0 ({cwd}/.deepspeed_env)" in gloo
        assert "NCCL_SOCKET_IFNAME=ens14f0 (launch shell)" in nccl
        assert all("gpu-node-2's interface to the master, ens14f1" in n for n in mismatch)
        assert "gpu-node-2 gets NCCL_SOCKET_IFNAME=ens14f1" in nccl
    plan = _ssh_plan(cluster, home, cwd, shell)
    assert plan.nodes[1].env["NCCL_SOCKET_IFNAME"] == "ens14f1"
    # A prefix covering both is what NCCL accepts everywhere: nothing to say.
    (cwd / ".deepspeed_env").unlink()
    assert not _ssh_plan(cluster, home, cwd, {"NCCL_SOCKET_IFNAME": "ens14f"}).notes


def test_deepspeed_backend_forces_multi_node_for_one_remote_node(dirs):
    """`-i worker-1`: without --force_multi the runner would start worker-1's ranks here."""
    home, cwd = dirs
    cluster = load_cluster(hosts="gpu-node-1,gpu-node-2", include="gpu-node-2")
    plan = _ds_plan(cluster, home, cwd, {})
    assert "--force_multi" in plan.argv
    assert plan.argv[plan.argv.index("--include") + 1] == "gpu-node-2:0"
    assert "TRAINFLEET_RUN_ID" not in plan.env  # pdsh path: the env file carries it


def test_deepspeed_backend_on_one_local_node_puts_trainfleets_variables_in_the_runner(dirs):
    """One local node: the runner starts deepspeed.launcher.launch itself and reads no env file,
    so the ranks inherit the runner's environment."""
    home, cwd = dirs
    cluster = load_cluster(hosts="localhost:2")
    plan = _ds_plan(cluster, home, cwd, {}, facts={"localhost": LaunchFacts(gpus=0)})
    assert "--force_multi" not in plan.argv
    assert plan.env["TRAINFLEET_RUN_ID"] == "r1"
    assert plan.env["TRAINFLEET_NODE_ENV"] == "/tmp/trainfleet-r1/node_env.json"
    assert plan.env["DS_ACCELERATOR"] == "cpu"


def test_deepspeed_backend_refuses_an_ipv6_host_with_the_fix(dirs):
    home, cwd = dirs
    cluster = load_cluster(hosts="fe80::2,fe80::3")
    with pytest.raises(TrainfleetError) as err:
        _ds_plan(cluster, home, cwd, {}, facts={})
    assert "fe80::2" in str(err.value) and "ssh backend" in err.value.fix
    # The ssh backend takes them.
    assert _ssh_plan(cluster, home, cwd, {}).world_size == 2


def test_a_slot_beyond_a_nodes_gpus_stops_the_launch_naming_the_node(tmp_path):
    """A hostfile's `slots=8` on a node whose probe found 4 GPUs. GPUs are facts here (no GPU
    exists on this machine); a node without GPUs runs its ranks on CPU and is not checked."""
    from trainfleet.launch import check_slots

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("gpu-node-1 slots=8\ngpu-node-2 slots=8\n")
    cluster = load_cluster(hostfile=str(hostfile))
    facts = {"gpu-node-1": LaunchFacts(gpus=8), "gpu-node-2": LaunchFacts(gpus=4)}
    with pytest.raises(TrainfleetError) as err:
        check_slots(cluster, facts)
    assert "gpu-node-2 has 4 GPU(s) (0-3), but its slots name GPU 4" in str(err.value)
    assert "slots=4" in err.value.fix
    check_slots(cluster, {"gpu-node-1": LaunchFacts(gpus=8), "gpu-node-2": LaunchFacts(gpus=0)})
    check_slots(load_cluster(hostfile=str(hostfile), num_gpus=4), facts)


def test_master_addr_is_checked_like_a_host():
    assert LaunchOptions(command=("t.py",), master_addr="10.0.0.5").master_addr == "10.0.0.5"
    with pytest.raises(SpecError, match="--master_addr"):
        LaunchOptions(command=("t.py",), master_addr="10.0.0.5;reboot")


def test_the_preflight_lets_an_interface_mismatch_through_since_every_node_gets_its_own():
    """Doctor reports one NCCL_SOCKET_IFNAME for nodes whose interfaces differ as an error; the
    launch sets each node's own interface over it, so it does not stop the launch."""
    from trainfleet.doctor import DoctorReport
    from trainfleet.doctor.findings import Finding, Severity
    from trainfleet.launch import blocking

    mismatch = Finding(id="iface-mismatch", severity=Severity.ERROR, nodes=("gpu-node-2",))
    firewall = Finding(id="firewall-blocks-ports", severity=Severity.ERROR, nodes=("gpu-node-1",))
    report = DoctorReport(findings=[mismatch, firewall], nodes={})
    assert blocking(report) == [firewall]
