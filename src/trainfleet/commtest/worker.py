"""The commtest program, run in every rank by `trainfleet launch` (`-m trainfleet.commtest.worker
SPEC`): node pairs measured in rounds, then collectives timed per size and their results
checked, all within a time budget.

First, between the first ranks of every two nodes, in rounds of disjoint pairs:
torch.distributed send/recv and a raw TCP stream on the same interfaces, each direction timed by
its receiver; the rounds stop when their share of the budget is spent. Then each op and size: one
op timed alone (the probe), `warmup` ops, as many timed ops back to back as the budget left
gives every size still to come (at most `iters`), time per op = the slowest rank's (all_reduce
MAX; on GPUs, CUDA events), and one more op from known inputs whose result every rank can
predict. A size whose estimated time no longer fits the op's share of the budget, and the
larger ones, are skipped and said so. Every decision is taken on values all ranks agree on (the
slowest rank's clock and times), so every rank runs the same collectives.

Rank 0 prints one JSON record per measurement as soon as it has it (RECORD_MARK): an interrupt
or a hung collective loses only what was not measured. A collective that hangs ends at the
process group's timeout with `commtest: TIMEOUT op=...` and exit code 124; the launcher then
stops every rank.
"""

from __future__ import annotations

import base64
import datetime
import fcntl
import json
import os
import socket
import statistics
import struct
import sys
import time

import torch
import torch.distributed as dist

from trainfleet.commtest import formulas
from trainfleet.commtest.formulas import RECORD_MARK, busbw_factor

DTYPE = torch.float32
ELEMENT = 4


def _say(text: str) -> None:
    if dist.get_rank() == 0:
        print(f"commtest: {text}", flush=True)


def _record(kind: str, **fields: object) -> None:
    if dist.get_rank() == 0:
        print(RECORD_MARK + json.dumps({"kind": kind, **fields}), flush=True)


class Clock:
    """Seconds since measuring began, as the slowest rank sees them (all_reduce MAX): every
    rank reads the same value, so budget decisions taken on it agree."""

    def __init__(self) -> None:
        dist.barrier()
        self.start = time.monotonic()

    def now(self, device: torch.device) -> float:
        return _slowest(time.monotonic() - self.start, device)


