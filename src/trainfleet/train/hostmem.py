"""Host RAM a rank gains while it loads the model: the figure behind seed 004's host OOM
(DeepSpeed #5290: every rank of a node holding a full copy of the model in CPU RAM).

    >>> with LoadMemory() as load:
    ...     _ = bytearray(1 << 20)
    >>> load.result().peak_anon_bytes >= 0
    True

What is measured, from the moment the `with` block starts until it ends:
- RssAnon, the anonymous resident memory, sampled from /proc/self/status by a background
  thread. This is what a host OOM is made of: without swap (training hosts run without) the
  kernel cannot drop it, so N ranks that each hold a copy of the model need N copies of RAM.
- RssFile, the file-backed part: safetensors are mmap'd, their pages live in the page cache,
  are shared by every rank of a node and are dropped under pressure, so they are reported but
  are not what runs a host out of memory.
The sampler reads /proc while the loader releases the GIL (file reads, tensor copies and
collectives all do); it reports the largest value seen above the start, and the value at the
end (what stays). On a system without /proc/self/status every figure is 0.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

SAMPLE_S = 0.002
_STATUS = Path("/proc/self/status")


def _read() -> dict[str, int]:
    found = {"RssAnon": 0, "RssFile": 0}
    try:
        lines = _STATUS.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        key, _, value = line.partition(":")
        if key in found:
            found[key] = int(value.split()[0]) * 1024
    return found


def resident_bytes() -> int:
    """This process's resident memory (anonymous and file-backed): it grows while a model
    loads, which makes it the loading phase's progress for the hang watchdog."""
    return sum(_read().values())


@dataclass(frozen=True, slots=True)
class LoadResult:
    peak_anon_bytes: int
    """Largest anonymous RSS seen above the start: the RAM this rank needed to load."""
    after_anon_bytes: int
    """Anonymous RSS above the start once loading returned: what this rank keeps."""
    peak_file_bytes: int
    """Largest file-backed RSS above the start (mmap'd checkpoint pages, shared per node)."""
    seconds: float


class LoadMemory:
    """Context manager sampling this process's RSS while the block runs; `result()` after it."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _take(self) -> dict[str, int]:
        now = _read()
        for key, value in now.items():
            self._peak[key] = max(self._peak[key], value)
        return now

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._take()

    def __enter__(self) -> LoadMemory:
        self._start = _read()
        self._peak = dict(self._start)
        self._began = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._after = self._take()
        self._seconds = time.monotonic() - self._began

    def result(self) -> LoadResult:
        return LoadResult(
            peak_anon_bytes=self._peak["RssAnon"] - self._start["RssAnon"],
            after_anon_bytes=self._after["RssAnon"] - self._start["RssAnon"],
            peak_file_bytes=self._peak["RssFile"] - self._start["RssFile"],
            seconds=round(self._seconds, 2),
        )


def summary(results: list[LoadResult], nodes: list[str], *, full_copy_bytes: int) -> dict:
    """Every rank's result (in rank order) with the node it ran on, and the worst rank, as
    written to OUTPUT/load_memory.json.

    >>> r = LoadResult(peak_anon_bytes=3 << 20, after_anon_bytes=1 << 20, peak_file_bytes=0,
    ...                seconds=1.0)
    >>> s = summary([r, r], ["node1", "node2"], full_copy_bytes=8 << 20)
    >>> s["worst_rank"], s["worst_peak_anon_bytes"], s["full_copy_bytes"]
    (0, 3145728, 8388608)
    """
    ranks = [
        {"rank": i, "node": node, **_fields(r)}
        for i, (r, node) in enumerate(zip(results, nodes, strict=True))
    ]
    worst = max(ranks, key=lambda rank: rank["peak_anon_bytes"])
    return {
        "full_copy_bytes": full_copy_bytes,
        "worst_rank": worst["rank"],
        "worst_peak_anon_bytes": worst["peak_anon_bytes"],
        "ranks": ranks,
    }


def render(report: dict) -> str:
    """One line for the job's log.

    >>> print(render({"full_copy_bytes": 8 << 20, "worst_rank": 1, "worst_peak_anon_bytes":
    ...     3 << 20, "ranks": [{"node": "a", "seconds": 1.0}, {"node": "b", "seconds": 2.0}]}))
    model loaded in 2.0 s: host RAM +3.0 MiB at most per rank (rank 1 on b); a full copy is 8.0 MiB
    """
    mib = 1 << 20
    worst = report["ranks"][report["worst_rank"]]
    seconds = max(rank["seconds"] for rank in report["ranks"])
    return (
        f"model loaded in {seconds:.1f} s: host RAM +{report['worst_peak_anon_bytes'] / mib:.1f}"
        f" MiB at most per rank (rank {report['worst_rank']} on {worst['node']});"
        f" a full copy is {report['full_copy_bytes'] / mib:.1f} MiB"
    )


def _fields(result: LoadResult) -> dict:
    return {name: getattr(result, name) for name in LoadResult.__slots__}
