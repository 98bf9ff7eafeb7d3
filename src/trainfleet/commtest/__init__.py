"""`trainfleet commtest`: collective bandwidth across the cluster, a verdict, and the slow node
or link found.

    >>> from trainfleet.cluster import load_cluster
    >>> report = run_commtest(load_cluster(cluster_file="cluster.yaml"), CommtestOptions(),
    ...                       run_dir=Path("trainfleet-runs/c1"))  # doctest: +SKIP
    >>> report.passed, [f.nodes for f in report.findings]  # doctest: +SKIP

One job through `trainfleet launch` on every slot of every node (`worker.py`: NCCL on GPUs, gloo
on CPUs); rank 0's JSON line, read back from the run's log, becomes a CommtestReport: the table,
`slow-link` findings from the pair rounds, and the verdict (`formulas.py`).
"""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainfleet.cluster import Cluster
from trainfleet.commtest import formulas
from trainfleet.doctor.findings import Finding
from trainfleet.errors import TrainfleetError
from trainfleet.launch import LaunchOptions, launch, new_run_id, prepare
from trainfleet.launch.supervisor import RunState


@dataclass(kw_only=True, slots=True, frozen=True)
class CommtestOptions:
    ops: tuple[str, ...] = formulas.OPS
    min_bytes: int = 1 << 10
    max_bytes: int = 1 << 30
    factor: int = 2
    iters: int = 20
    warmup: int = 5
    timeout: int = 60
    """Seconds a collective may take before it counts as hung (the process group's timeout)."""
    pairs: bool = True
    pair_bytes: int = 4 << 20
    pair_iters: int = 3
    tcp_seconds: float = 0.5

    def __post_init__(self) -> None:
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
        }


def _directed(rates: dict[str, float]) -> dict[tuple[str, str], float]:
    return {tuple(key.split(">", 1)): rate for key, rate in rates.items()}  # type: ignore[misc]


def build_report(summary: dict, run_dir: Path | None = None) -> CommtestReport:
    """The report from rank 0's JSON line (pure)."""
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
    findings = formulas.slow_findings(_directed(summary["pairs"].get("sendrecv", {})), "send/recv")
    tcp = formulas.slow_findings(_directed(summary["pairs"].get("tcp", {})), "raw TCP")
    covered = {n for f in findings for n in f.nodes}
    findings += [f for f in tcp if not set(f.nodes) <= covered]
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
    )


class _Progress:
    """Shows rank 0's `commtest:` lines while the job runs; the rest stays in the run's logs."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        if "] commtest: " in text:
            self.stream.write(text.split("] ", 1)[1] if "] " in text else text)

    def flush(self) -> None:
        self.stream.flush()


def _rank0_log(run_dir: Path, master: str) -> str:
    path = run_dir / "logs" / f"{master}.rank0.log"
    return path.read_text() if path.exists() else ""


def run_commtest(
    cluster: Cluster, options: CommtestOptions, *, run_dir: Path | None = None, progress=None
) -> CommtestReport:
    nodes = [n.host for n in cluster.nodes]
    spec = {
        "ops": list(options.ops),
        "sizes": formulas.sizes(options.min_bytes, options.max_bytes, options.factor),
        "iters": options.iters,
        "warmup": options.warmup,
        "timeout": options.timeout,
        "rounds": formulas.round_robin(nodes) if options.pairs and len(nodes) > 1 else [],
        "pair_bytes": options.pair_bytes,
        "pair_iters": options.pair_iters,
        "tcp_seconds": options.tcp_seconds,
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
    log = _rank0_log(run_dir, cluster.master)
    line = next((x for x in log.splitlines() if formulas.RESULT_MARK in x), None)
    if result.state is not RunState.DONE or line is None:
        timeouts = [
            x.split("commtest: ", 1)[1]
            for f in sorted((run_dir / "logs").glob("*.log"))
            for x in f.read_text().splitlines()
            if "commtest: TIMEOUT" in x
        ]
        cause = result.root_cause.text if result.root_cause else result.state.value
        raise TrainfleetError(
            f"the commtest job did not finish: {timeouts[0] if timeouts else cause}",
            f"see {run_dir / 'logs'}; `trainfleet doctor` checks the links between the nodes",
        )
    summary = json.loads(line.split(formulas.RESULT_MARK, 1)[1])
    return build_report(summary, run_dir)
