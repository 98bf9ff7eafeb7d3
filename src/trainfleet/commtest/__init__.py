"""`trainfleet commtest`: collective bandwidth across the cluster, a verdict, and the slow node
or link found.

    >>> from trainfleet.cluster import load_cluster
    >>> report = run_commtest(load_cluster(cluster_file="cluster.yaml"), CommtestOptions(),
    ...                       run_dir=Path("trainfleet-runs/c1"))  # doctest: +SKIP
    >>> report.passed, [f.nodes for f in report.findings]  # doctest: +SKIP

One job through `trainfleet launch` on every slot of every node (`worker.py`: NCCL on GPUs, gloo
on CPUs), within a time budget; rank 0's JSON records, read back from the run's log, become a
CommtestReport: the table, `slow-link` findings from the pair rounds, and the verdict
(`formulas.py`). A run that was interrupted or whose collective hung still gives the report of
what was measured, marked incomplete (`stopped` says why).
"""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from trainfleet.cluster import Cluster
from trainfleet.commtest import formulas
from trainfleet.doctor.findings import Finding
from trainfleet.errors import TrainfleetError
from trainfleet.launch import LaunchOptions, launch, new_run_id, prepare
from trainfleet.launch.result import RunState


@dataclass(kw_only=True, slots=True, frozen=True)
class CommtestOptions:
    ops: tuple[str, ...] = formulas.OPS
    min_bytes: int = 1 << 10
    max_bytes: int = 1 << 30
    factor: int = 2
    iters: int = 20
    """At most this many timed ops per size; fewer where the time budget runs short."""
    warmup: int = 5
    time_budget: float | None = 60.0
    """Seconds of measuring (after every rank joined); None: no bound, `iters` everywhere."""
    timeout: int = 60
    """Seconds a collective may take before it counts as hung (the process group's timeout)."""
    pairs: bool = True
    pair_bytes: int = 4 << 20
    pair_iters: int = 3
    tcp_seconds: float = 0.5

    def __post_init__(self) -> None:
        if self.time_budget is not None and self.time_budget <= 0:
            raise TrainfleetError(
                f"--time-budget {self.time_budget:g} is not a duration",
                "give seconds above 0, or 0 on the command line for no bound",
            )
        unknown = [op for op in self.ops if op not in formulas.OPS]
        if unknown:
            raise TrainfleetError(
                f"unknown op {', '.join(unknown)}", f"choose from {', '.join(formulas.OPS)}"
            )


@dataclass(kw_only=True, slots=True)
class CommtestReport:
    backend: str
    world_size: int
    device: str
    results: list[dict]
    pairs: dict[str, dict[str, float]]
    links: dict[str, float]
    """Link rates to judge against (bytes/s): kernel-reported speeds and raw TCP per pair."""
    findings: list[Finding] = field(default_factory=list)
    passed: bool = False
    verdict: str = ""
    run_dir: Path | None = None
    skipped: list[dict] = field(default_factory=list)
    """{op, bytes, reason}: the sizes from `bytes` up not measured for `op`."""
    pair_rounds: tuple[int, int] = (0, 0)
    """(measured, scheduled) node pair rounds."""
    seconds: float | None = None
    """Measuring time, as the slowest rank saw it; None when the run did not end."""
    stopped: str | None = None
    """Why the run ended before measuring everything it could (interrupt, hung collective)."""

    def to_json(self) -> dict:
        return {
            "backend": self.backend,
            "world_size": self.world_size,
            "device": self.device,
            "results": self.results,
            "pairs": self.pairs,
            "links": self.links,
            "findings": [f.to_json() for f in self.findings],
            "passed": self.passed,
            "verdict": self.verdict,
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "skipped": self.skipped,
            "pair_rounds": list(self.pair_rounds),
            "seconds": self.seconds,
            "complete": self.stopped is None,
            "stopped": self.stopped,
        }


def _directed(rates: dict[str, float]) -> dict[tuple[str, str], float]:
    return {tuple(key.split(">", 1)): rate for key, rate in rates.items()}  # type: ignore[misc]


def _parse_record(line: str) -> dict | None:
    """One of rank 0's records from a line of its output; None when the line has none or is
    torn (an interrupt while it was written)."""
    if formulas.RECORD_MARK not in line:
        return None
    try:
        return json.loads(line.split(formulas.RECORD_MARK, 1)[1])
    except json.JSONDecodeError:
        return None


