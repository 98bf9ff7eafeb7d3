"""Which collective a hung job is stuck in, from every rank's Flight Recorder records.

Every rank launched by trainfleet records its collectives in PyTorch's Flight Recorder
(TORCH_FR_BUFFER_SIZE, set by the plan unless the user set it; gloo and NCCL). When the hang
watchdog fires, the shim in each rank writes a summary of its records on request
(`node/shim.py`, `flight_record`), the node's dump collects them beside the stacks, and this
module reads them: per process group, the first collective some rank enqueued and did not
complete, which ranks entered it, which never did, and which gave no record at all (a stopped
rank, or one whose interpreter does not answer).

    >>> records = {0: SAMPLE, 1: {**SAMPLE, "pg_status": {"0": {"last_enqueued_collective": "4",
    ...                                                        "last_completed_collective": "4"}}}}
    >>> stuck = stuck_collectives(records, world_size=3)
    >>> print(describe(stuck[0], {0: "gpu-node-1", 1: "gpu-node-2", 2: "gpu-node-3"}))
    ... # doctest: +NORMALIZE_WHITESPACE
    all_reduce #5 of process group 0 (default_pg), input sizes [[1000]] Float: entered by rank 0
    (gpu-node-1); never entered by rank 1 (gpu-node-2); no record from rank 2 (gpu-node-3)

A record (what the shim writes, parsed here as untrusted data): `rank`, `pg_status` (pg id ->
`last_enqueued_collective`, `last_completed_collective`, as torch reports them), `entries`
(the last few per process group: `pg_id`, `pg_name`, `collective_seq_id`, `profiling_name`,
`input_sizes`, `input_dtypes`, `is_p2p`). Point-to-point ops are not matched here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SAMPLE = {
    "rank": 0,
    "pg_status": {"0": {"last_enqueued_collective": "5", "last_completed_collective": "4"}},
    "entries": [
        {"pg_id": 0, "pg_name": "default_pg", "collective_seq_id": 5, "is_p2p": False,
         "profiling_name": "gloo:all_reduce", "input_sizes": [[1000]], "input_dtypes": ["Float"]},
    ],
}  # fmt: skip


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _progress(record: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """pg id -> (last enqueued, last completed) collective sequence number, as one rank says."""
    found = {}
    status = record.get("pg_status")
    for pg, values in status.items() if isinstance(status, dict) else ():
        if not isinstance(values, dict):
            continue
        enqueued = _int(values.get("last_enqueued_collective"))
        completed = _int(values.get("last_completed_collective"))
        if enqueued is not None and completed is not None:
            found[str(pg)] = (enqueued, completed)
    return found


def _collectives(record: Mapping[str, Any], pg: str) -> dict[int, dict]:
    """A rank's recorded collectives of group `pg` (not point-to-point), by sequence number."""
    entries = record.get("entries")
    return {
        e["collective_seq_id"]: e
        for e in (entries if isinstance(entries, list) else [])
        if isinstance(e, dict) and str(e.get("pg_id")) == pg and not e.get("is_p2p")
        and isinstance(e.get("collective_seq_id"), int)
    }  # fmt: skip


def _first_pending(record: Mapping[str, Any], pg: str, enqueued: int, completed: int) -> int:
    """The first collective of `pg` this rank enqueued and did not see complete: its lowest
    recorded sequence number above `completed` (torch counts from 1; -1: none completed)."""
    seqs = [seq for seq in _collectives(record, pg) if completed < seq <= enqueued]
    return min(seqs, default=max(completed + 1, 1))


def _signature(entry: Mapping[str, Any]) -> tuple:
    return (entry.get("profiling_name"), repr(entry.get("input_sizes")))


