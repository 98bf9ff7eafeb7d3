"""The per-GPU and per-node sums: each term where the module docstring says it is, offload
moving bytes to the host, the two phases of the peak, LoRA's counts, and agreement with
DeepSpeed's own estimator on the terms both count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainfleet.errors import TrainfleetError
from trainfleet.plan import activations
from trainfleet.plan.estimators import zero2_model_states, zero3_model_states
from trainfleet.plan.memory import (
    CONTEXT_BYTES,
    PROCESS_BYTES,
    TrainSetup,
    cpu_memory_per_node,
    gpu_memory,
    lora_numels,
    model_states,
)
from trainfleet.plan.model import ModelShape

pytestmark = pytest.mark.unit

CONFIGS = Path(__file__).parents[2] / "examples" / "model-configs"
QWEN32B = ModelShape.from_path(CONFIGS / "deepseek-r1-distill-qwen-32b.json")
LLAMA70B = ModelShape.from_path(CONFIGS / "llama-2-70b.json")


def test_example_configs_are_the_published_shapes():
    assert QWEN32B.total_params() == 32_763_876_352
    assert LLAMA70B.total_params() == 68_976_648_192
    for path in CONFIGS.glob("*.json"):
        assert json.loads(path.read_text())["model_type"] in ("llama", "qwen2")


@pytest.mark.parametrize("stage", [2, 3])
def test_model_states_agree_with_deepspeeds_estimator_term_by_term(stage):
    """DeepSpeed's per-param bytes (memory.rst): ZeRO-2 2 + 18/T, ZeRO-3 18/T (+ 4 B of the
    largest layer), where 18 = 2 16-bit params or grads + 4 fp32 grads + 4 fp32 params + 8
    Adam. Ours keep the fp32 gradient copy in the step phase (`step_bytes`), and ZeRO-3's
    gradient partition in 16 bits: swapping those terms must give their figure."""
    ranks = 16
    p = QWEN32B.total_params()
    gpu = gpu_memory(QWEN32B, TrainSetup(zero=stage), ranks=ranks)
    fp32_grads = 4 * p / ranks
    if stage == 2:
        _, theirs = zero2_model_states(p, gpus_per_node=8, nodes=2, offload_optimizer=False)
        ours = gpu.params_bytes + gpu.grads_bytes + gpu.optimizer_bytes + fp32_grads
    else:
        _, theirs = zero3_model_states(
            p,
            QWEN32B.largest_module_params(),
            gpus_per_node=8,
            nodes=2,
            offload_optimizer=False,
            offload_params=False,
            zero_init=True,
        )
        theirs -= 4 * QWEN32B.largest_module_params()  # their gathered layer: in our buffers
        ours = gpu.params_bytes + gpu.optimizer_bytes + fp32_grads
    assert ours == pytest.approx(theirs, rel=1e-5)
    # ZeRO-3 steps one sub group (1e9 elements) at a time; ZeRO-2 the whole partition
    step = fp32_grads if stage == 2 else 4 * 10**9
    assert gpu.step_bytes == pytest.approx(step, rel=1e-5)


def test_offloading_moves_states_to_the_host():
    ranks, per_node = 16, 8
    on_gpu = gpu_memory(QWEN32B, TrainSetup(zero=3), ranks=ranks)
    opt = gpu_memory(QWEN32B, TrainSetup(zero=3, offload="optimizer"), ranks=ranks)
    everything = gpu_memory(QWEN32B, TrainSetup(zero=3, offload="all"), ranks=ranks)
    assert opt.optimizer_bytes == 0 and opt.params_bytes == on_gpu.params_bytes
    assert everything.params_bytes == 0 and everything.total_bytes < opt.total_bytes
    host = cpu_memory_per_node(
        QWEN32B, TrainSetup(zero=3, offload="optimizer"), ranks=ranks, ranks_per_node=per_node
    )
    states = model_states(QWEN32B, TrainSetup(zero=3), ranks=ranks)
    fp32_grads = states.master_bytes  # same partition, 4 bytes per element
    assert host.offload_bytes == per_node * (
        states.master_bytes + states.optimizer_bytes + fp32_grads
    )
    none = cpu_memory_per_node(QWEN32B, TrainSetup(zero=3), ranks=ranks, ranks_per_node=per_node)
    assert none.offload_bytes == 0
    assert none.cpu_peak_bytes == none.loading_bytes + per_node * PROCESS_BYTES


def test_the_peak_is_the_larger_phase_not_the_sum():
    gpu = gpu_memory(QWEN32B, TrainSetup(zero=2, seq_len=8192, micro_batch=4), ranks=16)
    backward = gpu.grads_bytes + gpu.activations_bytes + gpu.logits_bytes + gpu.buffers_bytes
    step = gpu.grads_bytes + gpu.step_bytes
    assert backward > step
    allocated = gpu.params_bytes + gpu.optimizer_bytes + max(backward, step)
    assert gpu.total_bytes == allocated + CONTEXT_BYTES + gpu.margin_bytes
    assert gpu.activations_bytes == activations.activation_bytes(
        QWEN32B, seq_len=8192, micro_batch=4, dtype_bytes=2, grad_ckpt=False
    )


def test_checkpointing_and_zero_init_shrink_what_they_should():
    base = TrainSetup(zero=3, seq_len=4096)
    plain = gpu_memory(QWEN32B, base, ranks=16)
    ckpt = gpu_memory(QWEN32B, TrainSetup(zero=3, seq_len=4096, grad_ckpt=True), ranks=16)
    assert ckpt.activations_bytes < plain.activations_bytes / 4
    # seed 004: Llama-2-70B's checkpoint is float16; trained in bf16, every rank of the node
    # converts a whole copy (measured in test_plan_cpu_memory) unless zero.Init loads it
    host = cpu_memory_per_node(LLAMA70B, base, ranks=16, ranks_per_node=8)
    assert host.loading_without_zero_init_bytes == 8 * LLAMA70B.total_params() * 2
    assert host.loading_bytes == 0  # partitions and gathers on the GPUs
    # a bf16 checkpoint trained in bf16 stays a view of the mmap'd file: page cache only
    same_dtype = cpu_memory_per_node(QWEN32B, base, ranks=16, ranks_per_node=8)
    assert same_dtype.loading_without_zero_init_bytes == 0
    fp16 = cpu_memory_per_node(
        QWEN32B, TrainSetup(zero=3, precision="fp16"), ranks=16, ranks_per_node=8
    )
    assert fp16.loading_without_zero_init_bytes == 8 * QWEN32B.total_params() * 2


def test_lora_trains_adapters_and_keeps_the_base_in_16_bit():
    shape = ModelShape.from_config(
        {
            "model_type": "llama",
            "vocab_size": 100,
            "hidden_size": 16,
            "intermediate_size": 40,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        }
    )
    # q 16->16, k/v 16->8, o 16->16, gate/up 16->40, down 40->16, rank 2, A (r x in) + B (out x r)
    per_layer = 2 * ((16 + 16) + 2 * (16 + 8) + (16 + 16) + 2 * (16 + 40) + (40 + 16))
    assert sum(lora_numels(shape, 2)) == 2 * per_layer
    states = model_states(shape, TrainSetup(zero=2, lora_rank=2), ranks=2)
    base = shape.total_params() * 2
    assert states.params_bytes >= base and states.master_bytes < shape.total_params()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"zero": 4}, "not a ZeRO stage"),
        ({"zero": 2, "offload": "all"}, "needs ZeRO-3"),
        ({"zero": 0, "offload": "optimizer"}, "needs ZeRO 1-3"),
        ({"precision": "int8"}, "precision"),
        ({"micro_batch": 0}, "micro_batch"),
    ],
)
def test_impossible_setups_are_named(fields, message):
    with pytest.raises(TrainfleetError, match=message):
        TrainSetup(**fields)
