"""`setup pyenv`'s last part: DeepSpeed's JIT-built ops, built on one node during setup and
copied to the others, instead of compiled on every node at the first launch.

    >>> said = '{"root": "/home/u/.cache/torch_extensions/py311_cpu", "ops": {"fused_adam": "old"}}'
    >>> parse_state("@@trainfleet-answer " + said, ("fused_adam",), node="n1").todo
    ['fused_adam']
    >>> chosen("fused_adam,cpu_adam", {"deepspeed"}, cpu_torch=False)
    ('fused_adam', 'cpu_adam')

At its first start a DeepSpeed rank compiles the ops it uses (`trainfleet.node.dsops`):
minutes on every node, with nothing on screen, and a node that lacks a compiler or ninja
fails there and only there (seed 004's "Ninja is required" on the remote nodes). Here each
node says which ops are current for the environment; the first node in the cluster's order
that needs them builds them, and its build directories go to the other nodes that need them,
where ninja, run through DeepSpeed's builder, checks them: identical nodes (same paths, flags
and GPU architectures, files not newer) take the copy as it is, any other builds its own. A
build that fails names the node, the op and the compiler's words.

The copy is native code that every receiving node's ranks load, so its source must be trusted:
it is always the node this run built on, chosen here, never a node that reports its own ops
current (a report is the node's own word; a node that has them keeps them, and gives them to no
one). The copy travels through this machine and is unpacked into a private directory without
owners or setuid/setgid/sticky bits; a symlink, device or fifo in it makes the node take none
of it (`trainfleet.node.files.take_staged`).

The default ops are those a ZeRO run with an `optimizer` section (HF Trainer's and train's
DeepSpeed configs) builds: fused_adam, plus the CPU accelerator's shared-memory comm when
torch has no GPU support (the sandboxes). `--ds-ops none` leaves them to the first launch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType

from trainfleet import node as node_programs
from trainfleet.cluster import Cluster, Node
from trainfleet.errors import NodeAnswerError, SetupError
from trainfleet.node import dsops as node_dsops
from trainfleet.node import files
from trainfleet.node.dsops import cuda_tag
from trainfleet.nodeset import fold_names
from trainfleet.remote import run_on_nodes
from trainfleet.remote.argv import node_argv
from trainfleet.setup.result import SetupResult
from trainfleet.setup.sync.transfer import COPY_TIMEOUT_S, STAGE_PREFIX, stream_tar
from trainfleet.untrusted import printable

DEFAULT_OPS = ("fused_adam",)
CPU_OPS = ("deepspeed_shm_comm",)
"""Built by DeepSpeed's CPU accelerator when the process group starts (`comm/torch.py`)."""

STATES = ("current", "prebuilt", "missing", "stale")
RESULTS = ("built", "current", "prebuilt", "incompatible", "unknown", "failed")
_OP = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,60}")
_PATH = re.compile(r"/[A-Za-z0-9_./+,=@%~-]{0,4000}")

ArgvFor = Callable[[ModuleType], list[str]]
"""node module -> the argv that runs that node program with the target environment's python."""


def torch_is_cpu_only() -> bool:
    """This machine's torch has no CUDA or ROCm build (read from torch/version.py, no import)."""
    try:
        text = metadata.distribution("torch").locate_file("torch/version.py").read_text()
    except (metadata.PackageNotFoundError, OSError):
        return False
    return cuda_tag(text) == "cpu"


def chosen(requested: str | None, installed: set[str], *, cpu_torch: bool) -> tuple[str, ...]:
    """The ops to build: `requested` (comma-separated names, 'none', or None/'auto' for the
    defaults); none when deepspeed is not among the `installed` package names."""
    if "deepspeed" not in installed or requested == "none":
        return ()
    if requested in (None, "", "auto"):
        return DEFAULT_OPS + (CPU_OPS if cpu_torch else ())
    names = tuple(dict.fromkeys(n.strip() for n in requested.split(",") if n.strip()))
    if bad := [n for n in names if not _OP.fullmatch(n)]:
        raise SetupError(
            f"--ds-ops: {printable(bad[0])!r} is not an op name",
            "name DeepSpeed's ops as its builders do: fused_adam,cpu_adam",
        )
    return names


@dataclass(kw_only=True, slots=True)
class OpsState:
    """What a node's `dsops state` reported, checked (a node's words are untrusted)."""

    root: str | None
    """torch's extensions directory there (None: no torch yet)."""
    ops: dict[str, str] = field(default_factory=dict)

    @property
    def todo(self) -> list[str]:
        return [name for name, state in self.ops.items() if state not in ("current", "prebuilt")]