def stuck_collectives(
    records: Mapping[int, Mapping[str, Any] | None], *, world_size: int
) -> list[dict[str, Any]]:
    """Per process group with a collective some rank entered and no rank saw complete: that
    collective (the first such), and who entered it. Process group 0 is every rank; another
    group is the ranks whose records mention it, and those that gave none."""
    answered = {rank: rec for rank, rec in records.items() if isinstance(rec, dict)}
    progress = {rank: _progress(rec) for rank, rec in answered.items()}
    groups = sorted({pg for p in progress.values() for pg in p}, key=lambda g: (_int(g) or 0, g))
    silent_ranks = {r for r in range(world_size) if r not in answered}
    found = []
    for pg in groups:
        # Another group's members are not in the records: those that mention it, and any
        # rank that gave no record (it may be one).
        members = (
            list(range(world_size))
            if pg == "0"
            else sorted({r for r, p in progress.items() if pg in p} | silent_ranks)
        )
        pending = [_first_pending(answered[r], pg, *p[pg])
                   for r, p in progress.items() if pg in p and p[pg][0] > p[pg][1]]  # fmt: skip
        if not pending:
            continue
        seq = min(pending)
        entered = sorted(
            r for r in members if r in answered and progress[r].get(pg, (0, 0))[0] >= seq
        )
        never = sorted(r for r in members if r in answered and r not in entered)
        silent = sorted(r for r in members if r not in answered)
        held = {r: e for r in entered if (e := _collectives(answered[r], pg).get(seq))}
        entry = next(iter(held.values()), {})
        signatures = {r: _signature(e) for r, e in held.items()}
        mismatch = len(set(signatures.values())) > 1
        by_rank = {str(r): {"op": s[0], "input_sizes": s[1]} for r, s in signatures.items()}
        name = entry.get("pg_name")
        found.append(
            {
                "process_group": pg,
                "pg_name": None if name in ("", "undefined") else name,  # torch's "no name"
                "seq": seq,
                "op": str(entry.get("profiling_name") or "?").split(":")[-1],
                "input_sizes": entry.get("input_sizes"),
                "input_dtypes": entry.get("input_dtypes"),
                "entered": entered,
                "never_entered": never,
                "no_record": silent,
                "mismatch": mismatch,
                "by_rank": by_rank if mismatch else {},
            }
        )
    return found


def _who(ranks: list[int], nodes: Mapping[int, str]) -> str:
    shown = [f"{r} ({nodes.get(r, '?')})" for r in ranks[:8]]
    more = f" and {len(ranks) - 8} more" if len(ranks) > 8 else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(shown)}{more}"


def describe(stuck: Mapping[str, Any], nodes: Mapping[int, str]) -> str:
    """One line: the collective, its group and sizes, who entered it and who did not."""
    group = f"process group {stuck['process_group']}"
    if stuck.get("pg_name"):
        group += f" ({stuck['pg_name']})"
    text = f"{stuck['op']} #{stuck['seq']} of {group}"
    if stuck.get("input_sizes") is not None:
        dtypes = " ".join(map(str, stuck.get("input_dtypes") or []))
        text += f", input sizes {stuck['input_sizes']}" + (f" {dtypes}" if dtypes else "")
    parts = []
    if stuck["entered"]:
        parts.append(f"entered by {_who(stuck['entered'], nodes)}")
    if stuck["never_entered"]:
        parts.append(f"never entered by {_who(stuck['never_entered'], nodes)}")
    if stuck["no_record"]:
        parts.append(f"no record from {_who(stuck['no_record'], nodes)}")
    if not stuck["never_entered"] and not stuck["no_record"]:
        parts.append("every rank entered it: it does not complete (the network between them?"
                     " `trainfleet commtest`)")  # fmt: skip
    if stuck.get("mismatch"):
        shapes = "; ".join(f"rank {r}: {v['op']} {v['input_sizes']}"
                           for r, v in stuck["by_rank"].items())  # fmt: skip
        parts.append(f"the ranks disagree on the collective ({shapes})")
    return text + ": " + "; ".join(parts)


def none_stuck(records: Mapping[int, Mapping[str, Any] | None], nodes: Mapping[int, str]) -> str:
    """What to say when no collective is pending on any rank that answered."""
    answered = sorted(r for r, rec in records.items() if isinstance(rec, dict))
    if not answered:
        return ("no Flight Recorder record from any rank (a torch without it, trainfleet's"
                " rank wrapper not in the ranks, or none answered): see the stacks")  # fmt: skip
    silent = sorted(set(nodes) - set(answered))
    text = (f"no collective pending on the {len(answered)} rank(s) with a Flight Recorder record:"
            " the hang is outside collectives (see the stacks)")  # fmt: skip
    if silent:
        text += f"; no record from {_who(silent, nodes)}"
    return text
