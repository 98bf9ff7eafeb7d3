"""Trainers no one here wrote, launched unchanged. TRL's SFT script (`trl/scripts/sft.py` of
trl 1.16.0, as `pip install trl` ships it) across 2 sandbox nodes whose interfaces are named
differently, on both backends, with the project's own tiny Llama, a local chat data set (nothing
is downloaded) and a user's ZeRO-3 JSON in the shape of HF's documented ds_config_zero3.json
("auto" where HF fills the value in).

The flags after the script are TRL's own; --use_cpu, --ddp_backend gloo and --bf16 false are
what any CPU run of it needs. The JSON leaves out "train_batch_size": under --use_cpu, HF starts
torch.distributed itself and DeepSpeed's communication only in deepspeed.initialize, while
zero.Init (model loading under ZeRO-3) reads the JSON before that and counts one rank, so
HF's "auto" (8 here) fails DeepSpeed's batch check: "8 != 4 * 1 * 1". Left out, DeepSpeed
computes it. On GPU nodes accelerate starts DeepSpeed's communication first and the key may stay.

LLaMA-Factory 0.9.5 and axolotl 0.19.0, each with its YAML recipe and the ZeRO-3 JSON their
examples ship (same key left out), each from its own environment (`make third-party`: its pins
over this venv), as their users launch them from there: trainfleet's nodes run the launching
python, as DeepSpeed's runner does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        importlib.util.find_spec("trl") is None, reason="trl is not installed (`make venv`)"
    ),
]

IFNAMES = ["ens14f0", "ens14f1"]
LF_PYTHON = Path(sys.executable).parent.parent / "llamafactory" / "bin" / "python"
AX_PYTHON = Path(sys.executable).parent.parent / "axolotl" / "bin" / "python"
ZERO3 = {
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True,
                          "stage3_gather_16bit_weights_on_model_save": True},
}  # fmt: skip
"""The ZeRO-3 JSON LLaMA-Factory's and axolotl's examples ship, less "train_batch_size" (above)."""


SANDBOX = {"nodes": 2, "ifnames": IFNAMES}
"""The module's one sandbox (conftest's module_sandbox)."""


@pytest.fixture(scope="module")
def box(module_sandbox):
    return module_sandbox


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    """The demo's tiny Llama with its chat template, and 64 chats in a data set directory."""
    from trainfleet.train import demo_assets

    root = tmp_path_factory.mktemp("trl")
    demo_assets.write_tokenizer(root / "model")
    demo_assets.write_model(root / "model", tokenizer_dir=root / "model", seed=0)
    (root / "data").mkdir()
    demo_assets.write_dataset(root / "data" / "train.jsonl", n=64)
    return {"model": root / "model", "data": root / "data"}


@pytest.mark.parametrize(
    "backend",
    [
        "ssh",
        pytest.param(
            "deepspeed",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"
            ),
        ),
    ],
)
def test_trl_sft_script_trains_on_two_nodes_and_saves_the_model(box, assets, tmp_path, backend):
    import trl.scripts.sft

    output = tmp_path / "sft-out"
    ds_json = tmp_path / "ds_z3.json"
    ds_json.write_text(json.dumps({
        "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
    }))  # fmt: skip
    argv = [
        sys.executable, "-m", "trainfleet", "launch", "-c", str(box.cluster_file),
        f"--backend={backend}", "--run-dir", str(tmp_path / "run"), "--",
        trl.scripts.sft.__file__,
        "--model_name_or_path", str(assets["model"]), "--dataset_name", str(assets["data"]),
        "--output_dir", str(output), "--max_steps", "3", "--per_device_train_batch_size", "4",
        "--max_length", "64", "--logging_steps", "1", "--save_strategy", "steps",
        "--save_steps", "3", "--report_to", "none", "--dtype", "float32", "--bf16", "false",
        "--use_cpu", "true", "--ddp_backend", "gloo", "--log_level", "info",
        "--deepspeed", str(ds_json),
    ]  # fmt: skip
    done = subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=400, check=False
    )
    out = done.stdout + done.stderr
    print(out)
    assert done.returncode == 0, out
    # World size 2: HF's total batch is 4 per device x 2 ranks, one on each node.
    assert "Total train batch size (w. parallel, distributed & accumulation) = 8" in out, out
    assert "all 2 rank(s) on 2 node(s) finished" in out
    assert "[gpu-node-1:0]" in out and "[gpu-node-2:1]" in out
    assert "Training completed." in out
    assert (output / "model.safetensors").stat().st_size > 0
    assert (output / "config.json").exists()
    # The shim's Trainer callback beat every step, unchanged script: status saw both ranks.
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    ranks = {r["rank"]: r for r in status["ranks"]}
    assert [(ranks[r]["step"], ranks[r]["total_steps"]) for r in (0, 1)] == [(3, 3), (3, 3)]
    assert all(isinstance(ranks[r]["loss"], float) for r in (0, 1)), ranks
    # DeepSpeed's own checkpoint: ZeRO-3 over 2 data-parallel ranks, each holding its partition.
    import torch

    ckpt = output / "checkpoint-3" / "global_step3"
    for rank in (0, 1):
        model = torch.load(ckpt / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt",
                           map_location="cpu", weights_only=False)  # fmt: skip
        assert model["ds_config"]["zero_optimization"]["stage"] == 3
        assert model["dp_world_size"] == 2
        optim = torch.load(ckpt / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
                           map_location="cpu", weights_only=False)  # fmt: skip
        assert optim["optimizer_state_dict"]["partition_count"] == 2


