"""The launch plan: per-node argv and environment, compared to expected text (`--dry-run`)."""

from __future__ import annotations

import pytest

from trainfleet.cluster import load_cluster, parse_cluster_yaml
from trainfleet.errors import TrainfleetError
from trainfleet.launch.backends.ssh import plan_launch, render_plan
from trainfleet.launch.masking import mask_value, masked, masked_argv
from trainfleet.launch.options import LaunchFacts, LaunchOptions, choose_master_port
from trainfleet.node import isolated

pytestmark = pytest.mark.unit

CLUSTER = """\
master: gpu-node-1
env: {HF_HOME: /data/hf, HF_TOKEN: hf_abcdef}
nodes:
  - host: gpu-node-1
    slots: 2
    python: /opt/conda/envs/train/bin/python
  - host: gpu-node-2
    slots: 2
    python: /opt/conda/envs/train/bin/python
    env: {NCCL_IB_HCA: mlx5, WANDB_API_KEY: secret123}
"""
FACTS = {
    "gpu-node-1": LaunchFacts(interface="ens14f0", gpus=2, python_version=(3, 11)),
    "gpu-node-2": LaunchFacts(interface="ens14f1", gpus=0, python_version=(3, 10)),
}
"""(torchrun's agent imports nothing from the working directory: with -P on 3.11, with a
sys.path filter before 3.11.)"""
LAUNCH_ENV = {
    "PATH": "/opt/conda/envs/train/bin:/usr/bin",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-pw",
    "HOME": "/nonexistent-home",  # no ~/.deepspeed_env: the plan reads only what is given
    "TORCH_HOME": "/data/torch",
    "SSH_AUTH_SOCK": "/tmp/agent",
}

EXPECTED = """\
backend ssh: 2 node(s), world size 4, master gpu-node-1 (10.0.0.11:29500)

gpu-node-1: node_rank 0, ranks 0-1, cwd /work/project
  argv: /opt/conda/envs/train/bin/python -u -P -m torch.distributed.run --nnodes=2 --node-rank=0 --nproc-per-node=2 --master-addr=10.0.0.11 --master-port=29500 --tee=3 '{SHIM}' train.py --lr 1e-4
  env:
    GLOO_SOCKET_IFNAME=ens14f0  # interface to the master
    HF_HOME=/data/hf  # cluster.yaml
    HF_TOKEN='***'  # cluster.yaml
    MLFLOW_TRACKING_PASSWORD='***'  # launch shell
    NCCL_SOCKET_IFNAME=ens14f0  # interface to the master
    PATH=/opt/conda/envs/train/bin:/usr/bin  # launch shell
    TORCH_FR_BUFFER_SIZE=2000  # trainfleet's default
    TORCH_HOME=/data/torch  # launch shell
    TRAINFLEET_LOCAL_RANK_ARG=auto
    TRAINFLEET_NODE=gpu-node-1
    TRAINFLEET_RESTART=0
    TRAINFLEET_RUN_ID=r1

gpu-node-2: node_rank 1, ranks 2-3, cwd /work/project
  argv: /opt/conda/envs/train/bin/python -u -c 'import sys;sys.path[:]=[p for p in sys.path if p[:1]=="/"];import runpy;del sys.argv[0];runpy.run_module(sys.argv[0],run_name="__main__",alter_sys=True)' torch.distributed.run --nnodes=2 --node-rank=1 --nproc-per-node=2 --master-addr=10.0.0.11 --master-port=29500 --tee=3 '{SHIM}' train.py --lr 1e-4
  env:
    DS_ACCELERATOR=cpu  # no GPU on the node
    GLOO_SOCKET_IFNAME=ens14f1  # interface to the master
    HF_HOME=/data/hf  # cluster.yaml
    HF_TOKEN='***'  # cluster.yaml
    MLFLOW_TRACKING_PASSWORD='***'  # launch shell
    NCCL_IB_HCA=mlx5  # cluster.yaml (gpu-node-2)
    NCCL_SOCKET_IFNAME=ens14f1  # interface to the master
    PATH=/opt/conda/envs/train/bin:/usr/bin  # launch shell
    TORCH_FR_BUFFER_SIZE=2000  # trainfleet's default
    TORCH_HOME=/data/torch  # launch shell
    TRAINFLEET_LOCAL_RANK_ARG=auto
    TRAINFLEET_NODE=gpu-node-2
    TRAINFLEET_RESTART=0
    TRAINFLEET_RUN_ID=r1
    WANDB_API_KEY='***'  # cluster.yaml (gpu-node-2)

{SHIM}: trainfleet's rank wrapper, written to a private temp dir on each node"""


