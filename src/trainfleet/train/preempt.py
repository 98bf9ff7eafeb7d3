"""Stopping a train run for a Slurm job's requeue: the signal the ranks get before the job's
time limit (TRAINFLEET_PREEMPT_SIGNAL, `--requeue`) ends the run at the end of a step that
every rank agrees on, with a complete checkpoint; the requeued job resumes from it.

    >>> flag = Preemption.listen(None)  # not under --requeue: nothing is installed
    >>> flag.signal, flag.got
    (None, False)

The handler only sets a flag: a signal arrives in the middle of a step, and each rank gets it
at its own moment. At every step's end the ranks all-reduce the flag (MAX), so that all of
them stop after the same step; one all_reduce of one number per step, under --requeue only.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Preemption:
    signal: str | None
    got: bool = False
    """This rank got the signal."""
    agreed: bool = False
    """Every rank has stopped training after the same step, for it."""

    @classmethod
    def listen(cls, name: str | None) -> Preemption:
        """The flag, with a handler for SIG`name` (USR1) installed where a name is given."""
        flag = cls(signal=name)
        if name:
            signal.signal(getattr(signal, f"SIG{name}"), flag._heard)
        return flag

    def _heard(self, _signum: int, _frame: Any) -> None:
        self.got = True

    def callback(self) -> Any:
        """A transformers TrainerCallback: after each step, every rank's flag reduced; when one
        rank has it, training stops there (the checkpoint is the caller's)."""
        import torch
        import torch.distributed as dist
        from transformers import TrainerCallback

        flag = self

        class StopForRequeue(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if flag.signal is None:
                    return control
                heard = torch.tensor([1.0 if flag.got else 0.0], device=args.device)
                dist.all_reduce(heard, op=dist.ReduceOp.MAX)
                if heard.item():
                    flag.agreed = True
                    control.should_training_stop = True
                return control

        return StopForRequeue()
