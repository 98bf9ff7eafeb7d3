"""train's memory check before any rank starts: the planner's figures against the nodes' facts
(recorded fact sheets here; GPUs cannot exist on this machine, so their memory is in the
facts), and the CLI refusing a model that cannot fit on this machine's RAM."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from doctor_fixtures import facts_of

from trainfleet.plan.memory import TrainSetup
from trainfleet.plan.model import ModelShape
from trainfleet.train.preflight import check_fit, fastest_fitting

CONFIGS = Path(__file__).parents[2] / "examples" / "model-configs"
GIB = 2**30


def _facts(mem_available: dict[str, int], gpu_gib: int | None = 96, gpus: int = 8) -> dict:
    device = {"name": "NVIDIA H20", "memory.total": str((gpu_gib or 0) * 1024)}
    devices = [device] * gpus if gpu_gib else []
    return {
        host: facts_of({"memory": {"MemAvailable": available}, "gpus": {"devices": devices}}, host)
        for host, available in mem_available.items()
    }


QWEN = ModelShape.from_path(CONFIGS / "deepseek-r1-distill-qwen-32b.json")
SEED_000 = {"gpu-node-1": 8, "gpu-node-2": 8}  # two servers with eight H20 each


def test_seed_000_fits_with_zero3_and_the_plan_line_says_so():
    fit = check_fit(
        QWEN,
        TrainSetup(zero=3, seq_len=2048, grad_ckpt=True),
        ranks_per_node=SEED_000,
        facts=_facts({"gpu-node-1": 1500 * GIB, "gpu-node-2": 1500 * GIB}),
    )
    assert fit.problems == []
    assert fit.lines[0].startswith("plan: 16 ranks, ZeRO-3, bf16, micro batch 1 x seq_len 2048:")


def test_a_node_short_of_host_ram_is_named_with_need_and_available():
    fit = check_fit(
        QWEN,
        TrainSetup(zero=3, seq_len=2048, grad_ckpt=True, offload="optimizer"),
        ranks_per_node=SEED_000,
        facts=_facts({"gpu-node-1": 1500 * GIB, "gpu-node-2": 100 * GIB}),
    )
    # the optimizer's fp32 master + Adam of 32.8B params over 16 ranks, 8 per node: 244 GiB
    assert len(fit.problems) == 1
    assert fit.problems[0].startswith("gpu-node-2: ")
    assert "100.00 GiB available (ram-insufficient)" in fit.problems[0]


def test_zero0_of_32b_does_not_fit_an_h20_and_the_planner_names_one_that_does():
    setup = TrainSetup(zero=0, seq_len=2048)
    facts = _facts({"gpu-node-1": 1500 * GIB, "gpu-node-2": 1500 * GIB})
    fit = check_fit(QWEN, setup, ranks_per_node=SEED_000, facts=facts)
    assert [p.split(":")[0] for p in fit.problems] == ["gpu-node-1", "gpu-node-2"]
    assert "its GPUs have 96.00 GiB" in fit.problems[0]
    better = fastest_fitting(QWEN, setup, ranks_per_node=SEED_000, facts=facts, global_batch=16)
    assert better is not None and better.startswith("zero: 3")
    zero = int(better.split(",")[0].split(":")[1])
    chosen = TrainSetup(
        zero=zero,
        seq_len=2048,
        offload=better.split("offload: ")[1].split(",")[0],
        micro_batch=int(better.split("micro_batch_size: ")[1].split(",")[0]),
        grad_ckpt=better.endswith("true"),
    )
    assert check_fit(QWEN, chosen, ranks_per_node=SEED_000, facts=facts).problems == []


def test_cpu_nodes_count_the_model_states_in_host_ram():
    shape = ModelShape.from_path(CONFIGS / "llama-3.1-8b.json")
    setup = TrainSetup(zero=3, seq_len=512, precision="fp32")
    facts = _facts({"cpu-1": 64 * GIB, "cpu-2": 64 * GIB}, gpu_gib=None)
    fit = check_fit(shape, setup, ranks_per_node={"cpu-1": 2, "cpu-2": 2}, facts=facts)
    # 8B x 16 bytes (fp32 params, grads, Adam) over 4 ranks, 2 per node: ~60 GiB + runtime
    assert [p.split(":")[0] for p in fit.problems] == ["cpu-1", "cpu-2"]
    assert "for 2 rank(s) (training states " in fit.problems[0]
    assert fastest_fitting(shape, setup, ranks_per_node={"cpu-1": 2, "cpu-2": 2}, facts=facts,
                           global_batch=4) is None  # fmt: skip


def test_a_node_without_facts_is_not_judged():
    fit = check_fit(QWEN, TrainSetup(zero=0), ranks_per_node=SEED_000, facts={})
    assert fit.problems == []


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("transformers", "tokenizers")),
    reason="needs transformers (`make venv` installs it)",
)
def test_train_refuses_a_70b_model_on_this_machine_before_any_rank_starts(tmp_path, capsys):
    from trainfleet.cli.main import main
    from trainfleet.train import demo_assets

    model = tmp_path / "llama-2-70b"
    demo_assets.write_tokenizer(model)  # tokenization needs one; nothing trains
    shutil.copyfile(CONFIGS / "llama-2-70b.json", model / "config.json")
    data = demo_assets.write_dataset(tmp_path / "chats.jsonl", n=20)
    code = main(["train", "--hosts", "localhost:2", "--model", str(model), "--data", str(data),
                 "--output", str(tmp_path / "out"), "--seq-len", "128"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    assert "the plan says this run does not fit, nothing was started" in err
    assert "localhost: " in err and "of host RAM needed for 2 rank(s)" in err
    assert not list((tmp_path / "out").glob("runs/*/logs/*.log"))