def _add_pairs(pairs: dict[str, dict[str, float]], record: dict) -> None:
    for what in ("sendrecv", "tcp"):
        pairs.setdefault(what, {}).update(record.get(what, {}))


def summary_from_records(text: str, rounds: int) -> dict | None:
    """What rank 0 recorded (its log's RECORD_MARK lines), as one summary; None before its
    first record. `rounds`: the pair rounds scheduled. A torn last line (an interrupt while
    it was written) is left out."""
    summary: dict | None = None
    for record in filter(None, map(_parse_record, text.splitlines())):
        kind = record.pop("kind", None)
        if kind == "start":
            summary = {**record, "results": [], "pairs": {"sendrecv": {}, "tcp": {}}}
            summary.update(skipped=[], pair_rounds=[0, rounds], seconds=None)
        elif summary is None:
            continue
        elif kind == "row":
            summary["results"].append(record)
        elif kind == "pairs":
            summary["pair_rounds"] = record["round"]
            _add_pairs(summary["pairs"], record)
        elif kind == "skipped":
            summary["skipped"].append(record)
        elif kind == "end":
            summary["seconds"] = record["seconds"]
    return summary


def pair_findings(pairs: dict[str, dict[str, float]]) -> list[Finding]:
    """`slow-link` from the pair rounds, send/recv's first, raw TCP's where it names more. A
    node all of whose pairs are slow is named by either measure; a single slow pair only when
    the other measure, where it measured that pair, agrees: one stall of a busy machine slows
    one measure of one pair (seen on the clean sandbox: one send/recv pair at 314 MB/s against
    1362), a bad path slows both."""
    sendrecv = _directed(pairs.get("sendrecv", {}))
    tcp = _directed(pairs.get("tcp", {}))
    by_sendrecv = formulas.slow_findings(sendrecv, "send/recv")
    by_tcp = formulas.slow_findings(tcp, "raw TCP")

    def confirmed(finding: Finding, other: list[Finding], other_rates: dict) -> bool:
        a, *b = finding.nodes
        if not b or not ({(a, *b), (*b, a)} & set(other_rates)):
            return True
        return any(set(f.nodes) <= set(finding.nodes) for f in other)

    findings = [f for f in by_sendrecv if confirmed(f, by_tcp, tcp)]
    covered = {n for f in findings for n in f.nodes}
    return findings + [
        f for f in by_tcp if confirmed(f, by_sendrecv, sendrecv) and not set(f.nodes) <= covered
    ]


def build_report(
    summary: dict, run_dir: Path | None = None, stopped: str | None = None
) -> CommtestReport:
    """The report from rank 0's records (pure); `stopped` marks it incomplete."""
    links: dict[str, float] = {}
    for rank in summary["ranks"]:
        if rank["local_rank"] != 0:
            continue
        if rank.get("link_speed"):
            links[f"{rank['iface']} on {rank['node']} (kernel)"] = rank["link_speed"]
        if summary["backend"] == "nccl" and rank.get("ib"):
            # NCCL spreads over every active port of the node: their sum is its rate.
            links[f"InfiniBand on {rank['node']} ({len(rank['ib'])} port(s))"] = sum(
                rank["ib"].values()
            )
    for key, rate in summary["pairs"].get("tcp", {}).items():
        links[f"raw TCP {key.replace('>', ' -> ')}"] = rate
    infiniband = {k: v for k, v in links.items() if k.startswith("InfiniBand")}
    if infiniband:  # NCCL's data goes over them, not over the socket interface
        links = infiniband
    findings = pair_findings(summary["pairs"])
    reduce_rows = [r for r in summary["results"] if r["op"] == "all_reduce"]
    largest = max(reduce_rows, key=lambda r: r["bytes"], default=None)
    passed, verdict = formulas.verdict(
        largest["busbw"] if largest else None, links, largest["bytes"] if largest else None
    )
    wrong = [r for r in summary["results"] if r["wrong"]]
    if wrong:
        passed = False
        where = ", ".join(f"{r['op']} at {r['bytes']} B" for r in wrong)
        verdict = f"WRONG RESULTS: {where}; {verdict}"
    if stopped:
        passed = False
        verdict = f"INCOMPLETE ({stopped}): {verdict}"
    return CommtestReport(
        backend=summary["backend"],
        world_size=summary["world_size"],
        device=summary["device"],
        results=summary["results"],
        pairs=summary["pairs"],
        links=links,
        findings=findings,
        passed=passed,
        verdict=verdict,
        run_dir=run_dir,
        skipped=summary.get("skipped", []),
        pair_rounds=tuple(summary.get("pair_rounds", (0, 0))),
        seconds=summary.get("seconds"),
        stopped=stopped,
    )


