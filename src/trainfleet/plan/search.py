"""Every config the planner can choose between, each estimated, checked against the memory
there is, and ranked: those that fit by step time, each with the reason it wins or loses.

    >>> from trainfleet.plan.model import ModelShape
    >>> from trainfleet.plan.speed import Links
    >>> shape = ModelShape.from_config({"model_type": "llama", "vocab_size": 32000,
    ...     "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    ...     "num_attention_heads": 32})
    >>> target = Target(nodes=2, gpus_per_node=8, gpu_memory_bytes=80 * 2**30,
    ...     cpu_memory_bytes=None, links=Links(peak_flops=989e12, busbw=25e9))
    >>> best = search(shape, TrainSetup(seq_len=4096), target, global_batch=128)[0]
    >>> best.fits, best.reason.startswith("fastest")
    (True, True)

Searched: ZeRO stage 0-3, offload none / optimizer / all (params too, ZeRO-3 only), micro
batch (powers of two that divide the global batch per GPU), gradient checkpointing off / on.
Fixed: sequence length, global batch, precision, LoRA rank. The global batch is the same for
every config, so a shorter step is more tokens per second.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainfleet.errors import TrainfleetError
from trainfleet.plan.memory import (
    CpuMemory,
    GpuMemory,
    TrainSetup,
    cpu_memory_per_node,
    gpu_memory,
)
from trainfleet.plan.model import ModelShape
from trainfleet.plan.speed import Links, StepTime, step_time
from trainfleet.units import gib


@dataclass(kw_only=True, slots=True, frozen=True)
class Target:
    nodes: int
    gpus_per_node: int
    gpu_memory_bytes: int
    cpu_memory_bytes: int | None
    """Per node; None: not checked."""
    links: Links
    headroom: float = 0.0
    """Fraction of each GPU's memory a config must leave free to count as fitting."""

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise TrainfleetError(
                f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s)", "both must be at least 1"
            )
        if not 0 <= self.headroom < 1:
            raise TrainfleetError(f"headroom {self.headroom}", "a fraction: 0 <= headroom < 1")

    @property
    def usable_gpu_bytes(self) -> int:
        return int(self.gpu_memory_bytes * (1 - self.headroom))


@dataclass(kw_only=True, slots=True, frozen=True)
class Candidate:
    setup: TrainSetup
    gpu: GpuMemory
    cpu: CpuMemory
    time: StepTime
    fits: bool
    reason: str = ""

    def label(self) -> str:
        s = self.setup
        offload = "" if s.offload == "none" else f" offload={s.offload}"
        ckpt = " ckpt" if s.grad_ckpt else ""
        return f"zero{s.zero}{offload} mb={s.micro_batch}{ckpt}"


def check_global_batch(setup: TrainSetup, target: Target, global_batch: int) -> None:
    per_step = setup.micro_batch * target.ranks
    if global_batch < per_step or global_batch % per_step:
        raise TrainfleetError(
            f"global batch {global_batch} is not a multiple of micro batch {setup.micro_batch}"
            f" x {target.ranks} GPUs",
            f"use --global-batch {max(1, global_batch // per_step) * per_step} or a micro batch"
            " that divides it",
        )


def evaluate(
    shape: ModelShape, setup: TrainSetup, target: Target, *, global_batch: int
) -> Candidate:
    gpu = gpu_memory(shape, setup, ranks=target.ranks)
    cpu = cpu_memory_per_node(shape, setup, ranks=target.ranks, ranks_per_node=target.gpus_per_node)
    time = step_time(
        shape,
        setup,
        target.links,
        nodes=target.nodes,
        gpus_per_node=target.gpus_per_node,
        global_batch=global_batch,
    )
    fits = gpu.total_bytes <= target.usable_gpu_bytes and (
        target.cpu_memory_bytes is None or cpu.cpu_peak_bytes <= target.cpu_memory_bytes
    )
    return Candidate(setup=setup, gpu=gpu, cpu=cpu, time=time, fits=fits)


def candidates(base: TrainSetup, target: Target, global_batch: int) -> list[TrainSetup]:
    per_gpu = global_batch // target.ranks
    micro_batches = [2**k for k in range(per_gpu.bit_length()) if per_gpu % 2**k == 0]
    found = []
    for zero in (0, 1, 2, 3):
        offloads = ("none",) if zero == 0 else ("none", "optimizer", "all")
        for offload in offloads:
            if offload == "all" and zero != 3:
                continue
            for micro_batch in micro_batches:
                for grad_ckpt in (False, True):
                    found.append(
                        replace(
                            base,
                            zero=zero,
                            offload=offload,
                            micro_batch=micro_batch,
                            grad_ckpt=grad_ckpt,
                        )
                    )
    return found


def search(
    shape: ModelShape, base: TrainSetup, target: Target, *, global_batch: int
) -> list[Candidate]:
    """Fitting configs fastest first, then the rest smallest first; each with its reason."""
    evaluated = [
        evaluate(shape, setup, target, global_batch=global_batch)
        for setup in candidates(base, target, global_batch)
    ]
    fitting = sorted(
        (c for c in evaluated if c.fits), key=lambda c: (c.time.step_s, c.gpu.total_bytes)
    )
    failing = sorted((c for c in evaluated if not c.fits), key=lambda c: c.gpu.total_bytes)
    best = fitting[0] if fitting else None
    return [replace(c, reason=explain(c, best, target)) for c in fitting + failing]


def _limit(candidate: Candidate) -> str:
    t = candidate.time
    parts = {"compute": t.compute_s, "communication": t.comm_s, "offload": t.offload_s}
    name = max(parts, key=parts.__getitem__)
    return f"{name} {parts[name]:.2f} s of a {t.step_s:.2f} s step"


def explain(candidate: Candidate, best: Candidate | None, target: Target) -> str:
    gpu, cpu = candidate.gpu, candidate.cpu
    if not candidate.fits:
        if gpu.total_bytes > target.usable_gpu_bytes:
            terms = {
                "params": gpu.params_bytes,
                "grads": gpu.grads_bytes,
                "optimizer states": gpu.optimizer_bytes,
                "activations": gpu.activations_bytes,
                "logits": gpu.logits_bytes,
                "buffers": gpu.buffers_bytes,
            }
            biggest = max(terms, key=terms.__getitem__)
            headroom = f" ({target.headroom:.0%} kept free)" if target.headroom else ""
            return (
                f"does not fit: {gib(gpu.total_bytes)} per GPU > {gib(target.usable_gpu_bytes)}"
                f"{headroom}; {biggest} {gib(terms[biggest])}"
            )
        return (
            f"does not fit: {gib(cpu.cpu_peak_bytes)} CPU RAM per node"
            f" > {gib(target.cpu_memory_bytes or 0)}"
        )
    spare = gib(target.usable_gpu_bytes - gpu.total_bytes)
    if best is None or candidate.setup == best.setup:
        return f"fastest that fits ({spare} to spare per GPU); {_limit(candidate)}"
    ratio = candidate.time.step_s / best.time.step_s
    return f"{ratio:.2f}x the best's step time; {_limit(candidate)}"
