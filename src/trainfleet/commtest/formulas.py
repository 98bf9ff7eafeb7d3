"""Collective benchmark arithmetic, pure: sizes, nccl-tests' bus bandwidth factors, the pair
schedule, and the verdicts drawn from the numbers.

    >>> busbw("all_reduce", algbw=10.0, ranks=8)
    17.5
    >>> round_robin(["a", "b", "c", "d"])
    [[('a', 'd'), ('b', 'c')], [('a', 'c'), ('d', 'b')], [('a', 'b'), ('c', 'd')]]

Definitions from NVIDIA nccl-tests doc/PERFORMANCE.md: algbw = S / t, with S the bytes of the
full array (all_gather: the gathered output; reduce_scatter: the input); busbw = algbw x factor,
the factor making busbw comparable to the hardware's bottleneck bandwidth.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from trainfleet.catalog import FindingId
from trainfleet.doctor.findings import Finding, Severity
from trainfleet.errors import TrainfleetError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv")
SLOW_FRACTION = 0.25
"""A pair slower than this fraction of the median of the other pairs is slow."""
RECORD_MARK = "@@trainfleet-commtest "
"""Starts each of rank 0's JSON records (worker.py prints one per measurement as it is made,
run_commtest reads them back: what was measured survives an interrupt or a hung collective)."""
PAIR_SHARE = 0.4
"""Of the time budget, what the node pair rounds may use; the sweep gets what they leave."""
PASS_FRACTION = 0.5
"""all_reduce busbw at the largest size must reach this fraction of the slowest link."""


def busbw_factor(op: str, ranks: int) -> float:
    n = ranks
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "sendrecv"):
        return 1.0
    raise ValueError(op)


def busbw(op: str, *, algbw: float, ranks: int) -> float:
    return algbw * busbw_factor(op, ranks)


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    if min_bytes <= 0 or max_bytes < min_bytes or factor < 2:
        raise TrainfleetError(
            f"bad size range {min_bytes}..{max_bytes} x{factor}",
            "--min-bytes > 0, --max-bytes >= --min-bytes, --factor >= 2",
        )
    found, size = [], min_bytes
    while size <= max_bytes:
        found.append(size)
        size *= factor
    return found


def estimate(seconds: float, measured_bytes: int, size: int) -> float:
    """One op of `size` bytes, from one of `measured_bytes` that took `seconds`: linear in the
    bytes above it (bandwidth-bound), never less (latency-bound below it).

    >>> estimate(0.01, 1 << 20, 4 << 20)
    0.04
    """
    return seconds * max(1.0, size / measured_bytes)


def iters_for(seconds_left: float, estimates: Sequence[float], warmup: int, most: int) -> int:
    """Timed iterations of the current size when it and the sizes still to come (`estimates`:
    one op of each, the current first) share `seconds_left` equally; every size also runs its
    warmup ops and one check. At least 1, at most `most`: small sizes get `most` and leave
    most of their share to the large ones.

    >>> iters_for(8.0, [0.01, 0.02, 0.04, 0.08], warmup=1, most=20)
    20
    >>> iters_for(8.0, [0.5, 1.0], warmup=1, most=20)
    6
    >>> iters_for(float("inf"), [0.1], warmup=5, most=20)
    20
    """
    if not estimates or estimates[0] <= 0 or seconds_left == float("inf"):
        return most
    share = seconds_left / len(estimates)
    return max(1, min(most, int(share / estimates[0]) - min(warmup, most) - 1))


def least_ops(warmup: int) -> int:
    """Ops a size needs at the fewest: the probe, one warmup op if any are asked for, one timed
    op, and the check."""
    return 3 + min(warmup, 1)


def tcp_seconds(budget: float, rounds: int, most: float) -> float:
    """The raw TCP stream's length per direction, so that the pair rounds (two directions,
    each also timed with send/recv) fit PAIR_SHARE of the budget: `most` unless that is too
    long, never below 0.05 s.

    >>> tcp_seconds(60, rounds=3, most=0.5), tcp_seconds(60, rounds=63, most=0.5)
    (0.5, 0.095)
    """
    if not rounds or budget == float("inf"):
        return most
    return round(max(0.05, min(most, budget * PAIR_SHARE / rounds / 4)), 3)


def round_robin(nodes: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Every pair of nodes once, in rounds of disjoint pairs (the circle method): N-1 rounds
    for N nodes (N rounds when N is odd, one node resting each round)."""
    players: list[str | None] = list(nodes)
    if len(players) % 2:
        players.append(None)
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        pairs = [(players[i], players[-1 - i]) for i in range(half)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def _median_without(
    rates: dict[tuple[str, str], float], node: str | None, pair: tuple[str, str] | None = None
) -> float:
    others = [r for p, r in rates.items() if p != pair and (node is None or node not in p)]
    return statistics.median(others) if others else 0.0


def slow_findings(rates: dict[tuple[str, str], float], what: str) -> list[Finding]:
    """Nodes whose every pair is slow, else single slow pairs, as doctor-shaped findings.
    `rates`: bytes/s per (a, b) pair."""
    if len(rates) < 2:
        return []
    nodes = sorted({n for pair in rates for n in pair})
    findings = []
    slow_nodes = []
    for node in nodes:
        mine = {p: r for p, r in rates.items() if node in p}
        base = _median_without(rates, node)
        if base and mine and all(r < SLOW_FRACTION * base for r in mine.values()):
            slow_nodes.append(node)
            findings.append(
                Finding(
                    id=FindingId.SLOW_LINK,
                    severity=Severity.WARNING,
                    nodes=(node,),
                    evidence=[
                        f"{what} {a} -> {b}: {r / 1e6:.1f} MB/s"
                        for (a, b), r in sorted(mine.items())
                    ]
                    + [f"median of the pairs without {node}: {base / 1e6:.1f} MB/s"],
                    fix=f"check {node}'s link: `ethtool <iface>` (speed, duplex), cable or "
                    "switch port, `tc qdisc show`, and that NCCL/gloo use the data interface",
                )
            )
    slow_pairs: dict[frozenset, list[str]] = {}
    for (a, b), rate in sorted(rates.items()):
        if a in slow_nodes or b in slow_nodes:
            continue
        base = _median_without(rates, None, pair=(a, b))
        if base and rate < SLOW_FRACTION * base:
            slow_pairs.setdefault(frozenset((a, b)), []).append(
                f"{what} {a} -> {b}: {rate / 1e6:.1f} MB/s (median of the other pairs: "
                f"{base / 1e6:.1f} MB/s)"
            )
    for pair, evidence in slow_pairs.items():
        a, b = sorted(pair)
        findings.append(
            Finding(
                id=FindingId.SLOW_LINK,
                severity=Severity.WARNING,
                nodes=(a, b),
                evidence=evidence,
                fix=f"check the path between {a} and {b} (switch ports, routes, MTU)",
            )
        )
    return findings


def verdict(
    busbw_large: float | None, link_rates: dict[str, float], size: int | None
) -> tuple[bool, str]:
    """PASS when all_reduce busbw at the largest size reaches PASS_FRACTION of the slowest link
    (`link_rates`: name -> bytes/s, measured or stated)."""
    if busbw_large is None or not link_rates:
        return False, "no all_reduce result or no link rate to compare with"
    name, slowest = min(link_rates.items(), key=lambda kv: kv[1])
    share = busbw_large / slowest if slowest else 0.0
    text = (
        f"all_reduce busbw at {human(size or 0)} is {busbw_large / 1e9:.3f} GB/s, "
        f"{share:.0%} of the slowest link ({name}: {slowest / 1e9:.3f} GB/s)"
    )
    if share >= PASS_FRACTION:
        return True, f"PASS: {text}"
    return False, f"SHORTFALL: {text}; expected at least {PASS_FRACTION:.0%}"


def human(size: int) -> str:
    """`4194300` -> `4.0 MiB` (binary units, one decimal)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