class _Progress:
    """Shows rank 0's `commtest:` lines while the job runs, and a slow link as soon as the
    pair rounds name it; the rest stays in the run's logs."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.pairs: dict[str, dict[str, float]] = {"sendrecv": {}, "tcp": {}}
        self.named: set[tuple[str, ...]] = set()

    def write(self, text: str) -> None:
        if "] commtest: " in text:
            self.stream.write(text.split("] ", 1)[1])
        elif (record := _parse_record(text)) and record.get("kind") == "pairs":
            self._pairs_record(record)

    def _pairs_record(self, record: dict) -> None:
        _add_pairs(self.pairs, record)
        for finding in pair_findings(self.pairs):
            if finding.nodes not in self.named:
                self.named.add(finding.nodes)
                self.stream.write(
                    f"commtest: {finding.id} [{', '.join(finding.nodes)}]: {finding.evidence[0]}\n"
                )

    def flush(self) -> None:
        self.stream.flush()


def _rank0_log(run_dir: Path, master: str) -> str:
    path = run_dir / "logs" / f"{master}.rank0.log"
    return path.read_text() if path.exists() else ""


def run_commtest(
    cluster: Cluster,
    options: CommtestOptions,
    *,
    run_dir: Path | None = None,
    progress: TextIO | None = None,
) -> CommtestReport:
    """The report of what was measured; `stopped` set when the run ended early (interrupted,
    a collective hung, ranks that never joined: then nothing was measured)."""
    nodes = [n.host for n in cluster.nodes]
    rounds = formulas.round_robin(nodes) if options.pairs and len(nodes) > 1 else []
    budget = options.time_budget
    spec = {
        "ops": list(options.ops),
        "sizes": formulas.sizes(options.min_bytes, options.max_bytes, options.factor),
        "iters": options.iters,
        "warmup": options.warmup,
        "timeout": options.timeout,
        "rounds": rounds,
        "pair_bytes": options.pair_bytes,
        "pair_iters": options.pair_iters,
        "tcp_seconds": formulas.tcp_seconds(
            budget or float("inf"), len(rounds), options.tcp_seconds
        ),
        "pair_end": budget * formulas.PAIR_SHARE if budget else None,
        "end": budget,
    }
    encoded = base64.b64encode(json.dumps(spec).encode()).decode()
    launch_options = LaunchOptions(
        command=("-m", "trainfleet.commtest.worker", encoded),
        run_id=new_run_id(),
        local_rank_arg="never",
    )
    run_dir = run_dir or Path("trainfleet-runs") / f"commtest-{launch_options.run_id}"
    plan, _ = prepare(cluster, launch_options, run_dir=run_dir)
    result = launch(plan, cluster, run_dir=run_dir, out=_Progress(progress or sys.stderr))
    summary = summary_from_records(_rank0_log(run_dir, cluster.master), len(rounds))
    if result.state is RunState.DONE and summary and summary["seconds"] is not None:
        return build_report(summary, run_dir)
    if result.state is RunState.INTERRUPTED:
        stopped = "interrupted"
    else:
        timeouts = [
            x.split("commtest: ", 1)[1]
            for f in sorted((run_dir / "logs").glob("*.log"))
            for x in f.read_text().splitlines()
            if "commtest: TIMEOUT" in x
        ]
        cause = result.root_cause.text if result.root_cause else result.state.value
        stopped = f"the commtest job did not finish: {timeouts[0] if timeouts else cause}"
    if summary is None:  # stopped before rank 0 recorded anything: an empty report, still one
        stopped += f" (see {run_dir / 'logs'}; `trainfleet doctor` checks the links between nodes)"
        summary = {"backend": "?", "world_size": plan.world_size, "device": "?", "ranks": []}
        summary.update(results=[], pairs={}, pair_rounds=[0, len(rounds)])
    return build_report(summary, run_dir, stopped=stopped)