def _slowest(seconds: float, device: torch.device) -> float:
    """The largest of every rank's `seconds` (all_reduce MAX)."""
    value = torch.tensor([seconds], dtype=torch.float64)
    if device.type == "cuda":
        value = value.to(device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Op:
    """Buffers for one op at one size, the op itself, and the check of its result."""

    def __init__(self, name: str, size: int, device: torch.device) -> None:
        n, r = dist.get_world_size(), dist.get_rank()
        self.name = name
        count = max(n, size // ELEMENT // n * n)  # whole elements, divisible by the ranks
        self.bytes = count * ELEMENT
        chunk = count // n
        new = lambda k: torch.empty(k, dtype=DTYPE, device=device)  # noqa: E731
        if name == "all_reduce":
            self.buf = new(count)
        elif name == "all_gather":
            self.inp, self.out = new(chunk), new(count)
        elif name == "reduce_scatter":
            self.inp, self.out = new(count), new(chunk)
        elif name == "broadcast":
            self.buf = new(count)
        elif name == "all_to_all":
            self.inp, self.out = new(count), new(count)
            self.inp.copy_(
                torch.arange(n, device=device, dtype=DTYPE).repeat_interleave(chunk) + r * n
            )
        elif name == "sendrecv":
            self.inp, self.out = new(count), new(count)
        self.n, self.r, self.chunk = n, r, chunk

    def reset(self) -> None:
        """Inputs each op overwrites in place get their known values back."""
        if self.name == "all_reduce":
            self.buf.fill_(self.r + 1)
        elif self.name == "all_gather":
            self.inp.fill_(self.r + 1)
        elif self.name == "reduce_scatter":
            self.inp.fill_(self.r + 1)
        elif self.name == "broadcast":
            self.buf.fill_(1.0 if self.r == 0 else 0.0)
        elif self.name == "sendrecv":
            self.inp.fill_(self.r + 1)

    def run(self) -> None:
        if self.name == "all_reduce":
            dist.all_reduce(self.buf)
        elif self.name == "all_gather":
            dist.all_gather_into_tensor(self.out, self.inp)
        elif self.name == "reduce_scatter":
            dist.reduce_scatter_tensor(self.out, self.inp)
        elif self.name == "broadcast":
            dist.broadcast(self.buf, 0)
        elif self.name == "all_to_all":
            dist.all_to_all_single(self.out, self.inp)
        elif self.name == "sendrecv" and self.n == 1:
            self.out.copy_(self.inp)  # one rank: nobody to send to
        elif self.name == "sendrecv":  # a ring: to the next rank, from the previous one
            nxt, prev = (self.r + 1) % self.n, (self.r - 1) % self.n
            ops = [dist.P2POp(dist.isend, self.inp, nxt), dist.P2POp(dist.irecv, self.out, prev)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    def wrong(self) -> int:
        """Elements of the last result that differ from what every rank can predict."""
        n, r = self.n, self.r
        if self.name == "all_reduce":
            got, want = self.buf, torch.full_like(self.buf, n * (n + 1) / 2)
        elif self.name == "all_gather":
            want = torch.arange(1, n + 1, device=self.out.device, dtype=DTYPE)
            got, want = self.out, want.repeat_interleave(self.chunk)
        elif self.name == "reduce_scatter":
            got, want = self.out, torch.full_like(self.out, n * (n + 1) / 2)
        elif self.name == "broadcast":
            got, want = self.buf, torch.ones_like(self.buf)
        elif self.name == "all_to_all":
            sources = torch.arange(n, device=self.out.device, dtype=DTYPE) * n + r
            got, want = self.out, sources.repeat_interleave(self.chunk)
        else:
            got, want = self.out, torch.full_like(self.out, (r - 1) % n + 1)
        return int((got != want).sum().item())


def probe(op: Op, device: torch.device) -> float:
    """Seconds of one op on the slowest rank: the first op of a size, timed alone, from which
    the size's iteration count and the next size's estimate follow."""
    op.reset()
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    op.run()
    _sync(device)
    return _slowest(time.perf_counter() - start, device)


def time_op(op: Op, iters: int, warmup: int, device: torch.device) -> tuple[float, int]:
    """(seconds per op on the slowest rank, wrong elements over all ranks)."""
    op.reset()
    for _ in range(warmup):
        op.run()
    _sync(device)
    dist.barrier()
    if device.type == "cuda":  # the GPU's own clock: no host-side launch overhead in it
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(iters):
            op.run()
        end.record()
        end.synchronize()
        per_op = begin.elapsed_time(end) / 1e3 / iters
    else:
        start = time.perf_counter()
        for _ in range(iters):
            op.run()
        per_op = (time.perf_counter() - start) / iters
    elapsed = torch.tensor([per_op], dtype=torch.float64)
    op.reset()
    op.run()  # one more, from known inputs, to check
    _sync(device)
    wrong = torch.tensor([op.wrong()], dtype=torch.float64)
    if device.type == "cuda":
        elapsed, wrong = elapsed.to(device), wrong.to(device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    dist.all_reduce(wrong)
    return float(elapsed.item()), int(wrong.item())


def _iface_address(name: str | None) -> str | None:
    """IPv4 address of interface `name` (SIOCGIFADDR), the one launch chose for this node."""
    if not name:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _link_speed(name: str | None) -> float | None:
    """Bytes/s the kernel reports for the interface (/sys/class/net/IFACE/speed, Mbit/s)."""
    try:
        mbit = int(open(f"/sys/class/net/{name}/speed").read().strip())
    except (OSError, ValueError, TypeError):
        return None
    return mbit * 1e6 / 8 if mbit > 0 else None


def _ib_rates() -> dict[str, float]:
    """Bytes/s of each active InfiniBand port (/sys/class/infiniband/DEV/ports/N/rate reads
    like `200 Gb/sec (4X HDR)`)."""
    rates = {}
    root = "/sys/class/infiniband"
    for dev in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        ports = os.path.join(root, dev, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            try:
                state = open(os.path.join(ports, port, "state")).read()
                rate = open(os.path.join(ports, port, "rate")).read().split()
            except OSError:
                continue
            if "ACTIVE" in state and rate and rate[0].replace(".", "", 1).isdigit():
                rates[f"{dev}/{port}"] = float(rate[0]) * 1e9 / 8
    return rates


def _tcp_send(address: tuple[str, int], seconds: float) -> None:
    block = b"\0" * (1 << 20)
    with socket.create_connection(address, timeout=30) as conn:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            conn.sendall(block)


def _tcp_receive(listener: socket.socket) -> float:
    """Bytes/s of one incoming stream, timed from its first byte to its end."""
    conn, _ = listener.accept()
    with conn:
        total, start = 0, None
        while chunk := conn.recv(1 << 20):
            start = start or time.perf_counter()
            total += len(chunk)
        elapsed = time.perf_counter() - (start or time.perf_counter())
    return total / elapsed if elapsed > 0 else 0.0


def pairs(spec: dict, me: dict, everyone: list[dict], device: torch.device, clock: Clock) -> None:
    """Send/recv and raw TCP rates per directed node pair, measured in rounds of disjoint
    pairs between the nodes' first ranks; every rank takes part in the round barriers. Each
    round's rates are recorded when it ends; the rounds stop at `pair_end` on the clock."""
    leaders = {p["node"]: p["rank"] for p in everyone if p["local_rank"] == 0}
    address = {p["node"]: (p["address"], p["port"]) for p in everyone if p["local_rank"] == 0}
    buf = torch.ones(max(1, spec["pair_bytes"] // ELEMENT), dtype=DTYPE, device=device)
    tiny = torch.ones(1, dtype=DTYPE, device=device)
    listener = me.pop("listener", None)
    total = len(spec["rounds"])
    for number, round_pairs in enumerate(spec["rounds"], 1):
        if number > 1 and clock.now(device) > spec["pair_end"]:
            _say(f"pairs: {number - 1} of {total} rounds fit the time budget; the rest skipped")
            break
        _say(f"pairs, round {number}/{total}: {round_pairs}")
        rates: dict[str, dict[str, float]] = {"sendrecv": {}, "tcp": {}}
        for a, b in round_pairs:
            if me["node"] not in (a, b) or me["local_rank"] != 0:
                continue
            peer = b if me["node"] == a else a
            for src, dst in ((a, b), (b, a)):
                if me["node"] == src:
                    dist.send(tiny, leaders[dst])  # untimed: the pair's first message
                    for _ in range(spec["pair_iters"]):
                        dist.send(buf, leaders[dst])
                    _sync(device)
                else:
                    dist.recv(tiny, leaders[src])
                    # Each message timed on its own, the median kept: one stall of a busy
                    # machine in one message is not a slow link; a slow link slows them all.
                    seconds = []
                    for _ in range(spec["pair_iters"]):
                        start = time.perf_counter()
                        dist.recv(buf, leaders[src])
                        _sync(device)
                        seconds.append(time.perf_counter() - start)
                    rate = buf.numel() * ELEMENT / statistics.median(seconds)
                    rates["sendrecv"][f"{src}>{dst}"] = rate
                if address[peer][0] and listener is not None:
                    if me["node"] == src:
                        time.sleep(0.05)  # the receiver is in accept() by then
                        _tcp_send(address[dst], spec["tcp_seconds"])
                    else:
                        rates["tcp"][f"{src}>{dst}"] = _tcp_receive(listener)
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, rates)
        merged: dict[str, dict[str, float]] = {"sendrecv": {}, "tcp": {}}
        for part in gathered:
            for kind in merged:
                merged[kind].update(part[kind])
        _record("pairs", round=[number, total], **merged)
    if listener is not None:
        listener.close()


def sweep(spec: dict, device: torch.device, clock: Clock, where: dict) -> None:
    """Every op at every size that fits its share of the budget, each row recorded; `where`
    names the op and size being measured (for the TIMEOUT line of a hung collective)."""
    n, ops, sizes = dist.get_world_size(), spec["ops"], spec["sizes"]
    end = spec["end"]
    for k, name in enumerate(ops):
        now = clock.now(device)
        op_end = now + (end - now) / (len(ops) - k)  # what earlier ops left goes on
        last: tuple[float, int] | None = None  # (seconds per op, bytes) of the last size
        for i, size in enumerate(sizes):
            now = clock.now(device)
            guess = formulas.estimate(*last, size) if last else 0.0
            if now >= op_end or now + guess * formulas.least_ops(spec["warmup"]) > op_end:
                _say(f"{name}: sizes from {formulas.human(size)} skipped, over the time budget")
                _record("skipped", op=name, bytes=size, reason="time budget")
                break
            where.update(op=name, bytes=size)
            op = Op(name, size, device)
            first = probe(op, device)
            guesses = [formulas.estimate(first, op.bytes, s) for s in sizes[i:]]
            iters = formulas.iters_for(op_end - now - first, guesses, spec["warmup"], spec["iters"])
            warmup = min(spec["warmup"], iters)
            seconds, wrong = time_op(op, iters, warmup, device)
            last = (max(seconds, first), op.bytes)
            algbw = op.bytes / seconds
            row = {
                "op": name,
                "bytes": op.bytes,
                "count": op.bytes // ELEMENT,
                "time_us": seconds * 1e6,
                "algbw": algbw,
                "busbw": algbw * busbw_factor(name, n),
                "wrong": wrong,
                "iters": iters,
            }
            _record("row", **row)
            _say(
                f"{name:<15} {op.bytes:>12} B  {row['time_us']:>12.1f} us  "
                f"busbw {row['busbw'] / 1e9:8.3f} GB/s  wrong {wrong}  ({iters} iters)"
            )
            del op


def main(argv: list[str]) -> int:
    spec = json.loads(base64.b64decode(argv[0]))
    for key in ("end", "pair_end"):  # None: no bound
        spec[key] = float("inf") if spec[key] is None else spec[key]
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if on_gpu else "cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    backend = "nccl" if on_gpu else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=spec["timeout"]))
    n = dist.get_world_size()
    iface = os.environ.get("NCCL_SOCKET_IFNAME" if on_gpu else "GLOO_SOCKET_IFNAME")
    me = {
        "rank": dist.get_rank(),
        "local_rank": local_rank,
        "node": os.environ.get("TRAINFLEET_NODE", socket.gethostname()),
        "iface": iface,
        "address": _iface_address(iface),
        "link_speed": _link_speed(iface),
        "ib": _ib_rates() if local_rank == 0 else {},
        "port": None,
    }
    if local_rank == 0 and me["address"]:
        listener = socket.socket()
        listener.bind((me["address"], 0))
        listener.listen(4)
        me["port"] = listener.getsockname()[1]
    everyone: list = [None] * n
    dist.all_gather_object(everyone, me)
    if local_rank == 0 and me["address"]:
        me["listener"] = listener
    _say(f"{n} ranks joined ({backend}); {len(spec['ops'])} op(s) x {len(spec['sizes'])} size(s)")
    _record(
        "start",
        backend=backend,
        world_size=n,
        device=torch.cuda.get_device_name(device) if on_gpu else "cpu",
        ranks=[
            {k: v for k, v in p.items() if k != "port"} for p in everyone if not p["local_rank"]
        ],
    )
    where = {"op": "pairs", "bytes": spec["pair_bytes"]}
    try:
        clock = Clock()
        if spec["rounds"]:
            pairs(spec, me, everyone, device, clock)
        sweep(spec, device, clock, where)
    except RuntimeError as exc:
        if "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
            print(
                f"commtest: TIMEOUT op={where['op']} bytes={where['bytes']} rank={dist.get_rank()} "
                f"after {spec['timeout']} s: {str(exc).splitlines()[0][:200]}",
                file=sys.stderr,
                flush=True,
            )
            return 124
        raise
    _record("end", seconds=clock.now(device))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
