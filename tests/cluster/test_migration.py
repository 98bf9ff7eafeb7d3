"""The migration table of README and docs/migration.md, run: each command a user already types
(DeepSpeed's runner, per-node torchrun, accelerate launch, LLaMA-Factory, axolotl, LMFlow-style
shell scripts) and the trainfleet command that replaces it, on one real 3-node sandbox whose
nodes name their interfaces differently; and the environment users bring (NCCL_*, PYTHON*,
~/.deepspeed_env) reaching every rank on both backends. The hostfile is the one users have;
the sandbox's ssh settings come with --ssh-config, where a user's would come from
~/.ssh/config.

Run with `-s` to see each command's output (README's excerpts come from such a run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainfleet.examples import ALLREDUCE

pytestmark = pytest.mark.cluster

SCRIPTS = Path(__file__).parent / "scripts" / "migration"
IFNAMES = ["ens14f0", "ens14f1", "ens14f2"]
NODES = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
NEEDS_DEEPSPEED = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"
)


SANDBOX = {"nodes": 3, "ifnames": IFNAMES}
"""The module's one sandbox (conftest's module_sandbox)."""


@pytest.fixture(scope="module")
def box(module_sandbox):
    return module_sandbox


def trainfleet(box, *args: str, cwd: Path, env: dict | None = None) -> tuple[int, str]:
    """`trainfleet launch --hostfile HOSTFILE ARGS` as a user runs it, in `cwd`."""
    argv = [sys.executable, "-m", "trainfleet", "launch", "--hostfile", str(box.hostfile)]
    argv += ["--ssh-config", str(box.ssh_config), *args]
    env = {**os.environ, **(env or {})}
    # The nodes find `python3` (run_finetune.sh) and console scripts where this venv has them.
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    out = done.stdout + done.stderr
    print(f"\n$ trainfleet launch --hostfile hostfile {' '.join(args)}\n{out}")
    return done.returncode, out


@NEEDS_DEEPSPEED
@pytest.mark.parametrize("backend", ["ssh", "deepspeed"])
def test_a_deepspeed_runner_job_runs_unchanged(box, tmp_path, backend):
    """`deepspeed --hostfile hostfile ds_train.py --deepspeed --deepspeed_config ds.json`."""
    (tmp_path / "ds.json").write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 1,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
                "zero_optimization": {"stage": 2},
            }
        )
    )
    code, out = trainfleet(
        box,
        f"--backend={backend}",
        "--run-dir",
        str(tmp_path / "run"),
        "--",
        str(SCRIPTS / "ds_train.py"),
        "--deepspeed",
        "--deepspeed_config",
        "ds.json",
        cwd=tmp_path,
    )
    assert code == 0, out
    for rank, node in enumerate(NODES):
        # --local_rank reached the script (it defines the option) and ZeRO-2 took 3 steps.
        said = f"rank {rank}/3 local_rank 0 zero stage 2 steps 3"
        assert f"[{node}:{rank}] {said}" in out, out


def test_per_node_torchrun_becomes_one_command_with_its_port_flag(box, tmp_path):
    """`torchrun --nnodes 2 --node_rank K --nproc_per_node 1 --master_addr A --master_port
    29510 allreduce.py` on every node."""
    code, out = trainfleet(
        box, "--master_port", "29510", "--run-dir", str(tmp_path / "run"), "--", str(ALLREDUCE),
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    assert "[gpu-node-3:2] rank 2/3 sum=6.0 GLOO_SOCKET_IFNAME=ens14f2" in out, out
    assert json.loads((tmp_path / "run" / "run.json").read_text())["master"].endswith(":29510")


def test_an_accelerate_script_runs_without_accelerate_launch(box, tmp_path):
    """`accelerate launch --multi_gpu --num_machines 2 ... accelerate_train.py`."""
    code, out = trainfleet(
        box, "--run-dir", str(tmp_path / "run"), "--", str(SCRIPTS / "accelerate_train.py"),
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    for rank, node in enumerate(NODES):
        assert f"[{node}:{rank}] process {rank}/3 MULTI_CPU sum=6.0" in out, out


def test_a_shell_script_entry_point_runs_on_every_rank(box, tmp_path):
    """LMFlow / gpt-neox style: a script that sets variables, then starts Python."""
    code, out = trainfleet(
        box, "--run-dir", str(tmp_path / "run"), "--", str(SCRIPTS / "run_finetune.sh"),
        "--epochs", "1", cwd=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    for rank, node in enumerate(NODES):
        said = f"finetune rank {rank}/3 sum=6.0 tag=lmflow-style args=--lr 2e-5 --epochs 1"
        assert f"[{node}:{rank}] {said}" in out, out


def test_a_console_script_on_the_nodes_path_runs_and_its_ranks_join(box, tmp_path):
    """A pip-installed command (llamafactory-cli, trl, axolotl are such wrappers): a file
    with the node python's #! line, found on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "my-trainer"
    tool.write_text(
        f"#!{sys.executable}\n"
        "import runpy\n"
        f"runpy.run_path({str(SCRIPTS / 'finetune.py')!r}, run_name='__main__')\n"
    )
    tool.chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    code, out = trainfleet(
        box, "--run-dir", str(tmp_path / "run"), "--", "my-trainer", "--epochs", "1",
        cwd=tmp_path, env={"PATH": path},
    )  # fmt: skip
    assert code == 0, out
    for rank, node in enumerate(NODES):
        said = f"finetune rank {rank}/3 sum=6.0 tag=None args=--epochs 1"
        assert f"[{node}:{rank}] {said}" in out, out
    # (That it runs inside the rank, where its joins are seen, is unit-tested in
    # tests/unit/test_node_shim.py.)


