"""A trainer no one here wrote, launched unchanged: TRL's SFT script (`trl/scripts/sft.py` of
trl 1.16.0, as `pip install trl` ships it) across 2 sandbox nodes whose interfaces are named
differently, on both backends, with the project's own tiny Llama and a local chat data set
(nothing is downloaded).

It trains with data parallelism over gloo: HF Trainer's DeepSpeed path cannot run on a machine
without an accelerator (accelerate 1.15 counts one process on the DeepSpeed path without one,
and with --use_cpu it never initializes DeepSpeed's communication, so a ZeRO-3 JSON fails with
DeepSpeed's batch-size assertion either way); on GPU nodes the same command takes `--deepspeed
ds_z3.json`. The flags after the script are TRL's own; --use_cpu, --ddp_backend gloo and --bf16
false are what any CPU run of it needs.
"""

from __future__ import annotations

import importlib.util
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
    argv = [
        sys.executable, "-m", "trainfleet", "launch", "-c", str(box.cluster_file),
        f"--backend={backend}", "--run-dir", str(tmp_path / "run"), "--",
        trl.scripts.sft.__file__,
        "--model_name_or_path", str(assets["model"]), "--dataset_name", str(assets["data"]),
        "--output_dir", str(output), "--max_steps", "3", "--per_device_train_batch_size", "4",
        "--max_length", "64", "--logging_steps", "1", "--save_strategy", "no",
        "--report_to", "none", "--dtype", "float32", "--bf16", "false",
        "--use_cpu", "true", "--ddp_backend", "gloo", "--log_level", "info",
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
