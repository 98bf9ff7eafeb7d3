"""The plan as a table for people and as JSON (the same data).

>>> print(render(plan))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from trainfleet.plan import Plan
from trainfleet.plan.search import Candidate
from trainfleet.plan.speed import compute_params
from trainfleet.units import gib

GPU_TERMS = (
    ("params_bytes", "params"),
    ("grads_bytes", "gradients"),
    ("optimizer_bytes", "optimizer (fp32 master + Adam)"),
    ("activations_bytes", "activations"),
    ("logits_bytes", "logits + loss"),
    ("buffers_bytes", "communication buffers"),
    ("step_bytes", "optimizer-step temporaries"),
    ("context_bytes", "CUDA context + NCCL (stated)"),
    ("margin_bytes", "fragmentation margin (stated)"),
)
SHOWN = 12


def _config_line(plan: Plan, candidate: Candidate) -> str:
    s = candidate.setup
    lora = f", LoRA rank {s.lora_rank}" if s.lora_rank else ""
    return (
        f"{candidate.label()}, seq {s.seq_len}, global batch {plan.global_batch}"
        f" (accumulation {candidate.time.accumulation}), {s.precision}{lora}"
    )


def render(plan: Plan, *, disk_bytes: int | None = None) -> str:
    shape, target, req = plan.shape, plan.target, plan.requested
    links = target.links
    disk = f"; {gib(disk_bytes)} on disk" if disk_bytes else ""
    cpu_memory = f", {gib(target.cpu_memory_bytes)} RAM per node" if target.cpu_memory_bytes else ""
    lines = [
        f"model    {shape.source}: {shape.family}, {shape.total_params():,} params"
        f" (largest module {shape.largest_module_params():,}){disk}",
        f"cluster  {target.nodes} node(s) x {target.gpus_per_node} GPU(s) of"
        f" {gib(target.gpu_memory_bytes)} ({target.headroom:.0%} kept free),"
        f" {links.peak_flops / 1e12:.0f} TFLOP/s bf16{cpu_memory}",
        f"config   {_config_line(plan, req)}",
        "",
        f"{'per GPU':<34} {'trainfleet':>12}",
    ]
    gpu = asdict(req.gpu)
    lines += [f"  {label:<32} {gib(gpu[key]):>12}" for key, label in GPU_TERMS]
    estimate = plan.deepspeed_estimate
    ds_gpu = f"   DeepSpeed's estimator: {gib(estimate[1])}" if estimate else ""
    lines.append(f"  {'peak':<32} {gib(req.gpu.total_bytes):>12}{ds_gpu}")
    lines.append(f"  {'':<32} {'':>12}   Accelerate's (unsharded): {gib(plan.accelerate_estimate)}")
    zero_init = "with zero.Init" if req.setup.zero == 3 else "no zero.Init (ZeRO < 3)"
    lines += [
        "",
        "per node, CPU RAM",
        f"  {'loading, ' + zero_init:<32} {gib(req.cpu.loading_bytes):>12}",
        f"  {'loading, no zero.Init':<32} {gib(req.cpu.loading_without_zero_init_bytes):>12}",
        f"  {'offloaded states (pinned)':<32} {gib(req.cpu.offload_bytes):>12}",
        f"  {'ranks runtime (stated)':<32} {gib(req.cpu.process_bytes):>12}",
    ]
    ds_cpu = f"   DeepSpeed's estimator: {gib(estimate[0])}" if estimate else ""
    lines.append(f"  {'peak':<32} {gib(req.cpu.cpu_peak_bytes):>12}{ds_cpu}")
    if estimate:
        lines.append("  (DeepSpeed's estimator counts params, gradients and optimizer states only)")
    t = req.time
    lines += [
        "",
        f"step     compute {t.compute_s:.2f} s, communication {t.comm_s:.2f} s, offload"
        f" {t.offload_s:.2f} s -> {t.step_s:.2f} s per step, {t.tokens_per_s:,.0f} tokens/s"
        f" (assumed: MFU {links.mfu:.2f}, busbw {links.busbw / 1e9:.1f} GB/s,"
        f" PCIe {links.pcie / 1e9:.0f} GB/s)",
        f"verdict  {'FITS' if req.fits else 'DOES NOT FIT'}: {req.reason}",
        "",
        f"ranked configs ({sum(c.fits for c in plan.ranked)} of {len(plan.ranked)} fit;"
        f" {min(SHOWN, len(plan.ranked))} shown, --json has all)",
        f"  {'#':>2} {'config':<36} {'GPU peak':>11} {'CPU/node':>11} {'step':>8}"
        f" {'tokens/s':>10}  why",
    ]
    for i, c in enumerate(plan.ranked[:SHOWN], 1):
        lines.append(
            f"  {i:>2} {c.label():<36} {gib(c.gpu.total_bytes):>11} {gib(c.cpu.cpu_peak_bytes):>11}"
            f" {c.time.step_s:>7.2f}s {c.time.tokens_per_s:>10,.0f}  {c.reason}"
        )
    return "\n".join(lines)


def candidate_json(candidate: Candidate) -> dict[str, Any]:
    return {
        "config": asdict(candidate.setup),
        "fits": candidate.fits,
        "reason": candidate.reason,
        "per_gpu": asdict(candidate.gpu),
        "per_node": asdict(candidate.cpu),
        "step": asdict(candidate.time),
    }


def to_json(plan: Plan, *, disk_bytes: int | None = None) -> dict[str, Any]:
    shape, estimate = plan.shape, plan.deepspeed_estimate
    return {
        "model": {
            "source": shape.source,
            "family": shape.family,
            "params": shape.total_params(),
            "largest_module_params": shape.largest_module_params(),
            "compute_params": compute_params(shape),
            "disk_bytes": disk_bytes,
        },
        "target": {
            "nodes": plan.target.nodes,
            "gpus_per_node": plan.target.gpus_per_node,
            "gpu_memory_bytes": plan.target.gpu_memory_bytes,
            "headroom": plan.target.headroom,
            "cpu_memory_bytes": plan.target.cpu_memory_bytes,
            "assumed": asdict(plan.target.links),
        },
        "global_batch": plan.global_batch,
        "requested": candidate_json(plan.requested),
        "deepspeed_estimate": (
            {"cpu_bytes_per_node": estimate[0], "gpu_bytes_per_gpu": estimate[1]}
            if estimate
            else None
        ),
        "accelerate_estimate_bytes": plan.accelerate_estimate,
        "ranked": [candidate_json(c) for c in plan.ranked],
    }