@pytest.mark.skipif(
    not LF_PYTHON.exists(), reason="LLaMA-Factory's environment is missing (`make llamafactory`)"
)
def test_llamafactory_trains_with_zero3_on_two_nodes_from_its_own_environment(
    box, assets, tmp_path
):
    """`FORCE_TORCHRUN=1 NNODES=2 NODE_RANK=K MASTER_ADDR=A llamafactory-cli train sft.yaml` on
    every node becomes one `trainfleet launch --hostfile hostfile -- -m llamafactory.launcher
    sft.yaml` (README's migration table)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "chats.jsonl").write_text((assets["data"] / "train.jsonl").read_text())
    (data / "dataset_info.json").write_text(json.dumps({"chats": {
        "file_name": "chats.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                 "assistant_tag": "assistant"},
    }}))  # fmt: skip
    (tmp_path / "ds_z3_config.json").write_text(json.dumps(ZERO3))
    output = tmp_path / "saves"
    (tmp_path / "sft.yaml").write_text(
        f"model_name_or_path: {assets['model']}\n"
        "stage: sft\ndo_train: true\nfinetuning_type: full\n"
        f"dataset: chats\ndataset_dir: {data}\ntemplate: empty\ncutoff_len: 64\n"
        "preprocessing_num_workers: 1\ndeepspeed: ds_z3_config.json\n"
        f"output_dir: {output}\nlogging_steps: 1\nsave_strategy: 'no'\nmax_steps: 3\n"
        "per_device_train_batch_size: 4\ngradient_accumulation_steps: 1\n"
        "learning_rate: 1.0e-4\nbf16: false\nuse_cpu: true\nddp_backend: gloo\n"
        "report_to: none\n"
    )
    argv = [
        str(LF_PYTHON), "-m", "trainfleet", "launch", "--hostfile", str(box.hostfile),
        "--ssh-config", str(box.ssh_config), "--run-dir", str(tmp_path / "run"), "--",
        "-m", "llamafactory.launcher", "sft.yaml",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "DISABLE_VERSION_CHECK"}
    out = _launch(argv, tmp_path, env)
    for rank, node in enumerate(["gpu-node-1", "gpu-node-2"]):
        mine = _lines_of(out, node, rank)
        assert any(f"Process rank: {rank}, world size: 2, device: cpu" in x for x in mine), out
        assert any("DeepSpeed ZeRO3 detected" in line for line in mine), out
    assert "Total train batch size (w. parallel, distributed & accumulation) = 8" in out, out
    assert "all 2 rank(s) on 2 node(s) finished" in out
    # Its own pins ran: LLaMA-Factory checks them as it starts (hparams/parser.py) and refuses
    # this venv's newer transformers unless DISABLE_VERSION_CHECK=1, which is not set here.
    assert "Version checking has been disabled" not in out
    assert (output / "model.safetensors").stat().st_size > 0
    assert (output / "trainer_log.jsonl").exists()  # LLaMA-Factory's own log, per step


@pytest.mark.skipif(
    not AX_PYTHON.exists(), reason="axolotl's environment is missing (`make third-party`)"
)
def test_axolotl_trains_with_zero3_on_two_nodes_from_its_own_environment(box, assets, tmp_path):
    """`axolotl train cfg.yml` (accelerate launch inside) on every node becomes one `trainfleet
    launch --hostfile hostfile -- -m axolotl.cli.train cfg.yml` (README's migration table)."""
    (tmp_path / "zero3.json").write_text(json.dumps(ZERO3))
    output = tmp_path / "model-out"
    (tmp_path / "cfg.yml").write_text(
        f"base_model: {assets['model']}\n"
        "datasets:\n"
        f"  - path: {assets['data'] / 'train.jsonl'}\n"
        "    ds_type: json\n    type: chat_template\n    field_messages: messages\n"
        "chat_template: tokenizer_default\nsequence_len: 64\nmicro_batch_size: 4\n"
        "gradient_accumulation_steps: 1\nnum_epochs: 1\nmax_steps: 3\nlearning_rate: 0.0001\n"
        "optimizer: adamw_torch\nlr_scheduler: cosine\nval_set_size: 0\nbf16: false\n"
        f"fp16: false\ntf32: false\nsave_strategy: 'no'\nlogging_steps: 1\noutput_dir: {output}\n"
        f"dataset_prepared_path: {tmp_path / 'prepared'}\ndeepspeed: zero3.json\n"
    )
    argv = [
        str(AX_PYTHON), "-m", "trainfleet", "launch", "--hostfile", str(box.hostfile),
        "--ssh-config", str(box.ssh_config), "--run-dir", str(tmp_path / "run"), "--",
        "-m", "axolotl.cli.train", "cfg.yml",
    ]  # fmt: skip
    # axolotl's telemetry is off where its users turn it off for every rank: the run's env file.
    (tmp_path / ".deepspeed_env").write_text("AXOLOTL_DO_NOT_TRACK=1\n")
    out = _launch(argv, tmp_path, dict(os.environ))
    assert "all 2 rank(s) on 2 node(s) finished" in out
    for rank, node in enumerate(["gpu-node-1", "gpu-node-2"]):
        # Each rank prints the config axolotl resolved: the world it joined, the ZeRO stage.
        mine = [line.split("] ", 1)[1].strip() for line in _lines_of(out, node, rank)]
        assert '"world_size": 2' in mine and '"stage": 3,' in mine, out
        assert any("Training completed!" in line for line in mine), out
    assert (output / "model.safetensors").stat().st_size > 0


def _launch(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=400, check=False
    )
    out = done.stdout + done.stderr
    print(out)
    assert done.returncode == 0, out
    return out


def _lines_of(out: str, node: str, rank: int) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(f"[{node}:{rank}] ")]
