"""Output read from a node, cut into lines: one rule for both readers (`remote/run.py` for
`exec` and node jobs, `launch/output.py` for a launch's ranks). A line longer than LINE_CAP
bytes keeps its first LINE_CAP bytes; the rest is counted and dropped, so that a node that
writes without a newline costs the launcher bounded memory and time linear in what it sent
(each chunk is split once, and only the new chunk is searched for newlines).

    >>> lines = CappedLines(cap=4)
    >>> lines.feed(b"ab\\ncdefgh"), lines.feed(b"ij\\nk")
    ([Line(raw=b'ab', dropped=0)], [Line(raw=b'cdef', dropped=4)])
    >>> lines.end()
    [Line(raw=b'k', dropped=0)]
"""

from __future__ import annotations

from dataclasses import dataclass, field

LINE_CAP = 1 << 16
"""Bytes kept of one line (64 KiB: a long traceback line or a heartbeat fits many times)."""
READ_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class Line:
    raw: bytes
    """The line without its newline, at most the cap."""
    dropped: int = 0
    """How many bytes of the line came after the cap (not kept)."""

    def text(self) -> str:
        """As text: invalid UTF-8 (or a character cut at the cap) becomes U+FFFD."""
        return self.raw.decode("utf-8", errors="replace")


@dataclass(slots=True)
class CappedLines:
    """Chunks in, complete lines out; the line still open is held, at most `cap` bytes of it."""

    cap: int = LINE_CAP
    pending: bytearray = field(default_factory=bytearray)
    dropped: int = 0
    """Bytes of the open line past the cap, so far."""

    def feed(self, chunk: bytes) -> list[Line]:
        """The lines that `chunk` completes."""
        *ended, rest = chunk.split(b"\n")
        lines = []
        for piece in ended:
            self._take(piece)
            lines.append(self._close())
        self._take(rest)
        return lines

    def end(self) -> list[Line]:
        """At the end of the stream: the last line, if it had no newline."""
        return [self._close()] if self.pending or self.dropped else []

    def _take(self, piece: bytes) -> None:
        room = self.cap - len(self.pending)
        self.pending += piece[:room]
        self.dropped += max(len(piece) - room, 0)

    def _close(self) -> Line:
        line = Line(bytes(self.pending), self.dropped)
        self.pending.clear()
        self.dropped = 0
        return line
