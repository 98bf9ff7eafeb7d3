"""Where each variable a rank sees comes from: the environment DeepSpeed's runner would give it,
plus what trainfleet sets per node. Pure, like the plans that use it.

    >>> shell = {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/src", "HOME": "/nonexistent"}
    >>> env = EnvBuilder(); env.update(launch_shell_env(shell), LAUNCH_SHELL)
    >>> env.values, env.sources["NCCL_DEBUG"]
    ({'NCCL_DEBUG': 'INFO', 'PYTHONPATH': '/src'}, 'launch shell')

Sources, lowest precedence first (a later one overrides an earlier one, per variable):

1. the launch shell: what DeepSpeed's runner exports to every node (NCCL*, PYTHON*, UCX*, MV2*,
   MLFLOW*), and what it drops but a rank needs (PATH, LD_LIBRARY_PATH, CUDA_HOME, HF_*,
   WANDB_*, TORCH_*);
2. `~/.deepspeed_env`, then `./.deepspeed_env` in the launch directory (the file name is
   `$DS_ENV_FILE` when set), read as DeepSpeed's runner reads them;
3. cluster.yaml's env, cluster-wide then the node's own;
4. what trainfleet knows of the node: the interface that reaches the master, DS_ACCELERATOR=cpu
   without GPUs, CUDA_VISIBLE_DEVICES for an include like `host:0,2`;
5. trainfleet's own TRAINFLEET_* variables.

Below all of them, trainfleet's defaults that any source may override: FLIGHT_RECORDER, the
size of PyTorch's Flight Recorder buffer (what the hang report reads the stuck collective
from; `TORCH_FR_BUFFER_SIZE=0` turns it off).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainfleet.catalog import FindingId
from trainfleet.doctor import netsel
from trainfleet.doctor.checks.network import LOOKUP_OPTIONS
from trainfleet.errors import SpecError

if TYPE_CHECKING:
    from trainfleet.cluster import Cluster
    from trainfleet.launch.options import LaunchFacts

FORWARDED = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME")
FORWARDED_PREFIXES = ("HF_", "WANDB_", "TORCH_")
RUNNER_EXPORTS = ("NCCL", "PYTHON", "UCX", "MV2", "MLFLOW")
"""What DeepSpeed's runner exports from its own environment to every node (runner.py
EXPORT_ENVS plus the CUDA accelerator's export_envs)."""

DS_ENV_NAME = ".deepspeed_env"
INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")

LAUNCH_SHELL = "launch shell"
CLUSTER_YAML = "cluster.yaml"
INTERFACE = "interface to the master"
NO_GPU = "no GPU on the node"
SLOT_LIST = "the node's slot list"
TRAINFLEET = "trainfleet"
DEFAULTS = "trainfleet's default"
SILENT_RESOLVER = "the node's resolver does not answer"
"""The source of RES_OPTIONS=LOOKUP_OPTIONS (`doctor.checks.network`), set on a node whose
resolver did not answer the reverse lookups c10d makes; the user's RES_OPTIONS (cluster.yaml's
env, .deepspeed_env) wins."""

FLIGHT_RECORDER = {"TORCH_FR_BUFFER_SIZE": "2000"}
"""Collectives each rank's Flight Recorder keeps (a ring: the last 2000), for gloo and NCCL. NCCL's
older name, TORCH_NCCL_TRACE_BUFFER_SIZE, is not set: torch 2.13 warns on every rank that it is
deprecated; a user of a torch that reads only that name sets it in cluster.yaml's env."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(slots=True)
class EnvBuilder:
    """A rank's environment and, per variable, the source that set it last."""

    values: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def update(self, values: Mapping[str, str], source: str) -> None:
        for key, value in values.items():
            self.values[key] = value
            self.sources[key] = source

    def drop(self, key: str) -> None:
        self.values.pop(key, None)
        self.sources.pop(key, None)


def is_forwarded(name: str) -> bool:
    return name in FORWARDED or name.startswith(FORWARDED_PREFIXES + RUNNER_EXPORTS)


def launch_shell_env(launch_env: Mapping[str, str]) -> dict[str, str]:
    """The launch shell's variables that reach every rank."""
    return {k: v for k, v in sorted(launch_env.items()) if is_forwarded(k)}


def deepspeed_env_paths(launch_env: Mapping[str, str], launch_cwd: str) -> list[Path]:
    """Where DeepSpeed's runner looks for its env file: the name ($DS_ENV_FILE or
    .deepspeed_env) joined to the home directory, then to the launch directory. An absolute
    DS_ENV_FILE is the same file twice; it is read once here (reading it twice changes nothing)."""
    name = launch_env.get("DS_ENV_FILE") or DS_ENV_NAME
    home = launch_env.get("HOME") or os.path.expanduser("~")
    paths = []
    for base in (home, launch_cwd):
        path = Path(base) / name
        if path not in paths:
            paths.append(path)
    return paths


