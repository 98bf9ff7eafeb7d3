"""A node's fact sheet (the probe's JSON), parsed once at collection into frozen, typed values.

    >>> sheet = {"probe_version": PROBE_VERSION, "hostname": "gpu-node-1",
    ...          "gpus": {"devices": [{"index": 0, "name": "H100", "memory_mib": 81559}]},
    ...          "shm": "64G", "tools": ["ninja"]}
    >>> facts = parse_fact_sheet(sheet, node="gpu-node-1")
    >>> facts.hostname, facts.gpus.devices[0].memory_mib, facts.shm.total, facts.tools
    ('gpu-node-1', 81559, None, {})
    >>> parse_fact_sheet({"probe_version": 0}, node="gpu-node-2")
    Traceback (most recent call last):
    ...
    trainfleet.doctor.facts.FactSheetError: gpu-node-2 answered with a probe version 0 ...

What a node sends back is untrusted input (a node can be broken or hostile): a value of the
wrong type, or a key that is missing, becomes "unknown" (None, an empty tuple or mapping, a
default object) here, so that no check raises on it deep inside. Only the probe's version is
refused: a sheet from another probe means something else by its fields. Strings are checked
for their type only; the code that puts one in a file or a command validates it there
(`trainfleet.untrusted`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from trainfleet.errors import TrainfleetError
from trainfleet.probe import PROBE_VERSION

T = TypeVar("T")


class FactSheetError(TrainfleetError):
    """A node's answer is no fact sheet this trainfleet can read (none, or another version)."""


# ----------------------------------------------------------------------------- the types


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolution:
    """`getaddrinfo(name)` on the node: its addresses, or the error."""

    addresses: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Interface:
    """One network interface, as `ip -j addr` lists it (addresses as CIDR strings)."""

    name: str
    state: str | None = None
    up: bool = False
    mtu: int | None = None
    link_type: str | None = None
    bridge: bool = False
    ipv4: tuple[str, ...] = ()
    ipv6: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """`ip route get MASTER_ADDR` on the node."""

    dev: str | None = None
    src: str | None = None
    gateway: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientName:
    """The master's reverse lookup of a client's IPv4-mapped address (c10d's store)."""

    name: str | None = None
    error: str | None = None
    seconds: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Listener:
    """A listening TCP socket; pid and command only for the ports the probe was asked about."""

    addr: str | None = None
    port: int | None = None
    pid: int | None = None
    cmd: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandOutput:
    """A firewall tool's answer: exit status and (tail of) its output."""

    rc: int | None = None
    out: str = ""
    err: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Firewall:
    """Each firewall tool found on the node (None: not installed, or unknown)."""

    iptables: CommandOutput | None = None
    nft: CommandOutput | None = None
    ufw: CommandOutput | None = None
    firewalld: CommandOutput | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Soft rlimits of the probe's process; None: unlimited (or unknown)."""

    memlock: int | None = None
    nofile: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Disk:
    """statvfs of a path, in bytes."""

    total: int | None = None
    free: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """/proc/meminfo, in bytes."""

    total: int | None = None
    available: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Workdir:
    path: str | None = None
    exists: bool | None = None
    disk: Disk = field(default_factory=Disk)