def parse_state(stdout: str, wanted: Sequence[str], *, node: str) -> OpsState:
    """`node_dsops.state`'s answer, checked; ValueError saying what is wrong with it."""
    try:
        raw = node_programs.read_answer(stdout, node_dsops.OpsState, node=node)
    except NodeAnswerError as exc:
        raise ValueError(exc.problem) from None
    root = raw["root"]
    if root is not None and not (isinstance(root, str) and _PATH.fullmatch(root)):
        raise ValueError(f"extensions directory {printable(str(root))!r}")
    states = raw["ops"] if isinstance(raw["ops"], dict) else {}
    ops = {n: states[n] if states.get(n) in STATES else "missing" for n in wanted}
    return OpsState(root=root, ops=ops)


@dataclass(frozen=True, slots=True)
class Built:
    op: str
    result: str
    seconds: float = 0.0
    error: str = ""


def parse_build(stdout: str, wanted: Sequence[str], *, node: str) -> list[Built]:
    """The node's answer per op (`node_dsops.OpBuilt`), in `wanted`'s order; an op it did not
    report counts as failed, every op where one of its answers is malformed."""
    try:
        answers = node_programs.read_answers(stdout, node_dsops.OpBuilt, node=node)
    except NodeAnswerError as exc:
        return [Built(op=n, result="failed", error=f"its answer: {exc.problem}") for n in wanted]
    seen = {}
    for raw in answers:
        if raw["op"] in wanted and raw["result"] in RESULTS:
            seconds = raw["seconds"]
            seen[raw["op"]] = Built(
                op=raw["op"],
                result=raw["result"],
                seconds=float(seconds) if isinstance(seconds, (int, float)) else 0.0,
                error=printable(str(raw["error"] or ""))[-1500:],
            )
    return [seen.get(n) or Built(op=n, result="failed", error="no report") for n in wanted]


def survey(cluster: Cluster, hosts: Sequence[str], argv_for: ArgvFor, target: str,
           ops: Sequence[str], envs: dict[str, dict[str, str]]) -> dict[str, OpsState]:  # fmt: skip
    """{host: its ops' state}; a node that gives no usable answer has all of them to build."""
    nodes = [cluster.node(h) for h in hosts]
    jobs = {h: node_dsops.OpsJob(target=target, ops=list(ops), env=envs[h]) for h in hosts}
    stdin = {h: node_programs.line(node_dsops.state, jobs[h]) for h in hosts}
    found = {}
    for result in run_on_nodes(nodes, argv_for(node_dsops), stdin=stdin, timeout=120):
        try:
            found[result.node] = parse_state(result.stdout, ops, node=result.node)
        except ValueError:
            found[result.node] = OpsState(root=None, ops=dict.fromkeys(ops, "missing"))
    return found


def _build(node: Node, argv_for: ArgvFor, target: str, ops: Sequence[str],
           env: dict[str, str]) -> list[Built]:  # fmt: skip
    stdin = node_programs.line(
        node_dsops.build, node_dsops.OpsJob(target=target, ops=list(ops), env=env)
    )
    [done] = run_on_nodes([node], argv_for(node_dsops), stdin=stdin, timeout=COPY_TIMEOUT_S)
    built = parse_build(done.stdout, ops, node=node.host)
    reported = [b for b in built if b.error != "no report"]
    if not done.ok and not any(b.result == "failed" for b in reported):
        # it died before or between its reports (deepspeed did not import, a timeout): its
        # own last words say why
        tail = [printable(line) for line in done.stderr.splitlines() if line.strip()][-3:]
        missing = next((b.op for b in built if b.error == "no report"), ops[0])
        why = "; ".join(tail) or done.reason()
        built = [*reported, Built(op=missing, result="failed", error=why)]
    return built


def tar_create_argv(root: str, ops: Sequence[str]) -> list[str]:
    """The op directories under `root` as a tar stream, with their times to the nanosecond
    (the POSIX format: a default GNU tar keeps whole seconds, and ninja then finds an output
    older than a source written in the same second). Not torch's lock of a build under way."""
    return ["tar", "--format=posix", "--exclude=lock", "-C", root, "-cf", "-", "--", *ops]


