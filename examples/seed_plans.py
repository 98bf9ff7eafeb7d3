"""Print docs/plan.md's table: trainfleet plan against DeepSpeed's estimator for the seeds' cases.

.venv/bin/python examples/seed_plans.py
"""

from pathlib import Path

from trainfleet.plan import TrainSetup, make_plan
from trainfleet.plan.hardware import GPUS
from trainfleet.plan.model import ModelShape
from trainfleet.plan.search import Target
from trainfleet.plan.speed import Links

CONFIGS = Path(__file__).parent / "model-configs"
GiB = 2**30
# title, config, nodes, GPUs per node, GPU, seq len, micro batch, global batch
CASES = [
    ("Llama-2-70B, 4 nodes x 1 A100-80G", "llama-2-70b", 4, 1, "A100", 512, 4, 16),
    ("Llama-2-70B, 8 nodes x 1 A100-80G", "llama-2-70b", 8, 1, "A100", 512, 4, 32),
    ("Llama-2-70B, 1 node x 4 A100-80G", "llama-2-70b", 1, 4, "A100", 512, 4, 16),
    ("R1-Distill-Qwen-32B, 2 nodes x 8 H20-96G", "deepseek-r1-distill-qwen-32b", 2, 8, "H20",
     4096, 1, 128),
]  # fmt: skip


def main() -> None:
    print(
        "| case | ZeRO-3 offload | trainfleet GPU peak | DeepSpeed GPU |"
        " trainfleet CPU/node (loading w/o zero.Init) | DeepSpeed CPU/node |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for title, config, nodes, per_node, gpu, seq_len, micro_batch, global_batch in CASES:
        shape = ModelShape.from_path(CONFIGS / f"{config}.json")
        target = Target(
            nodes=nodes,
            gpus_per_node=per_node,
            gpu_memory_bytes=GPUS[gpu].memory_bytes,
            cpu_memory_bytes=None,
            links=Links(peak_flops=GPUS[gpu].peak_flops, busbw=12.5e9),
        )
        for offload in ("none", "optimizer", "all"):
            setup = TrainSetup(
                zero=3, offload=offload, seq_len=seq_len, micro_batch=micro_batch, grad_ckpt=True
            )
            plan = make_plan(shape, setup, target, global_batch=global_batch)
            ours, (ds_cpu, ds_gpu) = plan.requested, plan.deepspeed_estimate
            fits = "" if ours.fits else " (no fit)"
            unsafe_load = ours.cpu.loading_without_zero_init_bytes / GiB
            print(
                f"| {title} | {offload} | {ours.gpu.total_bytes / GiB:.2f} GiB{fits}"
                f" | {ds_gpu / GiB:.2f} GiB | {ours.cpu.cpu_peak_bytes / GiB:.2f} GiB"
                f" ({unsafe_load:.0f}) | {ds_cpu / GiB:.2f} GiB |"
            )


if __name__ == "__main__":
    main()
