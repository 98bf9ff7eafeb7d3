"""Before any rank starts: does this run fit? The planner's peak per GPU and host RAM per node,
for this model, config and placement, against what each node has (the quick doctor's facts).

    >>> from trainfleet.plan.memory import TrainSetup
    >>> from trainfleet.plan.model import ModelShape
    >>> shape = ModelShape.from_config({"model_type": "llama", "vocab_size": 32000,
    ...     "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    ...     "num_attention_heads": 32, "torch_dtype": "bfloat16"})
    >>> from trainfleet.doctor.facts import Gpu, Gpus, Memory, NodeFacts
    >>> facts = {"a": NodeFacts(memory=Memory(available=64 << 30),
    ...                         gpus=Gpus(devices=(Gpu(memory_mib=81920),) * 8))}
    >>> fit = check_fit(shape, TrainSetup(zero=3), ranks_per_node={"a": 8}, facts=facts)
    >>> fit.problems
    []
    >>> print(fit.lines[0])
    plan: 8 ranks, ZeRO-3, bf16, micro batch 1 x seq_len 4096: 40.86 GiB per GPU

On GPU nodes: the plan's peak per GPU against the smallest GPU of the node, and the node's host
RAM (loading, offloaded states, the ranks' runtime) against MemAvailable: seed 004's host
OOM (`ram-insufficient`). On CPU nodes (gloo), the "GPU" states are in host RAM as well, so
both count against MemAvailable. When it does not fit, the planner's fastest config that does
is in the fix. A node whose facts say nothing (an old probe, no /proc/meminfo) is not judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainfleet.catalog import FindingId
from trainfleet.doctor.facts import Gpu, NodeFacts
from trainfleet.errors import TrainfleetError
from trainfleet.plan.memory import CONTEXT_BYTES, TrainSetup, cpu_memory_per_node, gpu_memory
from trainfleet.plan.model import ModelShape
from trainfleet.units import gib

MIB = 2**20


@dataclass(kw_only=True, slots=True)
class Fit:
    lines: list[str] = field(default_factory=list)
    """What the plan says, for the job's output."""
    problems: list[str] = field(default_factory=list)
    """One line per node that does not fit, naming the node, the need and what it has."""


class WontFit(TrainfleetError):
    """The plan says the run does not fit; nothing was started."""


def check_fit(
    shape: ModelShape,
    setup: TrainSetup,
    *,
    ranks_per_node: dict[str, int],
    facts: Mapping[str, NodeFacts],
) -> Fit:
    ranks = sum(ranks_per_node.values())
    gpu = gpu_memory(shape, setup, ranks=ranks)
    fit = Fit()
    on_gpus = any(_devices(facts.get(host)) for host in ranks_per_node)
    fit.lines.append(
        f"plan: {ranks} ranks, ZeRO-{setup.zero}, {setup.precision}, micro batch"
        f" {setup.micro_batch} x seq_len {setup.seq_len}: {gib(gpu.total_bytes)} per"
        + (" GPU" if on_gpus or not facts else " rank (in host RAM: no GPUs)")
    )
    for host, local in ranks_per_node.items():
        sheet = facts.get(host) or NodeFacts()
        devices = _devices(sheet)
        host_ram = cpu_memory_per_node(shape, setup, ranks=ranks, ranks_per_node=local)
        need, parts = host_ram.cpu_peak_bytes, ""
        if devices:
            smallest = min(d.memory_mib or 0 for d in devices) * MIB
            if smallest and gpu.total_bytes > smallest:
                fit.problems.append(
                    f"{host}: {gib(gpu.total_bytes)} per GPU needed, its GPUs have {gib(smallest)}"
                )
        else:  # gloo on CPUs: what a GPU would hold is in host RAM, without a CUDA context
            on_cpu = local * (gpu.total_bytes - CONTEXT_BYTES)
            need += on_cpu
            parts = f"training states {gib(on_cpu)}, "
        available = sheet.memory.available
        if available and need > available:
            fit.problems.append(
                f"{host}: {gib(need)} of host RAM needed for {local} rank(s) ({parts}loading"
                f" {gib(host_ram.loading_bytes)}, offloaded states"
                f" {gib(host_ram.offload_bytes)}), {gib(available)} available"
                f" ({FindingId.RAM_INSUFFICIENT})"
            )
    return fit


def fastest_fitting(
    shape: ModelShape, setup: TrainSetup, *, ranks_per_node: dict[str, int],
    facts: Mapping[str, NodeFacts], global_batch: int,
) -> str | None:  # fmt: skip
    """On GPU nodes: the planner's fastest config that fits the smallest GPU and the smallest
    host, as train.yaml settings; None on CPU nodes or when none fits."""
    from trainfleet.plan.search import Target, search
    from trainfleet.plan.speed import Links
    from trainfleet.train.metrics import peak_flops_of

    sheets = [facts.get(host) or NodeFacts() for host in ranks_per_node]
    devices = [d for s in sheets for d in _devices(s)]
    per_node = set(ranks_per_node.values())
    if len(per_node) != 1 or not all(_devices(s) for s in sheets):
        return None
    available = [memory for s in sheets if (memory := s.memory.available)]
    target = Target(
        nodes=len(ranks_per_node),
        gpus_per_node=per_node.pop(),
        gpu_memory_bytes=min(d.memory_mib or 0 for d in devices) * MIB,
        cpu_memory_bytes=min(available) if len(available) == len(sheets) else None,
        links=Links(peak_flops=peak_flops_of(devices[0].name or "") or 1e15, busbw=12.5e9),
    )
    ranked = search(shape, setup, target, global_batch=global_batch)
    if not ranked or not ranked[0].fits:
        return None
    best = ranked[0].setup
    return (
        f"zero: {best.zero}, offload: {best.offload}, micro_batch_size: {best.micro_batch},"
        f" gradient_accumulation_steps: {global_batch // (best.micro_batch * target.ranks)},"
        f" grad_ckpt: {str(best.grad_ckpt).lower()}"
    )


def what_would_fit(
    shape: ModelShape, setup: TrainSetup, *, ranks_per_node: dict[str, int],
    facts: Mapping[str, NodeFacts], global_batch: int, model: str,
) -> str:  # fmt: skip
    """The fix for a run that does not fit: the planner's fastest config that does (GPU
    nodes), else the settings that would lower the need and are not in use yet."""
    better = fastest_fitting(
        shape, setup, ranks_per_node=ranks_per_node, facts=facts, global_batch=global_batch
    )
    if better:
        return f"the planner's fastest config that fits: {better}"
    options = [
        *(["ZeRO-3"] if setup.zero < 3 else []),
        *(["offload (--offload optimizer or all)"] if setup.offload != "all" else []),
        *(["gradient checkpointing"] if not setup.grad_ckpt else []),
        *(["a smaller micro batch"] if setup.micro_batch > 1 else []),
        "fewer ranks per node, or more nodes",
    ]
    return f"{', '.join(options)}; `trainfleet plan --model {model}` compares them"


def _devices(sheet: NodeFacts | None) -> tuple[Gpu, ...]:
    """The GPUs on a fact sheet (probe's nvidia-smi query); () without GPUs or facts."""
    return sheet.gpus.devices if sheet and sheet.gpus else ()