@dataclass(frozen=True, slots=True, kw_only=True)
class Python:
    executable: str | None = None
    version: str | None = None
    """"3.11.4"."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Packages:
    """Installed versions from the dist-info metadata (no imports); None: not installed."""

    torch: str | None = None
    deepspeed: str | None = None
    transformers: str | None = None
    accelerate: str | None = None
    datasets: str | None = None
    peft: str | None = None
    nccl_wheel: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Imports:
    """What importing the training stack in the node's python reported (full probe only)."""

    torch: str | None = None
    torch_cuda: str | None = None
    nccl: str | None = None
    torch_distributed: bool | None = None
    gloo: bool | None = None
    deepspeed: str | None = None
    transformers: str | None = None
    accelerate: str | None = None
    torch_error: str | None = None
    import_error: str | None = None
    """The import subprocess itself failed (its last stderr line)."""
    skipped: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    index: int | None = None
    name: str | None = None
    memory_mib: int | None = None
    driver: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProcess:
    """A compute process on a GPU, as nvidia-smi's CSV gives it (text fields)."""

    pid: str | None = None
    name: str | None = None
    used_mib: str | None = None
    gpu: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpus:
    devices: tuple[Gpu, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JitLock:
    """A torch JIT build lock: its path, age and the pids that hold it or work beside it."""

    path: str
    age_s: float
    busy_pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeHash:
    sha256: str | None = None
    files: int | None = None
    truncated: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SshOutcome:
    """This node's `ssh -N` to a peer: rc 0 once authenticated, 124 when the probe stopped it."""

    rc: int
    stderr: str = ""
    seconds: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """Bytes a peer streamed to this node's listener, and over how many seconds."""

    bytes: int
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Active:
    """The tests whose other end is the other nodes' probes."""

    tcp: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """peer -> port -> "open", "refused", "timeout", "no-route" or "error: ..."."""
    tcp_last_attempt: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    ssh: Mapping[str, SshOutcome] = field(default_factory=dict)
    listen: Mapping[str, str] = field(default_factory=dict)
    """port -> "listening" or "bind failed: ..."."""
    listen_since: float | None = None
    listen_until: float | None = None
    token: str | None = None
    """"written", "not written: ..."; None when none was asked for."""
    shared: Mapping[str, bool] = field(default_factory=dict)
    """peer -> whether its token is seen in this node's workdir (shared storage)."""
    bandwidth_send: str | None = None
    bandwidth_in: Mapping[str, Transfer] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeFacts:
    """One node's fact sheet. Every field may be unknown (None, empty): checks judge only what
    the node reported."""

    probe_version: int = PROBE_VERSION
    node: str | None = None
    pid: int | None = None
    time: float | None = None
    """The node's clock when the probe ran."""
    seconds: float | None = None
    """How long the probe took."""
    hostname: str | None = None
    fqdn: str | None = None
    resolve: Mapping[str, Resolution] = field(default_factory=dict)
    """The node's own name and the master's name, as the node resolves them."""
    interfaces: tuple[Interface, ...] | None = None
    """None: the probe could not list them."""
    route_to_master: Route | None = None
    client_names: Mapping[str, ClientName] = field(default_factory=dict)
    listening: tuple[Listener, ...] = ()
    firewall: Firewall = field(default_factory=Firewall)
    ipv6_disabled: str | None = None
    port_range: str | None = None
    limits: Limits = field(default_factory=Limits)
    shm: Disk = field(default_factory=Disk)
    memory: Memory = field(default_factory=Memory)
    workdir: Workdir = field(default_factory=Workdir)
    python: Python = field(default_factory=Python)
    packages: Packages = field(default_factory=Packages)
    imports: Imports | None = None
    """None: not imported (quick probe) or unknown."""
    tools: Mapping[str, str | None] = field(default_factory=dict)
    """Tool -> its path on the non-interactive PATH, None when missing there."""
    path: str = ""
    """The non-interactive PATH."""
    cuda_home: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """The node's NCCL_*, GLOO_*, MASTER_*, ... variables."""
    gpus: Gpus | None = None
    """None: no nvidia-smi."""
    infiniband: tuple[str, ...] = ()
    """InfiniBand device names."""
    jit_locks: tuple[JitLock, ...] = ()
    code: CodeHash | None = None
    active: Active = field(default_factory=Active)


# ----------------------------------------------------------------------------- parsing


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if number else None


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _strs(value: object) -> tuple[str, ...]:
    return tuple(item for item in _list(value) if isinstance(item, str))


def _map(value: object, parse: Callable[[object], T | None]) -> dict[str, T]:
    """The entries of a JSON object whose value parses; the others are unknown (left out)."""
    parsed = {key: parse(item) for key, item in _dict(value).items() if isinstance(key, str)}
    return {key: item for key, item in parsed.items() if item is not None}


def _items(value: object, parse: Callable[[dict], T | None]) -> tuple[T, ...]:
    """The entries of a JSON list that are objects and parse."""
    parsed = (parse(item) for item in _list(value) if isinstance(item, dict))
    return tuple(item for item in parsed if item is not None)


def _resolution(raw: object) -> Resolution | None:
    if not isinstance(raw, dict):
        return None
    return Resolution(addresses=_strs(raw.get("addresses")), error=_str(raw.get("error")))


def _interface(raw: dict) -> Interface | None:
    name = _str(raw.get("name"))
    if name is None:
        return None
    return Interface(
        name=name,
        state=_str(raw.get("state")),
        up=raw.get("up") is True,
        mtu=_int(raw.get("mtu")),
        link_type=_str(raw.get("link_type")),
        bridge=raw.get("bridge") is True,
        ipv4=_strs(raw.get("ipv4")),
        ipv6=_strs(raw.get("ipv6")),
    )


def _interfaces(raw: object) -> tuple[Interface, ...] | None:
    return _items(raw, _interface) if isinstance(raw, list) else None


def _route(raw: object) -> Route | None:
    if not isinstance(raw, dict):
        return None
    return Route(
        dev=_str(raw.get("dev")),
        src=_str(raw.get("src")),
        gateway=_str(raw.get("gateway")),
        error=_str(raw.get("error")),
    )


def _client_name(raw: object) -> ClientName | None:
    if not isinstance(raw, dict):
        return None
    return ClientName(
        name=_str(raw.get("name")), error=_str(raw.get("error")), seconds=_float(raw.get("seconds"))
    )


def _listener(raw: dict) -> Listener:
    return Listener(
        addr=_str(raw.get("addr")),
        port=_int(raw.get("port")),
        pid=_int(raw.get("pid")),
        cmd=_str(raw.get("cmd")),
    )


def _command_output(raw: object) -> CommandOutput | None:
    if not isinstance(raw, dict):
        return None
    return CommandOutput(
        rc=_int(raw.get("rc")), out=_str(raw.get("out")) or "", err=_str(raw.get("err")) or ""
    )


def _firewall(raw: object) -> Firewall:
    raw = _dict(raw)
    return Firewall(
        iptables=_command_output(raw.get("iptables")),
        nft=_command_output(raw.get("nft")),
        ufw=_command_output(raw.get("ufw")),
        firewalld=_command_output(raw.get("firewalld")),
    )


def _disk(raw: object) -> Disk:
    raw = _dict(raw)
    total, free, error = _int(raw.get("total")), _int(raw.get("free")), _str(raw.get("error"))
    return Disk(total=total, free=free, error=error)


def _workdir(raw: object) -> Workdir:
    raw = _dict(raw)
    return Workdir(
        path=_str(raw.get("path")), exists=_bool(raw.get("exists")), disk=_disk(raw.get("disk"))
    )


def _packages(raw: object) -> Packages:
    raw = _dict(raw)
    return Packages(**{name: _str(raw.get(name)) for name in Packages.__dataclass_fields__})


def _imports(raw: object) -> Imports | None:
    if not isinstance(raw, dict):
        return None
    flags = ("torch_distributed", "gloo")
    return Imports(
        **{
            name: (_bool if name in flags else _str)(raw.get(name))
            for name in Imports.__dataclass_fields__
        }
    )


def _gpu(raw: dict) -> Gpu:
    return Gpu(
        index=_int(raw.get("index")),
        name=_str(raw.get("name")),
        memory_mib=_int(raw.get("memory_mib")),
        driver=_str(raw.get("driver")),
    )


def _gpu_process(raw: dict) -> GpuProcess:
    return GpuProcess(**{name: _str(raw.get(name)) for name in GpuProcess.__dataclass_fields__})


def _gpus(raw: object) -> Gpus | None:
    if not isinstance(raw, dict):
        return None
    return Gpus(
        devices=_items(raw.get("devices"), _gpu),
        processes=_items(raw.get("processes"), _gpu_process),
        error=_str(raw.get("error")),
    )


def _jit_lock(raw: dict) -> JitLock | None:
    """A lock report with a path, an age and a list of pids; any other is unknown (dropped),
    not judged: a lock whose holders are unreadable must not look free to remove."""
    path, age, pids = _str(raw.get("path")), _float(raw.get("age_s")), raw.get("busy_pids")
    if path is None or age is None or not isinstance(pids, list):
        return None
    if any(_int(pid) is None for pid in pids):
        return None
    return JitLock(path=path, age_s=age, busy_pids=tuple(pids))


def _code(raw: object) -> CodeHash | None:
    if not isinstance(raw, dict):
        return None
    return CodeHash(
        sha256=_str(raw.get("sha256")),
        files=_int(raw.get("files")),
        truncated=raw.get("truncated") is True,
    )


def _ssh_outcome(raw: object) -> SshOutcome | None:
    """An outcome without an exit status is unknown (left out), not a failed ssh."""
    rc = _int(_dict(raw).get("rc"))
    if rc is None:
        return None
    return SshOutcome(
        rc=rc,
        stderr=_str(raw.get("stderr")) or "",
        seconds=_float(raw.get("seconds")),
    )


def _transfer(raw: object) -> Transfer | None:
    raw = _dict(raw)
    size, seconds = _int(raw.get("bytes")), _float(raw.get("seconds"))
    return None if size is None or seconds is None else Transfer(bytes=size, seconds=seconds)


def _active(raw: object) -> Active:
    raw = _dict(raw)
    return Active(
        tcp=_map(raw.get("tcp"), lambda ports: _map(ports, _str)),
        tcp_last_attempt=_map(raw.get("tcp_last_attempt"), lambda ports: _map(ports, _float)),
        ssh=_map(raw.get("ssh"), _ssh_outcome),
        listen=_map(raw.get("listen"), _str),
        listen_since=_float(raw.get("listen_since")),
        listen_until=_float(raw.get("listen_until")),
        token=_str(raw.get("token")),
        shared=_map(raw.get("shared"), _bool),
        bandwidth_send=_str(raw.get("bandwidth_send")),
        bandwidth_in=_map(raw.get("bandwidth_in"), _transfer),
    )


def parse_fact_sheet(sheet: Any, *, node: str) -> NodeFacts:
    """`sheet` (the probe's JSON object, decoded) as NodeFacts; raises FactSheetError, naming
    `node`, when it is not an object or comes from another probe version."""
    if not isinstance(sheet, dict):
        raise FactSheetError(
            f"{node} answered with {type(sheet).__name__} JSON, not a fact sheet",
            f"check what `{node}`'s python prints for trainfleet's probe",
        )
    version = sheet.get("probe_version")
    if _int(version) != PROBE_VERSION:
        raise FactSheetError(
            f"{node} answered with a probe version {str(version)[:20]} fact sheet, this "
            f"trainfleet reads version {PROBE_VERSION}",
            f"run the probe this trainfleet sends: check that nothing on {node} (a wrapper "
            "around its python, a sitecustomize) answers in its place",
        )
    memory = _dict(sheet.get("memory"))
    python = _dict(sheet.get("python"))
    limits = _dict(sheet.get("limits"))
    return NodeFacts(
        probe_version=PROBE_VERSION,
        node=_str(sheet.get("node")),
        pid=_int(sheet.get("pid")),
        time=_float(sheet.get("time")),
        seconds=_float(sheet.get("seconds")),
        hostname=_str(sheet.get("hostname")),
        fqdn=_str(sheet.get("fqdn")),
        resolve=_map(sheet.get("resolve"), _resolution),
        interfaces=_interfaces(sheet.get("interfaces")),
        route_to_master=_route(sheet.get("route_to_master")),
        client_names=_map(sheet.get("client_names"), _client_name),
        listening=_items(sheet.get("listening"), _listener),
        firewall=_firewall(sheet.get("firewall")),
        ipv6_disabled=_str(sheet.get("ipv6_disabled")),
        port_range=_str(sheet.get("port_range")),
        limits=Limits(memlock=_int(limits.get("memlock")), nofile=_int(limits.get("nofile"))),
        shm=_disk(sheet.get("shm")),
        memory=Memory(
            total=_int(memory.get("MemTotal")), available=_int(memory.get("MemAvailable"))
        ),
        workdir=_workdir(sheet.get("workdir")),
        python=Python(
            executable=_str(python.get("executable")), version=_str(python.get("version"))
        ),
        packages=_packages(sheet.get("packages")),
        imports=_imports(sheet.get("imports")),
        tools={
            tool: where
            for tool, where in _dict(sheet.get("tools")).items()
            if where is None or isinstance(where, str)
        },
        path=_str(sheet.get("path")) or "",
        cuda_home=_str(sheet.get("cuda_home")),
        env=_map(sheet.get("env"), _str),
        gpus=_gpus(sheet.get("gpus")),
        infiniband=tuple(_dict(sheet.get("infiniband"))),
        jit_locks=_items(sheet.get("jit_locks"), _jit_lock),
        code=_code(sheet.get("code")),
        active=_active(sheet.get("active")),
    )


def read_fact_sheet(stdout: str, *, node: str) -> NodeFacts:
    """The probe's output (its last JSON line) as NodeFacts; FactSheetError when there is none
    or it is not one this trainfleet reads."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                sheet = json.loads(line)
            except ValueError:
                break
            return parse_fact_sheet(sheet, node=node)
    raise FactSheetError(
        f"{node}'s probe printed no fact sheet",
        f"see what answers on {node} (`trainfleet exec -- python3 --version`): a wrapper or a "
        "profile script may print in the probe's place",
    )
