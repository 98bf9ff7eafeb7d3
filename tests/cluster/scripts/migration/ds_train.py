"""A user's DeepSpeed script, as `deepspeed --hostfile hostfile ds_train.py --deepspeed
--deepspeed_config ds.json` runs it: --local_rank from the launcher, the config from
--deepspeed_config, deepspeed.initialize."""

import argparse

import deepspeed
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--steps", type=int, default=3)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
for step in range(args.steps):
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(rank * 100 + step))
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()
stage = engine.zero_optimization_stage()
print(
    f"rank {rank}/{world} local_rank {args.local_rank} zero stage {stage}"
    f" steps {engine.global_steps}",
    flush=True,
)
