"""Running one argv on many nodes at once: one local process per node (ssh, or the argv
itself for this machine), output read as it comes, a timeout per node (or a `Watch` that moves
each node's deadline with its work), results in node order.

    >>> worst_returncode([])
    0
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence

from trainfleet.cluster import Node
from trainfleet.errors import RemoteError
from trainfleet.remote.argv import node_argv
from trainfleet.remote.failures import Failure, NodeResult, classify
from trainfleet.remote.lines import LINE_CAP, READ_CHUNK, CappedLines, Line

_DRAIN_AFTER_EXIT_S = 2.0
"""After ssh exits, how long to wait for its pipes to close (a background child may hold them)."""


_WATCH_POLL_S = 0.5
"""How often a `Watch`'s deadlines are read again (they move as the nodes' output comes)."""


LineCallback = Callable[[str, str, str], None]
"""on_line(node, stream, line): stream is 'stdout' or 'stderr'; line has no trailing newline.
A line longer than LINE_CAP bytes comes cut at the cap, followed on the same stream by
trainfleet's note of how many bytes of it were dropped (`remote/lines.py`)."""


async def _pump(
    stream: asyncio.StreamReader,
    sink: bytearray,
    node: str,
    name: str,
    on_line: LineCallback | None,
) -> None:
    """Read a stream to EOF in chunks, all of it into `sink`; hand its lines to on_line, each
    cut at LINE_CAP bytes (`remote/lines.py`)."""
    lines = CappedLines()
    while chunk := await stream.read(READ_CHUNK):
        sink += chunk
        if on_line is not None:
            for line in lines.feed(chunk):
                _hand_over(line, node, name, on_line)
    if on_line is not None:
        for line in lines.end():
            _hand_over(line, node, name, on_line)


def _hand_over(line: Line, node: str, name: str, on_line: LineCallback) -> None:
    on_line(node, name, line.text())
    if line.dropped:
        dropped = f"{line.dropped} more bytes of that line were dropped"
        on_line(node, name, f"trainfleet: {dropped} (a line is cut at {LINE_CAP} bytes)")


class Watch:
    """A run that follows each node's work instead of one timeout: the caller subclasses it.
    `on_line(node, stream, line)`: each output line as it comes (`LineCallback`), before any
    `on_line` the run was also given; `deadline(node)`: when the node's run is stopped
    (monotonic seconds; None: no bound), read again while the run goes on; `more_stdin(node)`:
    bytes written to the node's stdin after the first ones, when the caller knows them (stdin
    is closed after them; None: closed at once); `ended(node)`: the node's process exited."""

    def on_line(self, node: str, stream: str, line: str) -> None:
        return None

    def deadline(self, node: str) -> float | None:
        return None

    async def more_stdin(self, node: str) -> bytes | None:
        return None

    def ended(self, node: str) -> None:
        return None


async def _feed(pipe: asyncio.StreamWriter, node: str, stdin: bytes, watch: Watch | None) -> None:
    try:
        pipe.write(stdin)
        await pipe.drain()
        more = await watch.more_stdin(node) if watch is not None else None
        if more:
            pipe.write(more)
            await pipe.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command exited (or ssh failed) before reading it all; its status says why
    pipe.close()


async def _wait(
    proc: asyncio.subprocess.Process, node: str, limit: float | None, watch: Watch | None
) -> bool:
    """Wait for the process until its deadline (`limit`, or the watch's as it moves); True:
    it was killed for it."""
    waiting = asyncio.ensure_future(proc.wait())
    while True:
        deadline = watch.deadline(node) if watch is not None else limit
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            _kill_group(proc)
            await waiting
            return True
        if watch is not None:
            left = _WATCH_POLL_S if left is None else min(left, _WATCH_POLL_S)
        done, _ = await asyncio.wait({waiting}, timeout=left)
        if done:
            return False


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _run_one(
    node: Node,
    argv: Sequence[str],
    stdin: bytes | None,
    timeout: float | None,
    on_line: LineCallback | None,
    watch: Watch | None = None,
) -> NodeResult:
    cmd = node_argv(node, argv)
    start = time.monotonic()
    out = bytearray()
    err = bytearray()
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # own process group: a timeout kills ssh and its children
        )
    except (FileNotFoundError, PermissionError) as exc:
        return NodeResult(
            node=node.host,
            returncode=127,
            stdout="",
            stderr=f"{exc}\n",
            duration_s=time.monotonic() - start,
            failure=Failure.COMMAND_FAILED,
        )
    # The process types its pipes Optional; stdout and stderr were asked for (PIPE) just above.
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        asyncio.ensure_future(_pump(proc.stdout, out, node.host, "stdout", on_line)),
        asyncio.ensure_future(_pump(proc.stderr, err, node.host, "stderr", on_line)),
    ]
    feeding = None
    if stdin is not None:
        assert proc.stdin is not None  # PIPE whenever there is stdin to send (just above)
        feeding = asyncio.ensure_future(_feed(proc.stdin, node.host, stdin, watch))
    timed_out = await _wait(proc, node.host, None if timeout is None else start + timeout, watch)
    if feeding is not None and not feeding.done():
        feeding.cancel()
    if watch is not None:
        watch.ended(node.host)
    # A persisted ssh master or a backgrounded remote child can hold the pipes open after the
    # command is done; bound the wait for EOF instead of hanging on it.
    _, pending = await asyncio.wait(pumps, timeout=_DRAIN_AFTER_EXIT_S)
    for task in pending:
        task.cancel()
    stderr = err.decode("utf-8", errors="replace")
    return NodeResult(
        node=node.host,
        returncode=None if timed_out else proc.returncode,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=stderr,
        duration_s=time.monotonic() - start,
        failure=classify(proc.returncode, stderr, timed_out, via_ssh=node.via_ssh),
    )


