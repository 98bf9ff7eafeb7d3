"""What the planner knows about GPUs by name: memory and dense 16-bit peak FLOP/s (link speeds
are `speed.Links`).

    >>> GPUS["H20"].memory_bytes // 2**30, GPUS["H20"].peak_flops / 1e12
    (96, 148.0)

Peak figures are dense BF16 without sparsity: A100/H100/H200/B200 as torchtitan's
`get_peak_flops` has them, the others from NVIDIA's datasheets. Memory is what the card has;
what a process can allocate is less (CUDA context: see `memory.CONTEXT_BYTES`).
"""

from __future__ import annotations

import os
import re
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


def known_gpu(product: str) -> Gpu | None:
    """The table's GPU whose name is a word of nvidia-smi's product name, if any.

    >>> [getattr(known_gpu(n), "name", None) for n in ("NVIDIA H200", "NVIDIA H20",
    ...  "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla T4")]
    ['H200', 'H20', 'H100', 'A100', None]
    """
    words = {word.lower() for word in re.split(r"[^A-Za-z0-9]+", product)}
    return next((gpu for name, gpu in GPUS.items() if name.lower() in words), None)


@dataclass(kw_only=True, slots=True, frozen=True)
class LocalGpus:
    """The GPUs this machine's processes would use: nvidia-smi's, less CUDA_VISIBLE_DEVICES."""

    count: int
    product: str
    """nvidia-smi's name of the first one, e.g. "NVIDIA H200"."""
    memory_bytes: int


def this_machine() -> LocalGpus | None:
    """This machine's GPUs; None where there is no nvidia-smi, it fails, or it lists none."""
    from trainfleet.node import gpus

    found, _, _ = gpus.query("query-gpu", gpus.BASIC)  # one call: not doctor's health probe
    devices = [
        {"index": int(d["index"]), "name": d["name"], "mib": int(d["memory.total"])}
        for d in found or ()
        if d["index"].isdigit() and d["memory.total"].isdigit()
    ]
    devices = visible(devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not devices:
        return None
    return LocalGpus(
        count=len(devices),
        product=devices[0]["name"],
        memory_bytes=min(d["mib"] for d in devices) * 2**20,
    )


def visible(devices: list[dict], cuda_visible: str | None) -> list[dict]:
    """The devices CUDA_VISIBLE_DEVICES leaves, in its order; CUDA stops at the first entry
    that names no device. UUID and MIG entries are counted, each taken as the first device.

    >>> gpus = [{"index": 0}, {"index": 1}, {"index": 2}]
    >>> [len(visible(gpus, v)) for v in (None, "", "1,2", "2,7,0", "GPU-a46f,GPU-77")]
    [3, 0, 2, 1, 2]
    """
    if cuda_visible is None:
        return devices
    by_index = {device["index"]: device for device in devices}
    chosen = []
    for entry in (e.strip() for e in cuda_visible.split(",") if e.strip()):
        if entry.isdigit():
            if int(entry) not in by_index:
                break
            chosen.append(by_index[int(entry)])
        elif devices:
            chosen.append(devices[0])
    return chosen
