"""What the user asked to run, checked before anything starts: a command that starts its own
launcher under trainfleet's (torchrun, DeepSpeed's runner, `accelerate launch`, LLaMA-Factory's
and axolotl's CLIs) would start N x N ranks or fight over the rendezvous port, so it is refused
with the command that does what the user meant.

    >>> entry_command(("python3", "train.py", "--lr", "1e-4"), {})[0]
    ('train.py', '--lr', '1e-4')
    >>> try:
    ...     entry_command(("torchrun", "--nproc_per_node=8", "train.py", "--lr", "1e-4"), {})
    ... except NestedLauncher as refused:
    ...     print(refused.instead)
    ('train.py', '--lr', '1e-4')

Any other first word runs on every rank as it is (the rank shim decides on the node whether it
is Python or an executable; see shim.py).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

from trainfleet.catalog import FindingId
from trainfleet.errors import TrainfleetError

PYTHONS = ("python", "python3")
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
TRL_TRAINING = ("sft", "dpo", "grpo", "kto", "reward", "rloo", "distillation")
"""TRL CLI commands that start their script through `accelerate launch` (trl/cli)."""
FLAG_MAP = (
    "their flags map to trainfleet's: --nnodes/--num_nodes and --nproc_per_node/--num_gpus "
    "come from the hostfile or cluster.yaml (or --num_nodes/--num_gpus), --master_addr and "
    "--master_port are trainfleet launch flags, --include/--exclude are -i/-e"
)


class NestedLauncher(TrainfleetError):
    """A launcher inside the command: refused before anything starts."""

    def __init__(self, launcher: str, instead: tuple[str, ...], why: str = "") -> None:
        suggestion = "trainfleet launch [cluster options] -- " + shlex.join(instead)
        super().__init__(
            f"{launcher} starts its own ranks{why}, and trainfleet already starts one rank "
            "per slot on every node: each rank would start a whole job "
            f"({FindingId.NESTED_LAUNCHER})",
            f"run `{suggestion}` ({FLAG_MAP})",
        )
        self.instead = instead


def _is_python(word: str) -> bool:
    name = os.path.basename(word)
    return name in PYTHONS or (name.startswith("python3.") and name[8:].isdigit())


def _script_and_args(words: tuple[str, ...]) -> tuple[str, ...]:
    """The user's script and its arguments inside a launcher's command line: from the first
    word ending in .py, or from `-m`/`--module MODULE`; the launcher's own flags before it are
    dropped."""
    for i, word in enumerate(words):
        if word in ("-m", "--module") and i + 1 < len(words):
            return ("-m", *words[i + 1 :])
        if word.endswith(".py") and not word.startswith("-"):
            return words[i:]
    return ("SCRIPT.py", "ARGS")


def entry_command(
    command: tuple[str, ...], launch_env: Mapping[str, str]
) -> tuple[tuple[str, ...], str | None]:
    """The command every rank runs, and a note when it was changed. Raises NestedLauncher for
    a command that starts its own launcher."""
    if not command:
        raise TrainfleetError("no command given", "trainfleet launch [options] -- train.py [ARGS]")
    note = None
    if _is_python(command[0]) and len(command) > 1:
        # `python train.py` / `python -m pkg`: the node's python (cluster.yaml `python:`)
        # runs it, through the rank shim.
        note = f"running {command[1]} with each node's python (drop `{command[0]}`)"
        if command[1] == "-m" and len(command) > 2 and command[2] in TORCHRUN_MODULES:
            raise NestedLauncher(f"python -m {command[2]}", _script_and_args(command[3:]))
        command = command[1:]
    first = os.path.basename(command[0])
    rest = command[1:]
    if first == "-m" and rest and rest[0] in TORCHRUN_MODULES:
        raise NestedLauncher(f"-m {rest[0]}", _script_and_args(rest[1:]))
    if first == "torchrun":
        raise NestedLauncher("torchrun", _script_and_args(rest))
    if first == "deepspeed":
        raise NestedLauncher("DeepSpeed's runner (`deepspeed`)", _script_and_args(rest))
    if first == "accelerate" and rest[:1] == ("launch",):
        raise NestedLauncher("`accelerate launch`", _script_and_args(rest[1:]))
    if first in ("llamafactory-cli", "lmf") and rest[:1] == ("train",):
        # LLaMA-Factory's cli (launcher.py) starts torchrun on launcher.py itself when
        # FORCE_TORCHRUN is set or it sees more than one GPU; launcher.py run as a module
        # is the training function alone.
        forced = launch_env.get("FORCE_TORCHRUN", "").lower() in ("1", "true", "y")
        why = " (FORCE_TORCHRUN is set)" if forced else " on a node with more than one GPU"
        raise NestedLauncher("llamafactory-cli train", ("-m", "llamafactory.launcher", *rest[1:]),
                             why)  # fmt: skip
    if first == "trl" and rest[:1] and rest[0] in TRL_TRAINING:
        # `trl sft ...` runs trl/scripts/sft.py through accelerate's launch_command.
        raise NestedLauncher(f"trl {rest[0]} (accelerate launch inside)",
                             ("-m", f"trl.scripts.{rest[0]}", *rest[1:]))  # fmt: skip
    if first == "axolotl" and rest[:1] == ("train",):
        # axolotl's CLI runs `accelerate launch -m axolotl.cli.train` (or torchrun) itself.
        raise NestedLauncher("axolotl train", ("-m", "axolotl.cli.train", *rest[1:]))
    return command, note
