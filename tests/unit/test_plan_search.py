"""The ranked search, the DeepSpeed JSON it emits (checked by DeepSpeed's own config parser),
and `trainfleet plan` end to end in-process: seed 004's and seed 000's cases."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from trainfleet.cli.main import main
from trainfleet.errors import TrainfleetError
from trainfleet.plan import TrainSetup, make_plan
from trainfleet.plan.ds_config import deepspeed_config
from trainfleet.plan.model import ModelShape
from trainfleet.plan.search import Target, candidates, search
from trainfleet.plan.speed import Links, step_time

pytestmark = pytest.mark.unit

CONFIGS = Path(__file__).parents[2] / "examples" / "model-configs"
LLAMA70B = ModelShape.from_path(CONFIGS / "llama-2-70b.json")
QWEN32B = ModelShape.from_path(CONFIGS / "deepseek-r1-distill-qwen-32b.json")
GiB = 2**30


def h20_pair(busbw: float = 25e9) -> Target:
    return Target(
        nodes=2,
        gpus_per_node=8,
        gpu_memory_bytes=96 * GiB,
        cpu_memory_bytes=1024 * GiB,
        links=Links(peak_flops=148e12, busbw=busbw),
    )


def test_fitting_configs_come_first_fastest_first():
    ranked = search(QWEN32B, TrainSetup(seq_len=4096), h20_pair(), global_batch=64)
    fits = [c.fits for c in ranked]
    assert fits == sorted(fits, reverse=True) and any(fits) and not all(fits)
    times = [c.time.step_s for c in ranked if c.fits]
    assert times == sorted(times)
    assert ranked[0].reason.startswith("fastest that fits")
    assert all(c.reason.startswith("does not fit") for c in ranked if not c.fits)
    assert all(c.gpu.total_bytes <= 96 * GiB for c in ranked if c.fits)


def test_a_slower_network_favours_less_communication():
    """ZeRO-3 gathers the params in forward and backward on top of ZeRO-2's reduce-scatter:
    over a 2 GB/s network the best config is ZeRO-2; over 200 GB/s ZeRO-3 wins (its memory
    room buys a larger micro batch / no offload) and communication time scales with 1/busbw."""
    slow = search(QWEN32B, TrainSetup(), h20_pair(busbw=2e9), global_batch=64)[0]
    fast = search(QWEN32B, TrainSetup(), h20_pair(busbw=200e9), global_batch=64)[0]
    assert slow.setup.zero == 2 and fast.setup.zero == 3
    setup = TrainSetup(zero=3, micro_batch=2, grad_ckpt=True)
    times = [
        step_time(QWEN32B, setup, h20_pair(bw).links, nodes=2, gpus_per_node=8, global_batch=64)
        for bw in (2e9, 200e9)
    ]
    assert times[0].accumulation == 2
    assert times[0].comm_s == pytest.approx(times[1].comm_s * 100)
    assert times[0].compute_s == times[1].compute_s


def test_the_search_covers_every_stage_offload_batch_and_checkpointing():
    found = candidates(TrainSetup(), h20_pair(), global_batch=64)
    assert {(s.zero, s.offload) for s in found} == {
        (0, "none"),
        (1, "none"),
        (1, "optimizer"),
        (2, "none"),
        (2, "optimizer"),
        (3, "none"),
        (3, "optimizer"),
        (3, "all"),
    }
    assert {s.micro_batch for s in found} == {1, 2, 4}  # 64 / 16 GPUs = 4 per GPU
    assert {s.grad_ckpt for s in found} == {False, True}


def test_a_global_batch_that_cannot_be_split_is_refused_with_the_fix():
    with pytest.raises(TrainfleetError, match="use --global-batch 64"):
        make_plan(QWEN32B, TrainSetup(micro_batch=4), h20_pair(), global_batch=70)


def test_seed_004_70b_on_four_single_gpu_nodes_needs_offload():
    target = Target(
        nodes=4,
        gpus_per_node=1,
        gpu_memory_bytes=80 * GiB,
        cpu_memory_bytes=None,
        links=Links(peak_flops=312e12, busbw=12.5e9),
    )
    plan = make_plan(LLAMA70B, TrainSetup(zero=3, seq_len=512), target, global_batch=16)
    assert not plan.requested.fits  # 16 B/param / 4 GPUs alone is ~257 GiB
    assert plan.best is not None and plan.best.setup.offload != "none"


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_emitted_configs_pass_deepspeeds_own_config_parser(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.config import DeepSpeedConfig

    for setup in candidates(TrainSetup(lora_rank=0), h20_pair(), global_batch=64)[::3]:
        accumulation = 64 // (setup.micro_batch * 16)
        config = deepspeed_config(setup, hidden_size=5120, accumulation=accumulation, ranks=16)
        # DeepSpeed checks train_batch_size against its world size (1 here): scale to it.
        config["train_batch_size"] = setup.micro_batch * accumulation
        parsed = DeepSpeedConfig(config)
        assert parsed.zero_config.stage == setup.zero
        assert (parsed.zero_config.offload_optimizer is not None) == (setup.offload != "none")
        assert (parsed.zero_config.offload_param is not None) == (setup.offload == "all")
        assert parsed.gradient_accumulation_steps == accumulation
        assert parsed.zero_config.reduce_bucket_size == 5120 * 5120


def test_plan_command_json_has_every_term_and_exit_says_whether_it_fits(tmp_path, capsys):
    model = str(CONFIGS / "deepseek-r1-distill-qwen-32b.json")
    emitted = tmp_path / "ds.json"
    code = main(
        [
            "plan", "--model", model, "--nodes", "2", "--gpus-per-node", "8", "--gpu", "H20",
            "--zero", "3", "--grad-ckpt", "--seq-len", "4096", "--json",
            "--emit-deepspeed", str(emitted),
        ]
    )  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    per_gpu = data["requested"]["per_gpu"]
    for key in (
        "params_bytes",
        "grads_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "logits_bytes",
        "buffers_bytes",
        "total_bytes",
    ):
        assert per_gpu[key] > 0, key
    node = data["requested"]["per_node"]
    # a bf16 checkpoint loaded under zero.Init onto the GPUs: only the 8 ranks' runtime
    assert node["loading_bytes"] == 0 and node["cpu_peak_bytes"] == node["process_bytes"] > 0
    assert code == (0 if data["requested"]["fits"] else 1) and data["requested"]["fits"]
    assert data["model"]["params"] == 32_763_876_352
    best = data["ranked"][0]
    ds = json.loads(emitted.read_text())
    assert ds["zero_optimization"]["stage"] == best["config"]["zero"]
    assert ds["train_micro_batch_size_per_gpu"] == best["config"]["micro_batch"]
    assert ds["train_batch_size"] == data["global_batch"] == 128
    assert "--global-batch 128" in data["defaults_filled_in"]


def test_plan_command_table_and_bad_input(tmp_path, capsys):
    model = str(CONFIGS / "llama-2-70b.json")
    code = main(["plan", "--model", model, "--nodes", "4", "--gpus-per-node", "1", "--gpu", "A100"])
    out = capsys.readouterr().out
    assert code == 1 and "DOES NOT FIT" in out and "DeepSpeed's estimator" in out
    assert "ranked configs" in out and "fastest that fits" in out

    assert main(["plan", "--model", str(tmp_path / "nope")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["plan", "--model", model, "--gpu", "Z9"]) == 1
    assert "not in the planner's table" in capsys.readouterr().err
    for flags, message in (
        (["--headroom", "1.5"], "headroom"),
        (["--mfu", "0"], "mfu"),
        (["--nodes", "0"], "both must be at least 1"),
        (["--global-batch", "12"], "not a multiple of micro batch 1 x 8 GPUs"),
        (["--gpu-memory", "lots"], "cannot read size"),
    ):
        assert main(["plan", "--model", model, *flags]) == 1
        assert message in capsys.readouterr().err
    bad = tmp_path / "commtest.json"
    bad.write_text("{}")
    assert main(["plan", "--model", model, "--commtest", str(bad)]) == 1
    assert "no all_reduce result" in capsys.readouterr().err


def test_plan_reads_busbw_from_a_commtest_report(tmp_path, capsys):
    report = tmp_path / "commtest.json"
    rows = [
        {"op": "all_reduce", "bytes": 1 << 20, "busbw": 1e9},
        {"op": "all_reduce", "bytes": 1 << 30, "busbw": 7.5e9},
    ]
    report.write_text(json.dumps({"results": rows}))
    model = str(CONFIGS / "llama-3.1-8b.json")
    main(["plan", "--model", model, "--nodes", "2", "--commtest", str(report), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["target"]["assumed"]["busbw"] == 7.5e9
    assert data["busbw_source"].startswith("measured by commtest")


def test_plan_takes_nodes_and_gpus_from_the_cluster_spec(capsys):
    model = str(CONFIGS / "llama-3.1-8b.json")
    assert main(["plan", "--model", model, "--hosts", "a:4,b:4,c:4", "--json"]) == 0
    target = json.loads(capsys.readouterr().out)["target"]
    assert (target["nodes"], target["gpus_per_node"]) == (3, 4)
    assert main(["plan", "--model", model, "--hosts", "a:4,b:8"]) == 1
    assert "different slot counts ([4, 8])" in capsys.readouterr().err