def _plan(cluster, facts=FACTS, **options):
    return plan_launch(
        cluster,
        facts,
        LaunchOptions(command=("train.py", "--lr", "1e-4"), run_id="r1", **options),
        master_addr="10.0.0.11",
        launch_env=LAUNCH_ENV,
        launch_cwd="/work/project",
    )


def test_dry_run_text_per_node_interface_cpu_nodes_and_masked_secrets():
    plan = _plan(parse_cluster_yaml(CLUSTER, "cluster.yaml"))
    assert render_plan(plan) == EXPECTED
    # The secrets still reach the nodes (over ssh stdin): masked only where shown.
    assert plan.nodes[1].env["WANDB_API_KEY"] == "secret123"
    assert plan.nodes[0].env["HF_TOKEN"] == "hf_abcdef"


@pytest.mark.parametrize(
    ("name", "value"),
    [("AZURE_STORAGE_KEY", "abc"), ("GITHUB_PAT", "abc"), ("S3_KEY", "abc"),
     ("MY_DB_PASS", "abc"), ("HF_AUTH", "abc"), ("OTHER", "hf_" + "x" * 34),
     ("OTHER", "ghp_" + "y" * 36), ("OTHER", "AKIAABCDEFGHIJKLMNOP")],
)  # fmt: skip
def test_secrets_are_masked_by_name_and_by_shape(name, value):
    """#17: masking by a handful of names let AZURE_STORAGE_KEY, GITHUB_PAT or a token under
    any name show in --dry-run and in the run directory."""
    assert masked({name: value}) == {name: "***"}


def test_passwords_in_urls_and_secret_flags_are_masked_where_shown():
    env = {"PIP_INDEX_URL": "https://ci:s3cr3t@pypi.example/simple", "PATH": "/usr/bin"}
    assert masked(env) == {
        "PIP_INDEX_URL": "https://ci:***@pypi.example/simple",
        "PATH": "/usr/bin",
    }
    argv = ["sft.py", "--hub_token", "hf_abc", "--report_to=wandb", "--hub-token=hf_x", "--lr", "1"]
    assert masked_argv(argv) == [
        "sft.py", "--hub_token", "***", "--report_to=wandb", "--hub-token=***", "--lr", "1"
    ]  # fmt: skip
    assert masked({"NCCL_SOCKET_IFNAME": "ens14f0", "LD_LIBRARY_PATH": "/x"})["LD_LIBRARY_PATH"]


def test_the_dry_run_shows_the_command_without_its_secrets():
    """The same masking writes run.json's `command` (launch/__init__.py)."""
    cluster = parse_cluster_yaml(CLUSTER, "cluster.yaml")
    command = ("sft.py", "--hub_token", "hf_" + "z" * 34, "--output_dir", "out")
    plan = plan_launch(cluster, FACTS, LaunchOptions(command=command, run_id="r1"),
                       master_addr="10.0.0.11", launch_env={}, launch_cwd="/w")  # fmt: skip
    shown = render_plan(plan)
    assert "z" * 34 not in shown and "--hub_token '***'" in shown
    assert plan.nodes[0].argv[-3] == "hf_" + "z" * 34  # the nodes still get it


