"""The first real error of a run across all nodes: pure functions of the lines the ranks printed.

    >>> tracker = ErrorTracker()
    >>> tracker.feed(1.0, "n1", 0, "Traceback (most recent call last):")
    >>> tracker.feed(1.1, "n1", 0, "ValueError: bad shape")
    >>> tracker.feed(0.9, "n2", 1, "RuntimeError: Connection closed by peer")
    >>> tracker.root_cause().text
    'ValueError: bad shape'

An error is the last line of a Python traceback, a line torchrun or a library marks as
fatal, or a rank's `trainfleet train: ...` line (the worker's own reason to stop). The root
cause is the earliest error that is not a timeout or a consequence of another rank's death (a
closed connection, a SIGTERM sent by the launcher, torchrun's own summary); if every error is
such a consequence, the earliest one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainfleet.catalog import FindingId

# The last line of a traceback: `ValueError: msg`, `torch.distributed.DistNetworkError: msg`,
# `KeyboardInterrupt`.
_EXCEPTION = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure))(?::\s*(.*))?$"
)
_CONSEQUENCE = re.compile(
    r"timed? ?out|timeout|Connection closed by peer|Connection reset|Broken pipe|"
    r"SIGTERM|Signal 15|SIGKILL|ChildFailedError|DistNetworkError|DistStoreError|"
    r"KeyboardInterrupt|Socket Timeout|NCCL watchdog|Terminated|SignalException|got signal|"
    r"ProcessGroupGloo.*(?:closed|reset)|peer.*(?:closed|died)",
    re.IGNORECASE,
)
# torchrun's failure summary, printed by each node's agent:
#   Root Cause (first observed failure):
#   ...
#     rank      : 1 (local_rank: 0)
#     exitcode  : 3 (pid: 19646)
_OWN_ERROR = re.compile(r"^trainfleet \w+: ")
"""What trainfleet's own rank code (`train/worker.py`) prints before it stops a rank."""
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


KNOWN_ERRORS: list[tuple[re.Pattern, str]] = [
    (
        re.compile(r"world_size \d+ != \d+ \* \d+ \* 1\b"),
        "DeepSpeed counted one rank: under HF Trainer's --use_cpu, ZeRO-3's zero.Init reads the"
        " JSON before DeepSpeed's communication is up; leave train_batch_size out of the JSON"
        " (DeepSpeed computes it), see docs/migration.md",
    ),
    (
        re.compile(r"Ninja is required to load C\+\+ extensions"),
        "ninja is not on the PATH the ranks get on that node: `pip install ninja` into the"
        " node's Python, or record its PATH with `trainfleet setup env`"
        f" (doctor: {FindingId.NINJA_MISSING})",
    ),
    (
        # DeepSpeed 0.19.8's op builder parses torch's arch list with int(); torch built for
        # CUDA 13 lists Hopper as "9.0a" (seen on an H200, docs/notes/2026-11.md).
        re.compile(r"invalid literal for int\(\) with base 10: '\d+a'"),
        "DeepSpeed's op builder cannot read torch's GPU architecture name (e.g. 9.0a on Hopper"
        " with a CUDA 13 torch) and no op compiled: set TORCH_CUDA_ARCH_LIST to the plain"
        " number (TORCH_CUDA_ARCH_LIST=9.0) in cluster.yaml's env or in this shell (launch"
        " passes TORCH_* on), then run again",
    ),
    (
        re.compile(r"errno: 98 - Address already in use|EADDRINUSE"),
        "a port the job needs is taken (a leftover run?): `trainfleet doctor` names the"
        " process holding it; stop it or pass --master-port",
    ),
    (
        re.compile(r"CUDA out of memory|OutOfMemoryError"),
        "the GPU ran out of memory: `trainfleet plan` gives the memory per GPU term by term;"
        " lower the micro batch or sequence length, raise the ZeRO stage, offload, or turn on"
        " activation checkpointing",
    ),
    (
        re.compile(r"invalid device ordinal"),
        "a rank asked for a GPU that node does not have: compare its slots with `nvidia-smi -L`"
        f" there (`trainfleet doctor` counts them: {FindingId.GPU_COUNT_MISMATCH})",
    ),
    (
        re.compile(r"all CUDA-capable devices are busy or unavailable"),
        f"another process holds that node's GPUs: `trainfleet doctor` names it"
        f" ({FindingId.GPU_BUSY})",
    ),
    (
        re.compile(r"No space left on device|Disk quota exceeded"),
        "a disk filled on that node: free space where the job writes (output, /tmp, /dev/shm)",
    ),
    (
        re.compile(r"No module named '[\w.]+'"),
        "that node's Python lacks the package: install it there, or point cluster.yaml's"
        " `python:` at the environment that has it (`trainfleet doctor` compares versions)",
    ),
]
"""Error texts whose cause and fix are known (finding ids in the fixes where doctor checks
them): shown beside the root cause."""


