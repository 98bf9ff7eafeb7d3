"""A user's Accelerate script, as `accelerate launch accelerate_train.py` runs it."""

import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
loss = model(torch.ones(2, 8)).sum()
accelerator.backward(loss)
optimizer.step()
total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0]), reduction="sum")
print(
    f"process {accelerator.process_index}/{accelerator.num_processes}"
    f" {accelerator.distributed_type.value} sum={total.item()}",
    flush=True,
)