PerNode = Mapping[str, Sequence[str]]
"""argv per node host, for commands that differ by node (its python, its parameters)."""


async def run_on_nodes_async(
    nodes: Sequence[Node],
    argv: Sequence[str] | PerNode,
    *,
    stdin: bytes | Mapping[str, bytes] | None = None,
    timeout: float | None = None,
    on_line: LineCallback | None = None,
    watch: Watch | None = None,
) -> list[NodeResult]:
    """Run `argv` on every node at once; results in the order of `nodes`.

    `argv` and `stdin` may be mappings from node host to that node's own value. With `watch`,
    its deadlines bound each node instead of `timeout`.
    """
    if any(node.via_ssh for node in nodes) and shutil.which("ssh") is None:
        raise RemoteError("no `ssh` client on this machine", "install openssh-client")
    if watch is not None:
        on_line = _both(watch.on_line, on_line)
    per_argv = argv if isinstance(argv, Mapping) else {n.host: argv for n in nodes}
    per_stdin = stdin if isinstance(stdin, Mapping) else {n.host: stdin for n in nodes}
    return list(
        await asyncio.gather(
            *(
                _run_one(node, per_argv[node.host], per_stdin[node.host], timeout, on_line, watch)
                for node in nodes
            )
        )
    )


def _both(first: LineCallback, then: LineCallback | None) -> LineCallback:
    if then is None:
        return first

    def both(node: str, stream: str, line: str) -> None:
        first(node, stream, line)
        then(node, stream, line)

    return both


def run_on_nodes(
    nodes: Sequence[Node],
    argv: Sequence[str] | PerNode,
    *,
    stdin: bytes | Mapping[str, bytes] | None = None,
    timeout: float | None = None,
    on_line: LineCallback | None = None,
    watch: Watch | None = None,
) -> list[NodeResult]:
    """Synchronous `run_on_nodes_async`: run `argv` on every node at once.

    `stdin` is sent to each node (how the probe travels); `timeout` bounds each node's run,
    connect included; `on_line` sees output lines as they arrive; `watch` (`Watch`) moves each
    node's deadline with its work and may write more to its stdin.
    """
    return asyncio.run(
        run_on_nodes_async(nodes, argv, stdin=stdin, timeout=timeout, on_line=on_line, watch=watch)
    )


def command_argv(words: Sequence[str]) -> list[str]:
    """What `trainfleet exec -- WORDS` runs on each node.

    One word is a shell command line, as with `ssh host 'cmd | grep x'`, pdsh and clush: it runs
    under `sh -c`. Several words are an exact argv: each is passed as is, never re-split.
    """
    if not words:
        raise RemoteError("no command given", "put the command after `--`: exec -- hostname")
    if len(words) == 1 and any(ch in words[0] for ch in " \t\n|&;<>()$`\\\"'*?[]~{}"):
        return ["sh", "-c", words[0]]
    return list(words)


def worst_returncode(results: Sequence[NodeResult]) -> int:
    """The exit code of a fan-out: the worst node's (0 only when every node succeeded).

    A node killed for the timeout counts as 124, like timeout(1).
    """
    codes = [124 if r.returncode is None else r.returncode for r in results]
    return max(codes, default=0, key=lambda code: (code != 0, code))
