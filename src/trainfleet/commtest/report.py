"""The commtest report as text (columns like nccl-tests'), and as a plot of busbw vs size.

>>> print(render(report))  # doctest: +SKIP
>>> plot(report, Path("busbw.png"))  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

from trainfleet.commtest import CommtestReport
from trainfleet.commtest.formulas import human
from trainfleet.doctor.report import finding_lines
from trainfleet.errors import TrainfleetError

_REDOP = {"all_reduce": "sum", "reduce_scatter": "sum"}


def render(report: CommtestReport) -> str:
    lines = [
        f"commtest: {report.world_size} ranks, {report.backend} on {report.device}",
        "",
        f"#{'op':>15} {'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} "
        f"{'time':>11} {'algbw':>8} {'busbw':>8} {'#wrong':>7}",
        f"#{'':>15} {'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'':>5} "
        f"{'(us)':>11} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}",
    ]
    for row in report.results:
        root = "0" if row["op"] == "broadcast" else "-1"
        lines.append(
            f" {row['op']:>15} {row['bytes']:>12} {row['count']:>12} {'float':>6} "
            f"{_REDOP.get(row['op'], 'none'):>6} {root:>5} {row['time_us']:>11.1f} "
            f"{row['algbw'] / 1e9:>8.3f} {row['busbw'] / 1e9:>8.3f} {row['wrong']:>7}"
        )
    wrong = sum(r["wrong"] for r in report.results)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'WRONG'}")
    for skip in report.skipped:
        lines.append(
            f"# {skip['op']}: from {human(skip['bytes'])} up not measured ({skip['reason']})"
        )
    if report.pairs.get("sendrecv"):
        lines += [
            "",
            "node pairs (rounds of disjoint pairs; each direction timed by its receiver):",
        ]
        tcp = report.pairs.get("tcp", {})
        for key, rate in sorted(report.pairs["sendrecv"].items()):
            raw = f"   raw TCP {tcp[key] / 1e6:9.1f} MB/s" if key in tcp else ""
            lines.append(f"  {key.replace('>', ' -> '):<32} send/recv {rate / 1e6:9.1f} MB/s{raw}")
        done, scheduled = report.pair_rounds
        if done < scheduled:
            lines.append(f"  ({done} of {scheduled} rounds measured)")
    for finding in report.findings:
        lines += ["", *finding_lines(finding)]
    lines += ["", report.verdict]
    if report.seconds is not None:
        lines.append(f"measured in {report.seconds:.1f} s")
    if report.run_dir:
        lines.append(f"logs: {report.run_dir / 'logs'}")
    return "\n".join(lines)


def plot(report: CommtestReport, path: Path) -> None:
    """busbw against size, one line per op (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise TrainfleetError(
            "--plot needs matplotlib", "pip install 'trainfleet[plot]' (or matplotlib)"
        ) from exc
    fig, ax = plt.subplots(figsize=(8, 5))
    for op in dict.fromkeys(r["op"] for r in report.results):
        rows = [r for r in report.results if r["op"] == op]
        ax.plot([r["bytes"] for r in rows], [r["busbw"] / 1e9 for r in rows], marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"trainfleet commtest: {report.world_size} ranks, {report.backend}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