@pytest.mark.parametrize("backend", ["ssh", pytest.param("deepspeed", marks=NEEDS_DEEPSPEED)])
def test_the_runner_s_environment_reaches_every_rank(box, tmp_path, backend):
    """NCCL_DEBUG and a PYTHON* variable from the launch shell, and a ~/.deepspeed_env entry,
    on every rank, as DeepSpeed's runner gives them."""
    home = tmp_path / "home"
    home.mkdir()
    # A token under a name that says nothing, and one in the script's arguments: both reach
    # the ranks, neither is written into the run directory (#17).
    token, flag_token = "hf_" + "A1b2" * 9, "hf_" + "Z9y8" * 9
    (home / ".deepspeed_env").write_text(f"FROM_DEEPSPEED_ENV=yes\nHUB_UPLOAD={token}\n")
    shell = {"HOME": str(home), "NCCL_DEBUG": "INFO", "PYTHONFAULTHANDLER": "1"}
    code, out = trainfleet(
        box, f"--backend={backend}", "--run-dir", str(tmp_path / "run"), "--",
        str(SCRIPTS / "print_env.py"), "NCCL_DEBUG", "PYTHONFAULTHANDLER", "FROM_DEEPSPEED_ENV",
        "HUB_UPLOAD", f"--hub_token={flag_token}", cwd=tmp_path, env=shell,
    )  # fmt: skip
    assert code == 0, out
    for rank, node in enumerate(NODES):
        said = f"NCCL_DEBUG=INFO PYTHONFAULTHANDLER=1 FROM_DEEPSPEED_ENV=yes HUB_UPLOAD={token}"
        assert f"[{node}:{rank}] rank {rank}: {said}" in out, out
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file() and "logs" not in p.parts]
    assert {p.name for p in written} >= {"env.txt", "run.json"}, written
    for path in written:
        text = path.read_text(errors="replace")
        assert token not in text and flag_token not in text, path
    assert "--hub_token=***" in (tmp_path / "run" / "run.json").read_text()


@pytest.mark.parametrize("backend", ["ssh", pytest.param("deepspeed", marks=NEEDS_DEEPSPEED)])
def test_dry_run_shows_each_node_and_writes_nothing_on_the_nodes_or_here(box, tmp_path, backend):
    """The first command a migrating user runs. The sandbox's nodes share this machine's file
    system and work in `tmp_path`, so a file any node's probe made or removed there, or a run
    directory made here, would change the directory's mtime."""
    os.utime(tmp_path, ns=(0, 0))
    code, out = trainfleet(
        box, f"--backend={backend}", "--dry-run", "--", str(ALLREDUCE),
        cwd=tmp_path, env={"NCCL_DEBUG": "INFO"},
    )  # fmt: skip
    assert code == 0, out
    for node in NODES:
        assert f"\n{node}: " in out, out
    assert "NCCL_DEBUG=INFO  # launch shell" in out, out
    assert list(tmp_path.iterdir()) == []
    assert tmp_path.stat().st_mtime_ns == 0, "an entry was made or removed in the workdir"


@pytest.mark.parametrize(
    ("command", "instead"),
    [
        (["axolotl", "train", "config.yml", "--sweep", "s.yml"], "-- -m axolotl.cli.train"),
        (["torchrun", "--nproc_per_node=8", "train.py", "--lr", "1e-4"], "-- train.py --lr 1e-4"),
        (["accelerate", "launch", "train.py"], "-- train.py"),
        (["deepspeed", "train.py", "--deepspeed", "ds.json"], "-- train.py --deepspeed ds.json"),
    ],
)
def test_a_nested_launcher_is_refused_before_anything_starts_with_the_command_to_use(
    box, tmp_path, command, instead
):
    code, out = trainfleet(box, "--run-dir", str(tmp_path / "run"), "--", *command, cwd=tmp_path)
    assert code == 1, out
    assert instead in out and "(nested-launcher)" in out, out
    assert not (tmp_path / "run").exists()  # nothing was started


def test_no_rank_prints_c10d_s_client_hostname_warning(box, tmp_path):
    """c10d asks the resolver for each client's name by its IPv4-mapped address; the sandbox's
    /etc/hosts names those (sandbox/texts.py), so no rank says `err=-3`."""
    code, out = trainfleet(
        box, "--run-dir", str(tmp_path / "run"), "--", str(ALLREDUCE), cwd=tmp_path
    )
    assert code == 0, out
    assert "hostname of the client socket cannot be retrieved" not in out, out


@NEEDS_DEEPSPEED
def test_deepspeed_backend_with_one_remote_node_runs_there_not_here(box, tmp_path):
    """`-i gpu-node-2`: DeepSpeed's runner alone would start that node's ranks on the launching
    machine; trainfleet passes --force_multi, and the rank runs on gpu-node-2."""
    code, out = trainfleet(
        box, "--backend=deepspeed", "-i", "gpu-node-2", "--run-dir", str(tmp_path / "run"),
        "--", str(SCRIPTS / "print_env.py"), "TRAINFLEET_NODE", "GLOO_SOCKET_IFNAME",
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    assert "[gpu-node-2:0] rank 0: TRAINFLEET_NODE=gpu-node-2 GLOO_SOCKET_IFNAME=ens14f1" in out