def known_fix(text: str) -> str | None:
    """The fix for a root-cause line whose cause is known, else None.

    >>> known_fix("RuntimeError: Ninja is required to load C++ extensions").split(":")[0]
    'ninja is not on the PATH the ranks get on that node'
    """
    for pattern, fix in KNOWN_ERRORS:
        if pattern.search(text):
            return fix
    return None


@dataclass(kw_only=True, slots=True, frozen=True)
class RankError:
    time: float
    node: str
    rank: int | None
    text: str
    consequence: bool
    exitcode: int | None = None

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "rank": self.rank,
            "error": self.text,
            "consequence": self.consequence,
            "exitcode": self.exitcode,
            "fix": known_fix(self.text),
        }


def is_consequence(text: str) -> bool:
    return bool(_CONSEQUENCE.search(text))


@dataclass(slots=True)
class ErrorTracker:
    """Fed every output line as it arrives; knows the errors seen so far."""

    errors: list[RankError] = field(default_factory=list)
    summaries: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per node: (rank, exitcode) of the root cause torchrun's agent reported there."""
    exits: list[tuple[float, str, int, int]] = field(default_factory=list)
    """(time, node, rank, exit code) as each rank's shim reported its end."""
    _in_traceback: set = field(default_factory=set)
    _in_summary: dict = field(default_factory=dict)

    def feed(self, time: float, node: str, rank: int | None, line: str) -> None:
        key = (node, rank)
        text = line.rstrip()
        if rank is None and self._summary(node, text):
            return
        if text.startswith("Traceback (most recent call last)"):
            self._in_traceback.add(key)
            return
        match = _EXCEPTION.match(text) or (rank is not None and _OWN_ERROR.match(text))
        if match and (key in self._in_traceback or rank is not None):
            self._in_traceback.discard(key)
            self.errors.append(
                RankError(
                    time=time, node=node, rank=rank, text=text, consequence=is_consequence(text)
                )
            )

    def _summary(self, node: str, text: str) -> bool:
        """Follows torchrun's 'Root Cause' block; True while inside it."""
        state = self._in_summary.get(node)
        if "Root Cause (first observed failure)" in text:
            self._in_summary[node] = {}
            return True
        if state is None:
            return False
        if m := _SUMMARY_RANK.match(text):
            state["rank"] = int(m.group(1))
        elif m := _SUMMARY_EXIT.match(text):
            state["exitcode"] = int(m.group(1))
        elif text.startswith("====="):
            if "rank" in state and "exitcode" in state:
                self.summaries[node] = (state["rank"], state["exitcode"])
            del self._in_summary[node]
        return True

    def note_exit(self, time: float, node: str, rank: int, code: int) -> None:
        self.exits.append((time, node, rank, code))

    def _exit_code(self, node: str, rank: int | None) -> int | None:
        for _, _, who, code in self.exits:
            if who == rank and rank is not None:
                return code
        summary = self.summaries.get(node)
        return summary[1] if summary and summary[0] == rank else None

    def root_cause(self, first_failed_node: str | None = None) -> RankError | None:
        """The earliest real error, unless a rank exited with a code of its own (positive,
        no traceback of its own) before it; else the first rank that exited non-zero without a
        consequence error of its own; else the rank torchrun's agent names on the first node
        that failed; else the earliest consequence.

        A rank's own exit comes first because what follows it need not be the ranks': DeepSpeed's
        runner, stopping, may print a traceback of its own (`SystemExit: 1` from its signal
        handler inside an atexit callback, seen in a fresh clone's tier)."""
        real = [e for e in self.errors if not e.consequence]
        hit = {e.rank for e in self.errors if e.rank is not None}
        silent = [x for x in self.exits if x[3] != 0 and x[2] not in hit]
        own_exit = min((x for x in silent if x[3] > 0), default=None)
        pick = min(real, key=lambda e: e.time, default=None)
        if pick is not None and (own_exit is None or pick.time <= own_exit[0]):
            return RankError(
                time=pick.time,
                node=pick.node,
                rank=pick.rank,
                text=pick.text,
                consequence=False,
                exitcode=self._exit_code(pick.node, pick.rank),
            )
        if silent:
            when, node, rank, code = own_exit or min(silent)
            return RankError(
                time=when,
                node=node,
                rank=rank,
                text=f"rank {rank} exited with code {code}",
                consequence=False,
                exitcode=code,
            )
        if first_failed_node in self.summaries:
            rank, exitcode = self.summaries[first_failed_node]
            return RankError(
                time=0.0,
                node=first_failed_node,
                rank=rank,
                text=f"rank {rank} exited with code {exitcode}",
                consequence=exitcode < 0,
                exitcode=exitcode,
            )
        return min(self.errors, key=lambda e: e.time, default=None)
