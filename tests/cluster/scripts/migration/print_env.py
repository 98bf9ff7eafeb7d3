"""Prints the variables named on the command line, as this rank sees them."""

import os
import sys

names = [a for a in sys.argv[1:] if not a.startswith("--")]  # DeepSpeed adds --local_rank
said = " ".join(f"{name}={os.environ.get(name)}" for name in names)
print(f"rank {os.environ['RANK']}: {said}", flush=True)
