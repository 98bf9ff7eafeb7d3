"""A trainer no one here wrote, launched unchanged: TRL's SFT script (`trl/scripts/sft.py` of
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
"""

from __future__ import annotations

import importlib.util
import json
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
