"""`trainfleet plan` with no cluster plans for this machine's GPUs, as its help says.

The GPUs are simulated because none can exist here: an nvidia-smi on PATH that answers as the
H200 recorded by bench/gpu_validate.py (sandbox/fakegpu.py). Found on that H200 on 2026-11-27:
plan said "1 node(s) x 8 GPU(s) of 80.00 GiB" there (it filled in an 8-GPU H100 node).
"""

from __future__ import annotations

import json

import pytest

from trainfleet.cli.main import main
from trainfleet.plan.hardware import this_machine
from trainfleet.sandbox import fakegpu

pytestmark = pytest.mark.unit

MODEL = {
    "model_type": "llama", "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
}  # fmt: skip


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MODEL))
    return path


def _gpus_on_path(monkeypatch, tmp_path, count: int) -> None:
    bin_dir = fakegpu.write_wrappers(tmp_path / "fakegpu", fakegpu.FakeGpuSpec(gpus=count))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _plan(config, capsys, *args: str) -> dict:
    main(["plan", "--model", str(config), "--json", *args])
    return json.loads(capsys.readouterr().out)


def test_this_machines_gpus_are_the_default(monkeypatch, tmp_path, config, capsys):
    _gpus_on_path(monkeypatch, tmp_path, 2)
    here = this_machine()
    assert here is not None and (here.count, here.product) == (2, "NVIDIA H200")
    assert here.memory_bytes == 143771 * 2**20
    plan = _plan(config, capsys)
    assert (plan["target"]["nodes"], plan["target"]["gpus_per_node"]) == (1, 2)
    assert plan["target"]["gpu_memory_bytes"] == 143771 * 2**20
    assert plan["target"]["assumed"]["peak_flops"] == 989e12  # the table's H200
    assert "--gpus-per-node 2 (this machine)" in plan["defaults_filled_in"]


def test_cuda_visible_devices_limits_them(monkeypatch, tmp_path, config, capsys):
    _gpus_on_path(monkeypatch, tmp_path, 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    assert _plan(config, capsys)["target"]["gpus_per_node"] == 3


def test_without_a_gpu_an_eight_gpu_h100_node_is_assumed_and_said(monkeypatch, config, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    plan = _plan(config, capsys)
    assert (plan["target"]["gpus_per_node"], plan["target"]["gpu_memory_bytes"]) == (8, 80 * 2**30)
    assert {"--gpus-per-node 8", "--gpu H100"} <= set(plan["defaults_filled_in"])


def test_the_gpus_asked_for_win(monkeypatch, tmp_path, config, capsys):
    _gpus_on_path(monkeypatch, tmp_path, 2)
    plan = _plan(config, capsys, "--nodes", "2", "--gpus-per-node", "8", "--gpu", "H20")
    assert (plan["target"]["nodes"], plan["target"]["gpus_per_node"]) == (2, 8)
    assert plan["target"]["gpu_memory_bytes"] == 96 * 2**30