def test_a_pinned_interface_wins_and_an_include_with_gpu_ids_sets_visible_devices(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=4\nb slots=4\n")
    cluster = load_cluster(hostfile=str(hostfile), include="a:1,3@b")
    plan = _plan(cluster, facts={"a": LaunchFacts(interface="eth1", gpus=4)})
    a, b = plan.nodes
    assert a.env["GLOO_SOCKET_IFNAME"] == a.env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert "GLOO_SOCKET_IFNAME" not in b.env  # no interface known for b: none set
    assert (a.slots, a.env["CUDA_VISIBLE_DEVICES"]) == (2, "1,3")
    assert "CUDA_VISIBLE_DEVICES" not in b.env
    assert b.env["DS_ACCELERATOR"] == "cpu"  # nothing known about b's GPUs: treated as none
    assert (b.first_rank, plan.world_size) == (2, 6)
    assert "--nproc-per-node=2" in a.argv and "--nproc-per-node=4" in b.argv


def test_module_mode_and_master_port_override():
    cluster = parse_cluster_yaml(CLUSTER, "cluster.yaml")
    plan = plan_launch(
        cluster,
        FACTS,
        LaunchOptions(command=("-m", "pkg.train", "--x"), run_id="r1", master_port=29700),
        master_addr="10.0.0.11",
        launch_env={},
        launch_cwd="/w",
    )
    assert plan.nodes[0].argv[-4:] == ["{SHIM}", "-m", "pkg.train", "--x"]
    assert plan.master_port == 29700 and "--master-port=29700" in plan.nodes[1].argv


def test_a_busy_master_port_moves_to_the_next_free_one_and_says_so():
    assert choose_master_port(29500, (22, 8080)) == (29500, None)
    port, note = choose_master_port(29500, (29500, 29501))
    assert port == 29502 and "29500 is taken" in note and "using 29502" in note
    facts = {**FACTS, "gpu-node-1": LaunchFacts(interface="ens14f0", gpus=2, listening=(29500,))}
    plan = _plan(parse_cluster_yaml(CLUSTER, "cluster.yaml"), facts=facts)
    assert plan.master_port == 29501 and plan.notes


def _ds_plan(cluster, tmp_path, **options):
    from trainfleet.launch.backends.deepspeed import plan_deepspeed

    return plan_deepspeed(
        cluster,
        FACTS,
        LaunchOptions(
            command=("train.py", "--lr", "1e-4"), run_id="r1", backend="deepspeed", **options
        ),
        master_addr="10.0.0.11",
        launch_env=LAUNCH_ENV,
        launch_cwd="/work/project",
        run_dir=tmp_path,
        python="/usr/bin/python3",
    )


def test_deepspeed_plan_explicit_hosts_master_and_per_node_env_without_secrets_in_argv(
    tmp_path,
):
    from trainfleet.launch.backends.deepspeed import render_deepspeed

    plan = _ds_plan(parse_cluster_yaml(CLUSTER, "cluster.yaml"), tmp_path)
    runner = ["/usr/bin/python3", "-u", "-c", isolated.RUN_MODULE, "deepspeed.launcher.runner"]
    assert plan.argv[:5] == runner  # importing nothing from the launch directory
    assert "--include" in plan.argv
    assert plan.argv[plan.argv.index("--include") + 1] == "gpu-node-1:0,1@gpu-node-2:0,1"
    assert "--master_addr=10.0.0.11" in plan.argv and "--no_ssh_check" in plan.argv
    assert plan.argv[-4:] == ["/tmp/trainfleet-r1/shim.py", "train.py", "--lr", "1e-4"]
    assert plan.hostfile == "gpu-node-1 slots=2\ngpu-node-2 slots=2\n"
    # Every node's own interface, through the shim's table; the secrets only there.
    table = {e.host: e.env for e in plan.node_table}
    assert table["gpu-node-2"]["GLOO_SOCKET_IFNAME"] == "ens14f1"
    assert table["gpu-node-2"]["WANDB_API_KEY"] == "secret123"
    shown = " ".join(plan.argv) + plan.ds_env + " ".join(plan.env.values())
    assert "secret123" not in shown and "hf_abcdef" not in shown
    text = render_deepspeed(plan)
    assert "WANDB_API_KEY='***'" in text and "secret123" not in text
    # DeepSpeed's runner would export MLFLOW_* on pdsh's command line: taken from its env,
    # given to every node through the table instead.
    assert plan.unset == ["MLFLOW_TRACKING_PASSWORD"]
    assert all(e.env["MLFLOW_TRACKING_PASSWORD"] == "mlflow-pw" for e in plan.node_table)
    assert "mlflow-pw" not in text
    assert "TRAINFLEET_LOCAL_RANK_ARG=never" in plan.ds_env  # DeepSpeed passes it itself


def test_deepspeed_backend_refuses_per_node_ssh_options(tmp_path):
    cluster = parse_cluster_yaml(
        "nodes:\n  - host: a\n    ssh: {port: 2222}\n  - host: b\n", "cluster.yaml"
    )
    with pytest.raises(TrainfleetError, match="pdsh"):
        _ds_plan(cluster, tmp_path)


def test_a_restart_is_told_to_every_rank_on_both_backends(tmp_path):
    """`--max-restarts`: the Nth restart's ranks see TRAINFLEET_RESTART=N, so a script knows
    to resume."""
    cluster = parse_cluster_yaml(CLUSTER, "cluster.yaml")
    assert {n.env["TRAINFLEET_RESTART"] for n in _plan(cluster, restart=2).nodes} == {"2"}
    assert "TRAINFLEET_RESTART=2" in _ds_plan(cluster, tmp_path, restart=2).ds_env.splitlines()


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("postgres://u:p@ss@db:5432/app", "postgres://u:***@db:5432/app"),
        ("http://u:pa/ss@proxy:3128", "http://u:***@proxy:3128"),
        ("user:S3cr3t@tcp(db:3306)/app", "user:***@tcp(db:3306)/app"),
        ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0a2V5==;"
         "EndpointSuffix=core.windows.net",
         "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;"
         "EndpointSuffix=core.windows.net"),
        ("BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=2022&sig=Zm9v",
         "BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=***"),
        ("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln", "Bearer ***"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.c2ln", "Authorization: Bearer ***"),
        ("-o ProxyCommand=sshpass\t-p\tjump-pw\tssh\t-W\t%h:%p\tjump",
         "-o ProxyCommand=sshpass\t-p\t***\tssh\t-W\t%h:%p\tjump"),
    ],
)  # fmt: skip
def test_a_password_in_a_value_is_masked_whole_and_the_rest_still_shows(value, shown):
    """#33 (review F12): `p@ss` showed as `***@ss`, and a password with `/`, a scheme-less DSN, an
    Azure key or SAS, a Bearer token and sshpass's -p in a ProxyCommand showed whole."""
    assert mask_value(value) == shown


