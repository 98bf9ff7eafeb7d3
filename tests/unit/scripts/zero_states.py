"""Run under torchrun with DS_ACCELERATOR=cpu: builds small models, puts each through a real
DeepSpeed ZeRO-0/1/2/3 engine (bf16, and fp32 for 2 and 3; AdamW) for one step, and prints,
from rank 0, the bytes the engine holds per rank: its params, fp32 master partition and
optimizer states."""

import json
import os
import sys

import deepspeed
import torch
from transformers import AutoConfig, AutoModelForCausalLM


def held(engine, stage):
    opt = engine.optimizer

    def size(t):
        return t.numel() * t.element_size()

    if stage == 0:
        bit16 = sum(size(t) for t in opt.fp16_groups_flat)
        master = sum(size(t) for t in opt.fp32_groups_flat)
    elif stage == 3:
        bit16 = sum(size(t) for t in opt.fp16_partitioned_groups_flat)
        master = sum(size(t) for t in opt.fp32_partitioned_groups_flat)
    else:
        bit16 = sum(size(t) for t in opt.bit16_groups_flat)
        master = sum(size(t) for t in opt.single_partition_of_fp32_groups)
    states = sum(
        size(v)
        for state in opt.optimizer.state.values()
        for v in state.values()
        if torch.is_tensor(v) and v.dim() > 0
    )
    return [bit16, master, states]


STAGES = [(0, "bf16"), (1, "bf16"), (2, "bf16"), (3, "bf16"), (2, "fp32"), (3, "fp32")]


def main(cases):
    deepspeed.init_distributed("gloo")
    out = {}
    for name, (family, kwargs) in cases.items():
        config = AutoConfig.for_model(family, **kwargs)
        for stage, precision in STAGES:
            ds = {
                "train_micro_batch_size_per_gpu": 1,
                "bf16": {"enabled": precision == "bf16"},
                "zero_optimization": {"stage": stage},
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                "zero_force_ds_cpu_optimizer": False,
            }
            if stage == 3:
                with deepspeed.zero.Init(config_dict_or_path=ds):
                    model = AutoModelForCausalLM.from_config(config)
            else:
                model = AutoModelForCausalLM.from_config(config)
            engine, *_ = deepspeed.initialize(
                model=model, config=ds, model_parameters=model.parameters()
            )
            tokens = torch.randint(0, config.vocab_size, (1, 8))
            engine.backward(engine(input_ids=tokens, labels=tokens).loss)
            engine.step()
            out[f"{name}/{stage}/{precision}"] = held(engine, stage)
            engine.destroy()
    if torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    # Without this, a rank can abort at exit after ZeRO-3 on gloo ("terminate called without
    # an active exception", exit -6), which torchrun reports as a failure.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    sys.stdout.flush()
    os._exit(0)  # see trainfleet.train.worker: no C++ teardown after ZeRO-3 on gloo
