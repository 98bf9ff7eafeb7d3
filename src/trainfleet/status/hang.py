"""The hang record: what the launcher's hang watchdog found (`launch/watchdogs.py`), kept as
status.json's `hang`; `trainfleet status`, the launch's outcome and the restart log read it.

    >>> hang = Hang(stuck_s=300.3, detected_at=1740831400.5, phase="training")
    >>> hang.headline()
    (<FindingId.RANK_HUNG: 'rank-hung'>, 'no rank advanced past step None for 300 s')
    >>> behind = (Behind(node="gpu-node-2", rank=2, where="stopped (SIGSTOP or a debugger)"),)
    >>> hang = hang.dumped(StackReport(step=311, behind=behind, stacks="runs/r1/stacks",
    ...                                collectives=(), flight_records=(0, 1, 3)))
    >>> hang.headline()[1]
    'no rank advanced past step 311 for 300 s'
    >>> Hang.from_json(hang.to_json()) == hang
    True

It is written in two steps: at detection `stuck_s`, `detected_at` and `phase` (`startup`,
`training` or `finishing`); once every rank's stack was dumped, the `StackReport`'s `step` (the
lowest), `behind` (each `node`, `rank`, `where` it waits), `stacks` (the dumps' directory),
`collectives` (the stuck collective per process group, `launch/collectives.py`) and
`flight_records` (the ranks that gave one). `to_json` writes the keys that have a value, and
the report's `step` and `behind` whenever there is a report: the file keeps the shape it has
had since `phase` came in. A file is not ours once written, and older launchers wrote less
(no `phase`, `collectives` or `flight_records`): `from_json` reads any of them, a value of the
wrong type as unknown, never as an error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from trainfleet.catalog import FindingId

_REPORT_KEYS = ("step", "behind", "stacks", "collectives", "flight_records")


def _number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _items(value: Any, kind: type) -> tuple | None:
    """A list's items of `kind` (None: no list, as in files from before the key)."""
    if not isinstance(value, list):
        return None
    return tuple(v for v in value if isinstance(v, kind) and not isinstance(v, bool))


@dataclass(frozen=True, kw_only=True, slots=True)
class Behind:
    """A rank at the lowest step when the run hung, and where its stack says it waits."""

    node: str | None
    rank: int | None
    where: str | None
    """The rank's node's text (its stack): shown through `untrusted.printable`."""

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in (("node", self.node), ("rank", self.rank),
                                  ("where", self.where)) if v is not None}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any) -> Behind:
        if not isinstance(data, dict):  # a bare rank
            return cls(node=None, rank=_int(data), where=None)
        return cls(node=_str(data.get("node")), rank=_int(data.get("rank")),
                   where=_str(data.get("where")))  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class StackReport:
    """What the stack dumps and the ranks' Flight Recorders said, once the run hung."""

    step: int | None
    """The lowest step of any rank (None: a rank that never beat is behind)."""
    behind: tuple[Behind, ...]
    stacks: str | tuple[str, ...] | None
    """The dumps' directory (the fixtures of old files: a list of files)."""
    collectives: tuple[dict[str, Any], ...] | None
    """`collectives.stuck_collectives`'s records, as they came; None: an older file."""
    flight_records: tuple[int, ...] | None
    """The ranks that gave a Flight Recorder record; None: an older file."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"step": self.step, "behind": [b.to_json() for b in self.behind]}
        if self.stacks is not None:
            data["stacks"] = self.stacks if isinstance(self.stacks, str) else list(self.stacks)
        if self.collectives is not None:
            data["collectives"] = list(self.collectives)
        if self.flight_records is not None:
            data["flight_records"] = list(self.flight_records)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackReport:
        behind, stacks = data.get("behind"), data.get("stacks")
        collectives, records = data.get("collectives"), data.get("flight_records")
        if isinstance(stacks, dict):
            stacks = list(stacks.values())
        return cls(
            step=_int(data.get("step")),
            behind=tuple(map(Behind.from_json, behind)) if isinstance(behind, list) else (),
            stacks=tuple(map(str, stacks)) if isinstance(stacks, list) else _str(stacks),
            collectives=_items(collectives, dict),
            flight_records=_items(records, int),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Hang:
    """A HUNG run: how long no rank advanced, when that was seen, in which phase; then what
    the stack dumps said (`report`, None until they were taken)."""

    stuck_s: float | None
    detected_at: float | None
    """Unix seconds."""
    phase: str | None
    """`startup` (before the first step), `training`, or `finishing` (after every rank's
    last step); None: an older file."""
    report: StackReport | None = None

    def dumped(self, report: StackReport) -> Hang:
        """This hang with what the stack dumps said."""
        return replace(self, report=report)

    @property
    def behind(self) -> tuple[Behind, ...]:
        return self.report.behind if self.report else ()

    def headline(self) -> tuple[FindingId, str]:
        """The finding id and what happened, in the words of the outcome and restart log."""
        stuck = f"{self.stuck_s or 0:.0f} s"
        if self.phase == "startup":
            return (
                FindingId.STARTUP_TIMEOUT,
                f"no startup progress for {stuck}, before the first step",
            )
        step = self.report.step if self.report else None
        return FindingId.RANK_HUNG, f"no rank advanced past step {step} for {stuck}"

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in (("stuck_s", self.stuck_s), ("detected_at", self.detected_at),
                                  ("phase", self.phase)) if v is not None}  # fmt: skip
        return {**data, **(self.report.to_json() if self.report else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Hang:
        report = None
        if any(key in data for key in _REPORT_KEYS):
            report = StackReport.from_json(data)
        return cls(
            stuck_s=_number(data.get("stuck_s")),
            detected_at=_number(data.get("detected_at")),
            phase=_str(data.get("phase")),
            report=report,
        )
