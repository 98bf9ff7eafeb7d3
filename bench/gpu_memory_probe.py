"""One planner config measured on one GPU: the peak memory DeepSpeed really allocates.

Run by bench/gpu_validate.py, one process per config, so each peak is its own:

    python bench/gpu_memory_probe.py --model config.json --zero 2 --seq-len 2048 \
        --micro-batch 1 [--grad-ckpt] [--offload optimizer] [--lora-rank 16] [--steps 3]

The model is built from its config (random weights, bf16, as DeepSpeed's bf16 mode casts it);
ZeRO-3 builds it under zero.Init, as HF Trainer does when a ZeRO-3 config is alive. The DeepSpeed
config is the one `trainfleet plan` writes for this setup (`deepspeed_config`), with the `auto`
hyperparameters filled as HF Trainer would. Each step is a forward and backward of
micro-batch x seq-len random tokens with labels (HF's loss, fp32 logits) and an optimizer step.
The last stdout line is one JSON object: the measured peaks (the whole run's, and each
phase's: init, forward, backward, optimizer step, the largest over the steps) and the planner's
prediction.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from trainfleet.plan.ds_config import deepspeed_config
from trainfleet.plan.memory import TrainSetup, gpu_memory
from trainfleet.plan.model import ModelShape

FILLED = {"lr": 1e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
"""What HF Trainer puts for the `auto` optimizer values (its defaults; lr is the bench's)."""


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a config.json")
    parser.add_argument("--zero", type=int, default=2)
    parser.add_argument("--offload", default="none")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--grad-ckpt", action="store_true")
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--torch-adam", action="store_true", help="torch's AdamW instead of DeepSpeed's FusedAdam"
    )
    return parser.parse_args(argv)


def setup_of(args: argparse.Namespace) -> TrainSetup:
    return TrainSetup(
        zero=args.zero,
        offload=args.offload,
        micro_batch=args.micro_batch,
        seq_len=args.seq_len,
        grad_ckpt=args.grad_ckpt,
        lora_rank=args.lora_rank,
    )


def ds_config_of(setup: TrainSetup, shape: ModelShape, *, torch_adam: bool) -> dict:
    config = deepspeed_config(setup, hidden_size=shape.hidden_size, accumulation=1, ranks=1)
    params = config["optimizer"]["params"]
    params.update({key: FILLED[key] for key, value in params.items() if value == "auto"})
    if torch_adam:
        params["torch_adam"] = True
    return config


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))

    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    shape = ModelShape.from_path(args.model)
    setup = setup_of(args)
    predicted = gpu_memory(shape, setup, ranks=1)
    ds = ds_config_of(setup, shape, torch_adam=args.torch_adam)
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)

    started = time.monotonic()
    keep_alive = HfDeepSpeedConfig(ds) if setup.zero == 3 else None  # zero.Init in from_config
    hf_config = AutoConfig.from_pretrained(Path(args.model).parent)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if setup.lora_rank:
        from peft import LoraConfig, get_peft_model

        from trainfleet.train.config import LoraConfig as TrainLora

        if args.grad_ckpt:
            model.enable_input_require_grads()
        model = get_peft_model(
            model,
            LoraConfig(
                r=setup.lora_rank,
                lora_alpha=2 * setup.lora_rank,
                target_modules=TrainLora().target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable, config=ds)
    del keep_alive
    generator = torch.Generator().manual_seed(0)
    losses = []
    peaks = {"init": _peak_and_reset(on_gpu)}
    phases: dict[str, int] = {}
    for _ in range(args.steps):
        tokens = torch.randint(
            0, shape.vocab_size, (setup.micro_batch, setup.seq_len), generator=generator
        ).to(device)
        loss = engine(input_ids=tokens, labels=tokens).loss
        phases["forward"] = _peak_and_reset(on_gpu)
        engine.backward(loss)
        phases["backward"] = _peak_and_reset(on_gpu)
        engine.step()
        phases["step"] = _peak_and_reset(on_gpu)
        peaks.update({name: max(peaks.get(name, 0), value) for name, value in phases.items()})
        losses.append(round(float(loss), 4))
    if on_gpu:
        torch.cuda.synchronize()
    result = {
        "setup": {
            "zero": setup.zero,
            "offload": setup.offload,
            "seq_len": setup.seq_len,
            "micro_batch": setup.micro_batch,
            "grad_ckpt": setup.grad_ckpt,
            "lora_rank": setup.lora_rank,
            "optimizer": "torch AdamW" if args.torch_adam else "FusedAdam",
        },
        "params": shape.total_params(),
        "predicted": {
            "allocated": predicted.total_bytes - predicted.context_bytes - predicted.margin_bytes,
            "total": predicted.total_bytes,
            "terms": {
                "params": predicted.params_bytes,
                "grads": predicted.grads_bytes,
                "optimizer": predicted.optimizer_bytes,
                "activations": predicted.activations_bytes,
                "logits": predicted.logits_bytes,
                "buffers": predicted.buffers_bytes,
                "step": predicted.step_bytes,
                "margin": predicted.margin_bytes,
                "context": predicted.context_bytes,
            },
        },
        "measured": {
            "allocated": max(peaks.values()) if on_gpu else None,
            "phases": peaks,
            "reserved": torch.cuda.max_memory_reserved() if on_gpu else None,
            "device_used": _device_used_bytes() if on_gpu else None,
        },
        "losses": losses,
        "seconds": round(time.monotonic() - started, 1),
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
    }
    print(json.dumps(result), flush=True)
    return 0


def _peak_and_reset(on_gpu: bool) -> int:
    """The peak allocated since the last reset (or the start), then a new window begins."""
    if not on_gpu:
        return 0
    import torch

    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return peak


def _device_used_bytes() -> int:
    """What the whole process holds on the GPU (context, allocator, NCCL): cudaMemGetInfo."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return total - free


if __name__ == "__main__":
    sys.exit(main())
