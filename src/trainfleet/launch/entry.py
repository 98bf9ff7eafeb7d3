"""What the user asked to run, checked before anything starts. A training CLI that starts its
own launcher (LLaMA-Factory's `llamafactory-cli train`, axolotl's `axolotl train`, TRL's
`trl sft`...) runs, on every rank, the module its launcher would have started, with the same
arguments, and a note says so. A launcher whose flags carry the layout (torchrun, DeepSpeed's
runner, `accelerate launch`) would start N x N ranks or fight over the rendezvous port, so it
is refused with the command that does what the user meant; so is a training CLI given options
that only its launcher reads.

    >>> entry_command(("python3", "train.py", "--lr", "1e-4"), {})[0]
    ('train.py', '--lr', '1e-4')
    >>> entry_command(("axolotl", "train", "cfg.yml"), {})[0]
    ('-m', 'axolotl.cli.train', 'cfg.yml')
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
"""TRL CLI commands that run trl/scripts/<name>.py through `accelerate launch` (trl/cli)."""
TRL_LAUNCHER_OPTIONS = (
    "--accelerate_config", "--config_file", "--num_processes", "--num_machines",
    "--machine_rank", "--main_process_ip", "--main_process_port", "--multi_gpu",
    "--use_deepspeed", "--use_fsdp", "--zero_stage", "--mixed_precision", "--gpu_ids",
)  # fmt: skip
"""`trl sft` options that go to `accelerate launch`, not to the script (layout, engine or
precision): a rank started without accelerate would drop them."""
SWITCHES = ("--multi_gpu", "--use_deepspeed", "--use_fsdp")
"""Launcher options above that take no value."""
AXOLOTL_LAUNCHER_OPTIONS = ("--cloud", "--sweep", "--num_processes", "--main_process_port", "--")
"""`axolotl train` options its CLI reads itself (cloud runs, sweeps, accelerate's layout, and
accelerate's arguments after `--`): `axolotl.cli.train` alone would not see them."""
FLAG_MAP = (
    "their flags map to trainfleet's: --nnodes/--num_nodes and --nproc_per_node/--num_gpus "
    "come from the hostfile or cluster.yaml (or --num_nodes/--num_gpus), --master_addr and "
    "--master_port are trainfleet launch flags, --include/--exclude are -i/-e"
)


class NestedLauncher(TrainfleetError):
    """A launcher inside the command: refused before anything starts. `what` replaces the
    launcher's line (for a training CLI given its launcher's options)."""

    def __init__(
        self, launcher: str, instead: tuple[str, ...], what: str = "", more: str = ""
    ) -> None:
        suggestion = "trainfleet launch [cluster options] -- " + shlex.join(instead)
        what = what or (
            f"{launcher} starts its own ranks, and trainfleet already starts one rank per slot "
            "on every node: each rank would start a whole job"
        )
        super().__init__(
            f"{what} ({FindingId.NESTED_LAUNCHER})", f"run `{suggestion}` ({FLAG_MAP}){more}"
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


def _spelled(option: str) -> tuple[str, str]:
    """An option as `--a_b` and as `--a-b` (click, argparse and HfArgumentParser take both)."""
    return option, option.replace("_", "-")


def _options_in(words: tuple[str, ...], options: tuple[str, ...]) -> list[str]:
    """Which of `options` `words` give, as `--opt`, `--opt=value` or `--opt-with-dashes`."""
    found = []
    for option in options:
        spellings = _spelled(option) if option != "--" else ("--",)
        if any(w in spellings or w.split("=", 1)[0] in spellings for w in words):
            found.append(option)
    return found


def _without_options(words: tuple[str, ...], options: list[str]) -> tuple[str, ...]:
    """`words` less `options` and their values (and everything after a `--` when `options`
    holds it); a value is the next word unless that starts with `-` or the option is a
    switch."""
    spellings = {s for option in options for s in _spelled(option)}
    switches = {s for option in SWITCHES for s in _spelled(option)}
    kept: list[str] = []
    words_left = iter(words)
    for word in words_left:
        if word == "--" and "--" in options:
            break
        name = word.split("=", 1)[0]
        if name not in spellings:
            kept.append(word)
        elif "=" not in word and name not in switches:
            value = next(words_left, None)
            if value is not None and value.startswith("-"):
                kept.append(value)  # not its value: the next option
    return tuple(kept)


def _cli_entry(
    cli: str,
    launcher: str,
    module: str,
    args: tuple[str, ...],
    *,
    refused: list[str],
    dropped: str = "",
) -> tuple[tuple[str, ...], str]:
    """The module a training CLI's launcher starts, with the user's arguments, and the note;
    NestedLauncher where `refused` (options only the CLI's launcher reads) were given."""
    command = ("-m", module, *args)
    if refused:
        instead = ("-m", module, *_without_options(args, refused))
        named = ", ".join("what follows `--`" if o == "--" else o for o in refused)
        raise NestedLauncher(
            cli,
            instead,
            f"{named} {'is' if len(refused) == 1 else 'are'} for `{cli}` itself or "
            f"the {launcher} it starts, not for {module}: the ranks would run without "
            f"{'it' if len(refused) == 1 else 'them'}",
            f"; what {'it sets' if len(refused) == 1 else 'they set'} that is not the layout "
            "goes in the module's own arguments or config (DeepSpeed's: --deepspeed ds.json, or "
            "the YAML's `deepspeed:`), a sweep is one launch per config",
        )
    note = (
        f"running `{shlex.join(command)}` on every rank: what `{cli}` has {launcher} start "
        f"on each rank, with all your arguments{dropped}"
    )
    return command, note


def _enabled(launch_env: Mapping[str, str], name: str) -> bool:
    """LLaMA-Factory's is_env_enabled."""
    return launch_env.get(name, "0").lower() in ("true", "y", "1")


def entry_command(
    command: tuple[str, ...], launch_env: Mapping[str, str]
) -> tuple[tuple[str, ...], str | None]:
    """The command every rank runs, and a note when it was changed. Raises NestedLauncher for
    a command whose launcher cannot be replaced without dropping what it was given."""
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
        # LLaMA-Factory's launcher.launch() has torchrun start launcher.py itself with the
        # arguments after `train` (USE_V1: v1/launcher.py with `train` kept); run as a module,
        # launcher.py is the training alone.
        if _enabled(launch_env, "USE_V1"):
            return _cli_entry(f"{first} train", "torchrun", "llamafactory.v1.launcher", rest,
                              refused=[])  # fmt: skip
        return _cli_entry(f"{first} train", "torchrun", "llamafactory.launcher", rest[1:],
                          refused=[])  # fmt: skip
    if first == "trl" and rest[:1] and rest[0] in TRL_TRAINING:
        # `trl sft ...` runs trl/scripts/sft.py through accelerate's launch_command.
        args = rest[1:]
        return _cli_entry(f"trl {rest[0]}", "`accelerate launch`", f"trl.scripts.{rest[0]}",
                          args, refused=_options_in(args, TRL_LAUNCHER_OPTIONS))  # fmt: skip
    if first == "axolotl" and rest[:1] == ("train",):
        # axolotl's CLI runs `accelerate launch -m axolotl.cli.train CONFIG --opt=value`
        # (or torchrun, or python: --launcher only picks which, and trainfleet is the one).
        args = _without_options(rest[1:], ["--launcher"])
        dropped = " (--launcher dropped: trainfleet is the launcher)" if args != rest[1:] else ""
        return _cli_entry("axolotl train", "`accelerate launch`", "axolotl.cli.train", args,
                          refused=_options_in(args, AXOLOTL_LAUNCHER_OPTIONS),
                          dropped=dropped)  # fmt: skip
    return command, note