def _copy(source: Node, source_root: str, node: Node, root: str, ops: Sequence[str],
          argv_for: ArgvFor) -> str:  # fmt: skip
    """The build directories of `ops` from source to node, times kept (ninja compares them);
    '' when done. The source must be trusted (its files become native code in every node's
    ranks): `prepare` takes the node it built on. Through this machine (the nodes need no ssh
    to each other), unpacked in a private directory as the node's ssh user, then taken by a
    node program that refuses anything but files and directories (`take_staged`)."""
    create = node_argv(source, tar_create_argv(source_root, ops))
    ended = stream_tar(create, node, root, staged=True)
    if ended.created != 0:
        return f"reading them on {source.host}: {printable(ended.created_err)[-500:]}"
    if ended.extracted != 0:
        return printable(ended.extracted_err)[-500:] or "tar failed"
    stage = (ended.extracted_out.splitlines() or [""])[-1]
    if not re.fullmatch(re.escape(f"{root}/{STAGE_PREFIX}") + "[A-Za-z0-9]+", stage):
        return f"unpacking them printed {printable(stage)[-200:]!r}, not the directory it used"
    job = files.StagedJob(root=root, stage=stage, names=list(ops))
    stdin = node_programs.line(files.take_staged, job)
    [took] = run_on_nodes([node], argv_for(files), stdin=stdin, timeout=120)
    if not took.ok:
        return printable(took.stderr.strip())[-500:] or took.reason()
    return ""


def _failed(host: str, built: list[Built]) -> SetupError | None:
    bad = [b for b in built if b.result == "failed"]
    if not bad:
        return None
    return SetupError(
        f"{host}: DeepSpeed's op {bad[0].op} did not build: {bad[0].error or 'no reason given'}",
        "install what the compiler asks for there (g++, ninja, the CUDA toolkit: set CUDA_HOME "
        "in cluster.yaml's env), then run this again; or pass --ds-ops none to leave the ops to "
        "the first launch",
    )


def _described(built: list[Built], source: str | None = None) -> str | None:
    """What a node got: "built DeepSpeed ops a (60 s), b (27 s)", or, for a copy that ninja
    found current there, "DeepSpeed ops a, b: copied from SOURCE"; None when it got none (all
    of them incompatible there, or unknown to its DeepSpeed)."""
    done = [b for b in built if b.result in ("built", "current")]
    if not done:
        return None
    if source and not any(b.result == "built" for b in done):
        return f"DeepSpeed ops {', '.join(b.op for b in done)}: copied from {source}"
    text = "built DeepSpeed ops " + ", ".join(
        f"{b.op} ({b.seconds:.0f} s)" if b.result == "built" else b.op for b in done
    )
    return text + (f" (the copy from {source} did not fit here)" if source else "")


def prepare(cluster: Cluster, *, argv_for: ArgvFor, target: str, ops: Sequence[str],
            envs: dict[str, dict[str, str]], result: SetupResult,
            say: Callable[[str], None]) -> None:  # fmt: skip
    """Every node ends with `ops` current (or the step fails, naming the node and the op)."""
    hosts = [n.host for n in cluster.nodes]
    states = survey(cluster, hosts, argv_for, target, ops, envs)
    stale = [h for h in hosts if states[h].todo]
    if not stale:
        return
    # The source is the node this run builds on, never one that says its ops are current.
    source, stale = stale[0], stale[1:]
    say(f"building DeepSpeed's ops {', '.join(ops)} on {source} (minutes; once, the other "
        "nodes get a copy)")  # fmt: skip
    built = _build(cluster.node(source), argv_for, target, ops, envs[source])
    if error := _failed(source, built):
        raise error
    for other in built:
        if other.result in ("incompatible", "unknown"):
            result.note(f"DeepSpeed's op {other.op}: {other.result} on {source}, not built")
    if got := _described(built):
        result.add(source, got)
    copied = [b.op for b in built if b.result in ("built", "current")]
    if not stale:
        return
    say(f"copying them from {source} to {fold_names(stale)}; each node's ninja checks them")

    def one(host: str) -> list[Built] | str:
        node, root, source_root = cluster.node(host), states[host].root, states[source].root
        if copied and root and source_root:
            source_node = cluster.node(source)
            if error := _copy(source_node, source_root, node, root, copied, argv_for):
                return error
        return _build(node, argv_for, target, ops, envs[host])

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = dict(zip(stale, pool.map(one, stale), strict=True))
    for host, outcome in outcomes.items():
        if isinstance(outcome, str):
            raise SetupError(
                f"{host}: copying DeepSpeed's ops from {source}: {outcome}",
                f"check the disk and permissions there (and {source}'s build directories, when "
                "it names what the archive holds), then run this again",
            )
        if error := _failed(host, outcome):
            raise error
        if got := _described(outcome, source):
            result.add(host, got)