def parse_deepspeed_env(text: str, source: str) -> dict[str, str]:
    """`KEY=VALUE` lines, as DeepSpeed's runner reads them (split at the first '=', key and
    value stripped). Stricter where the runner would crash or export nonsense: a line without
    '=' or with a key that is no variable name is an error naming the file and line. Blank lines
    and `#` comments, which make the runner crash, are skipped."""
    env: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _NAME.match(key):
            raise SpecError(
                source,
                lineno,
                f"not a `NAME=value` line: {line[:60]!r}",
                "write one `NAME=value` per line, as DeepSpeed's runner expects",
            )
        env[key] = value.strip()
    return env


def read_deepspeed_env_files(paths: list[Path]) -> list[tuple[str, dict[str, str]]]:
    """(the file as it is shown, its variables) for each of `paths` that is a file."""
    found = []
    for path in paths:
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(
                str(path), None, f"cannot read it ({exc})", "fix its permissions or remove it"
            ) from None
        found.append((str(path), parse_deepspeed_env(text, str(path))))
    return found


UserEnv = list[tuple[str, dict[str, str]]]
"""(source, variables) pairs, lowest precedence first: `user_env`'s result."""


def user_env(launch_env: Mapping[str, str], launch_cwd: str) -> UserEnv:
    """Sources 1 and 2 (see the module's docstring), lowest precedence first: what every node
    gets before cluster.yaml and the node's facts."""
    files = read_deepspeed_env_files(deepspeed_env_paths(launch_env, launch_cwd))
    return [(LAUNCH_SHELL, launch_shell_env(launch_env)), *files]


def interface_notes(host: str, interface: str, given: Mapping[str, tuple[str, str]]) -> list[str]:
    """iface-mismatch notes for a global interface variable that would not select `interface`
    (the one that reaches the master) on `host`. `given`: variable -> (value, source)."""
    notes = []
    for name, (value, source) in sorted(given.items()):
        # gloo takes exact names only; NCCL prefixes and its ^/= forms.
        if name == "GLOO_SOCKET_IFNAME":
            fits = value == interface
        else:
            fits = netsel.nccl_accepts(value, interface)
        if not fits:
            notes.append(
                f"{FindingId.IFACE_MISMATCH}: {name}={value} ({source}) does not select {host}'s "
                f"interface to the master, {interface}: {host} gets {name}={interface}"
            )
    return notes


def node_env(
    cluster: Cluster, host: str, facts: LaunchFacts, user: UserEnv
) -> tuple[EnvBuilder, list[str]]:
    """The node's environment with each variable's source (every source of the module's
    docstring but trainfleet's run variables, which each backend adds), and what to tell the
    user about it (a global interface variable that would not work on this node)."""
    node = cluster.node(host)
    env = EnvBuilder()
    env.update(FLIGHT_RECORDER, DEFAULTS)
    if facts.silent_resolver:
        env.update({"RES_OPTIONS": LOOKUP_OPTIONS}, SILENT_RESOLVER)
    for source, values in user:
        env.update(values, source)
    env.update(cluster.env, CLUSTER_YAML)
    env.update({k: v for k, v in node.env.items() if cluster.env.get(k) != v},
               f"cluster.yaml ({host})")  # fmt: skip
    notes: list[str] = []
    if facts.interface:
        given = {
            name: (env.values[name], env.sources[name])
            for name in INTERFACE_VARIABLES
            if name in env.values
        }
        notes = interface_notes(host, facts.interface, given)
        env.update(dict.fromkeys(INTERFACE_VARIABLES, facts.interface), INTERFACE)
    env.update({"TRAINFLEET_NODE": host}, TRAINFLEET)  # its name in the spec
    if facts.gpus == 0:
        env.update({"DS_ACCELERATOR": "cpu"}, NO_GPU)
    if node.gpu_ids != tuple(range(node.slots)):
        visible = ",".join(str(i) for i in node.gpu_ids)
        env.update({"CUDA_VISIBLE_DEVICES": visible}, SLOT_LIST)
    return env, notes


def env_lines(env: Mapping[str, str], sources: Mapping[str, str]) -> list[str]:
    """`    NAME=value` lines for `--dry-run`, sorted, each with its source where it is not
    trainfleet (the caller masks the values)."""
    lines = []
    for key, value in sorted(env.items()):
        source = sources.get(key, TRAINFLEET)
        said = f"    {key}={shlex.quote(value)}"
        lines.append(said if source == TRAINFLEET else f"{said}  # {source}")
    return lines
