"""What the planner knows about GPUs by name: memory and dense 16-bit peak FLOP/s (link speeds
are `speed.Links`).

    >>> GPUS["H20"].memory_bytes // 2**30, GPUS["H20"].peak_flops / 1e12
    (96, 148.0)

Peak figures are dense BF16 without sparsity: A100/H100/H200/B200 as torchtitan's
`get_peak_flops` has them, the others from NVIDIA's datasheets. Memory is what the card has;
what a process can allocate is less (CUDA context: see `memory.CONTEXT_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfleet.errors import TrainfleetError

GiB = 2**30


@dataclass(kw_only=True, slots=True, frozen=True)
class Gpu:
    name: str
    memory_bytes: int
    peak_flops: float
    """Dense BF16 FLOP/s, no sparsity."""


GPUS = {
    gpu.name: gpu
    for gpu in (
        Gpu(name="A100-40G", memory_bytes=40 * GiB, peak_flops=312e12),
        Gpu(name="A100", memory_bytes=80 * GiB, peak_flops=312e12),
        Gpu(name="A800", memory_bytes=80 * GiB, peak_flops=312e12),
        Gpu(name="H100", memory_bytes=80 * GiB, peak_flops=989e12),
        Gpu(name="H800", memory_bytes=80 * GiB, peak_flops=989e12),
        Gpu(name="H20", memory_bytes=96 * GiB, peak_flops=148e12),
        Gpu(name="H200", memory_bytes=141 * GiB, peak_flops=989e12),
        Gpu(name="B200", memory_bytes=180 * GiB, peak_flops=2250e12),
        Gpu(name="L40S", memory_bytes=48 * GiB, peak_flops=362e12),
        Gpu(name="RTX4090", memory_bytes=24 * GiB, peak_flops=165e12),
    )
}


def gpu_by_name(name: str) -> Gpu:
    for known, gpu in GPUS.items():
        if known.lower() == name.lower():
            return gpu
    raise TrainfleetError(
        f"GPU {name!r} is not in the planner's table",
        f"use one of {', '.join(GPUS)}, or give --gpu-memory and --gpu-tflops",
    )