def test_passphrase_and_apikey_names_and_password_flags_are_masked():
    """#33 (review F12): SSH_PASSPHRASE, OPENAI_APIKEY, --passphrase X, sshpass -p X and
    mysql -pX showed their secret."""
    assert masked({"SSH_PASSPHRASE": "open sesame", "OPENAI_APIKEY": "k-123"}) == {
        "SSH_PASSPHRASE": "***",
        "OPENAI_APIKEY": "***",
    }
    assert masked_argv(["sign.py", "--passphrase", "open-sesame", "--apikey=k-123"]) == [
        "sign.py", "--passphrase", "***", "--apikey=***"
    ]  # fmt: skip
    assert masked_argv(["sshpass", "-p", "pw1", "ssh", "-p", "2222", "gpu-node-2"]) == [
        "sshpass", "-p", "***", "ssh", "-p", "2222", "gpu-node-2"
    ]  # fmt: skip
    assert masked_argv(["/usr/bin/sshpass", "-ppw1", "rsync", "-a", "src", "dst"])[1] == "-p***"
    assert masked_argv(["mysql", "-uroot", "-ppw1", "app"]) == ["mysql", "-uroot", "-p***", "app"]
    shown = masked_argv(["bash", "-c", "sshpass -p 'pw1' ssh gpu-node-2 --hub_token hf_x"])
    assert "pw1" not in shown[2] and "hf_x" not in shown[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["ssh", "-p", "2222", "gpu-node-2"],  # a port
        ["mkdir", "-p", "/data/out"],  # a flag
        ["mysql", "-p", "app"],  # asks for the password; app is the database
        ["sshpass", "-f", "/run/pw", "ssh", "-p", "22", "gpu-node-2"],  # ssh's port, not sshpass's
    ],
)  # fmt: skip
def test_a_short_p_that_is_no_password_is_shown(argv):
    assert masked_argv(argv) == argv


@pytest.mark.parametrize(
    "value",
    [
        "/data/models/llama-3-8b", "meta-llama/Llama-3.1-8B-Instruct", "gpu-node-1:29500",
        "10.0.0.11:29500", "https://pypi.example/simple", "https://host:8443/org/repo@v1.0",
        "git+https://github.com/org/repo@v1.0", "python:3.11@sha256:0123abcd",
        "registry:5000/team/image@sha256:0123abcd", "8.0 8.6 9.0+PTX", "localhost,127.0.0.1",
        "-F /etc/ssh/cfg -p 2222 -l ubuntu -oBatchMode=yes -T",
    ],
)  # fmt: skip
def test_ordinary_values_are_shown_as_they_are(value):
    """Masking what is no secret hides what the user needs to check in --dry-run."""
    assert mask_value(value) == value


@pytest.mark.parametrize(
    ("name", "value"),
    [("WANDB_API_KEY", "abc"), ("HF_TOKEN", "abc"), ("OTHER", "hf_" + "x" * 34),
     ("OTHER", "ghp_" + "y" * 36), ("OTHER", "AKIAABCDEFGHIJKLMNOP"),
     ("OTHER", "xoxb-1234567890-abcdef")],
)  # fmt: skip
def test_what_was_masked_before_stays_masked(name, value):
    assert masked({name: value}) == {name: "***"}
    assert masked_argv(["t.py", "--hub_token", value, f"--api_key={value}"]) == [
        "t.py", "--hub_token", "***", "--api_key=***"
    ]  # fmt: skip
