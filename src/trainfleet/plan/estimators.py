"""DeepSpeed's and Accelerate's own estimators, reproduced to print beside trainfleet's figures.

    >>> cpu, gpu = zero3_model_states(2_851_598_336, 32_899_072, gpus_per_node=8, nodes=1,
    ...     offload_optimizer=False, offload_params=False, zero_init=True)
    >>> round(gpu / 2**30, 2)  # t5-3b, memory.rst
    6.1

Exactly what `estimate_zero2_model_states_mem_needs` (stage_1_and_2.py) and
`estimate_zero3_model_states_mem_needs` (stage3.py) compute (DeepSpeed >= 0.14.3, after PR #5099),
returned as (cpu_bytes_per_node, gpu_bytes_per_gpu); a unit test compares them with DeepSpeed's
functions. They count params, gradients and optimizer states only: no activations, logits,
buffers, CUDA context or fragmentation, and their ZeRO-2 offload CPU term uses the total GPU
count where the docs say per node.

Accelerate's `accelerate estimate-memory` "Training using Adam" column
(`estimate_training_usage` in accelerate/commands/estimate.py): the largest of its model,
gradients, optimizer and step figures for the whole unsharded model, from the fp32 size:
16 bytes per param in fp32, 8 in fp16/bf16. No sharding, batch, activations or CPU.

    >>> accelerate_training_bytes(1_000_000, "bf16")
    8000000
"""

from __future__ import annotations

BUFFER_FACTOR = 1.5
"""DeepSpeed's `additional_buffer_factor` default."""


def zero2_model_states(
    params: int, *, gpus_per_node: int, nodes: int, offload_optimizer: bool
) -> tuple[float, float]:
    total_gpus = gpus_per_node * nodes
    if offload_optimizer:
        gpu = 2 * params
        cpu = params * max(4 * total_gpus, 16) * BUFFER_FACTOR
    else:
        gpu = 2 * params + int(18 * params / total_gpus)
        cpu = params * 4 * gpus_per_node * BUFFER_FACTOR
    return cpu, gpu


def zero3_model_states(
    params: int,
    largest_layer: int,
    *,
    gpus_per_node: int,
    nodes: int,
    offload_optimizer: bool,
    offload_params: bool,
    zero_init: bool,
) -> tuple[int, int]:
    total_gpus = gpus_per_node * nodes
    gpus_factor = 1 / nodes
    largest_layer_memory = 4 * largest_layer
    if offload_optimizer:
        if offload_params:
            gpu = largest_layer_memory
            per_param = 18 * gpus_factor
        else:
            gpu = largest_layer_memory + int(2 * params / total_gpus)
            per_param = 16 * gpus_factor
        cpu = params * (per_param if zero_init else max(4 * gpus_per_node, per_param))
        cpu *= BUFFER_FACTOR
    else:
        gpu = largest_layer_memory + int(18 * params / total_gpus)
        cpu = (largest_layer if zero_init else params) * 4 * gpus_per_node * BUFFER_FACTOR
    return int(cpu), int(gpu)  # as DeepSpeed rounds them


def accelerate_training_bytes(params: int, precision: str) -> int:
    """Accelerate's "Training using Adam" for a model of `params` parameters, any GPU count."""
    fp32 = 4 * params
    if precision == "fp32":
        sizes = (fp32, fp32, 2 * fp32, 4 * fp32)  # model, gradients, optimizer, step
    else:
        sizes = (fp32, fp32 + fp32 // 2, 2 * fp32, 2 * fp32)
    return max(sizes)
