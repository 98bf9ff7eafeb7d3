"""Run one argv on many nodes at once through the system OpenSSH client; results as data.

    >>> from trainfleet.cluster import load_cluster
    >>> from trainfleet.remote import run_on_nodes
    >>> [r.stdout for r in run_on_nodes(load_cluster().nodes, ["echo", "hi"])]
    ['hi\\n']

System `ssh`, not a Python SSH stack, so ~/.ssh/config aliases, agents, jump hosts and
HostKeyAlgorithms behave exactly as `ssh host` does. Every node gets its own process at the same
moment (asyncio, no per-node serial step); connections are reused through ControlMaster.
A node that is this machine (`localhost`) runs the argv directly. Failures are classified into
the `Failure` classes that doctor turns into findings (docs/findings.md).
"""

from __future__ import annotations

import asyncio
import enum
import os
import shlex
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainfleet.catalog import FindingId
from trainfleet.cluster import DEFAULT_CONNECT_TIMEOUT, Node, SshOptions
from trainfleet.errors import RemoteError

CONTROL_PERSIST_S = 60
"""How long an idle shared connection stays open for the next command."""

_DRAIN_AFTER_EXIT_S = 2.0
"""After ssh exits, how long to wait for its pipes to close (a background child may hold them)."""


class Failure(enum.Enum):
    """Why a node's command did not succeed; `pitfall_id` is the finding id it maps to."""

    NONE = "ok"
    REFUSED = "unreachable: connection refused"
    CONNECT_TIMEOUT = "unreachable: connect timed out"
    NO_ROUTE = "unreachable: no route to host"
    DNS = "unreachable: name does not resolve"
    SSH_ERROR = "unreachable: ssh failed"
    AUTH = "auth failed"
    HOSTKEY_UNKNOWN = "host key unknown"
    HOSTKEY_CHANGED = "host key changed"
    HOSTKEY_ALGO = "no common host key algorithm"
    TIMED_OUT = "timed out"
    COMMAND_FAILED = "command failed"

    @property
    def pitfall_id(self) -> FindingId | None:
        return _PITFALL_IDS.get(self)

    def fix(self, host: str) -> str:
        """What to do about it on `host`; empty for NONE and COMMAND_FAILED."""
        return _FIXES.get(self, "").format(host=host)

    @property
    def is_connection_failure(self) -> bool:
        """The command never ran (or the connection broke): nothing is known of the node."""
        return self not in (Failure.NONE, Failure.COMMAND_FAILED, Failure.TIMED_OUT)


_PITFALL_IDS = {
    Failure.REFUSED: FindingId.SSH_UNREACHABLE,
    Failure.CONNECT_TIMEOUT: FindingId.SSH_UNREACHABLE,
    Failure.NO_ROUTE: FindingId.SSH_UNREACHABLE,
    Failure.DNS: FindingId.HOSTNAME_UNRESOLVABLE,
    Failure.SSH_ERROR: FindingId.SSH_UNREACHABLE,
    Failure.AUTH: FindingId.SSH_AUTH_FAILED,
    Failure.HOSTKEY_UNKNOWN: FindingId.SSH_HOSTKEY_UNKNOWN,
    Failure.HOSTKEY_CHANGED: FindingId.SSH_HOSTKEY_CHANGED,
    Failure.HOSTKEY_ALGO: FindingId.SSH_HOSTKEY_ALGO,
}

_FIXES = {
    Failure.REFUSED: "nothing listens on {host}'s ssh port: start sshd there, or fix the port",
    Failure.CONNECT_TIMEOUT: "check {host}'s address, that it is up, and that a firewall "
    "lets port 22 through",
    Failure.NO_ROUTE: "check {host}'s address and that it is up and on this network",
    Failure.DNS: "add {host} to /etc/hosts or ~/.ssh/config (HostName), or use its address",
    Failure.SSH_ERROR: "run `ssh -v {host} true` to see where the connection stops",
    Failure.AUTH: "`ssh-copy-id {host}` from the machine that connects (or add its public key "
    "to {host}'s ~/.ssh/authorized_keys)",
    Failure.HOSTKEY_UNKNOWN: "check its fingerprint (`ssh-keyscan {host} | ssh-keygen -lf -`), "
    "then `ssh-keyscan {host} >> ~/.ssh/known_hosts`",
    Failure.HOSTKEY_CHANGED: "if {host} was reinstalled, confirm its new fingerprint, then "
    "`ssh-keygen -R {host}`",
    Failure.HOSTKEY_ALGO: "add `HostKeyAlgorithms +ssh-rsa` for {host} in ~/.ssh/config, "
    "or give the node new host keys",
    Failure.TIMED_OUT: "the command ran longer than --timeout; raise it or check {host}",
}

# ssh's own messages, first match wins (the hostkey-changed banner comes with
# "Host key verification failed", so it is tested first).
_SSH_PATTERNS: tuple[tuple[str, Failure], ...] = (
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", Failure.HOSTKEY_CHANGED),
    ("no matching host key type found", Failure.HOSTKEY_ALGO),
    ("Host key verification failed", Failure.HOSTKEY_UNKNOWN),
    ("No ED25519 host key is known", Failure.HOSTKEY_UNKNOWN),
    ("host key is known for", Failure.HOSTKEY_UNKNOWN),
    ("Permission denied", Failure.AUTH),
    ("Too many authentication failures", Failure.AUTH),
    ("Connection refused", Failure.REFUSED),
    ("Connection timed out", Failure.CONNECT_TIMEOUT),
    ("Operation timed out", Failure.CONNECT_TIMEOUT),
    ("No route to host", Failure.NO_ROUTE),
    ("Network is unreachable", Failure.NO_ROUTE),
    ("Could not resolve hostname", Failure.DNS),
    ("Name or service not known", Failure.DNS),
    ("Temporary failure in name resolution", Failure.DNS),
)


def classify(returncode: int | None, stderr: str, timed_out: bool, via_ssh: bool) -> Failure:
    """Map an exit status and stderr to a Failure class."""
    if timed_out:
        return Failure.TIMED_OUT
    if returncode == 0:
        return Failure.NONE
    if via_ssh and returncode == 255:
        for needle, failure in _SSH_PATTERNS:
            if needle in stderr:
                return failure
        return Failure.SSH_ERROR
    return Failure.COMMAND_FAILED


@dataclass(kw_only=True, slots=True)
class NodeResult:
    """What one node did with the command."""

    node: str
    returncode: int | None
    """Exit status; None when it was killed for the timeout."""
    stdout: str
    stderr: str
    duration_s: float
    failure: Failure

    @property
    def ok(self) -> bool:
        return self.failure is Failure.NONE

    def reason(self) -> str:
        """One line: the class and ssh's last stderr line, e.g. for the exec summary."""
        detail = self.stderr.strip().splitlines()[-1] if self.stderr.strip() else ""
        if self.failure is Failure.COMMAND_FAILED:
            return f"exit {self.returncode}" + (f": {detail}" if detail else "")
        return self.failure.value + (f" ({detail})" if detail else "")

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "returncode": self.returncode,
            "failure": self.failure.name.lower(),
            "pitfall_id": self.failure.pitfall_id and self.failure.pitfall_id.value,
            "fix": self.failure.fix(self.node),
            "duration_s": round(self.duration_s, 3),
            "stdout": self.stdout,
            "stderr": self.stderr,
        }


# ----------------------------------------------------------------------------- argv building


def control_dir() -> Path:
    """Where shared-connection sockets live; short (sun_path is ~108 bytes) and private."""
    path = Path(os.environ.get("TRAINFLEET_CONTROL_DIR", f"/tmp/trainfleet-{os.getuid()}-ssh"))
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The name is predictable: one another user made first (or a link) would put this user's
    # ssh connections into their hands. OpenSSH refuses such a directory too, less clearly.
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RemoteError(
            f"{path} (ssh's shared connections) is not this user's private directory"
            f" (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})",
            "remove it (another user may have made it), or set TRAINFLEET_CONTROL_DIR to a"
            " directory only you can write",
        )
    return path


def ssh_options(ssh: SshOptions, *, multiplex: bool = True) -> list[str]:
    """The options of every ssh trainfleet runs (no `ssh`, no host). User options first:
    OpenSSH keeps the first value it sees for an option, so the user's settings win over
    trainfleet's defaults."""
    argv = []
    if ssh.config_file:
        argv += ["-F", ssh.config_file]
    argv += list(ssh.options)
    if ssh.identity_file:
        argv += ["-i", ssh.identity_file]
    if ssh.known_hosts_file:
        argv += ["-o", f"UserKnownHostsFile={ssh.known_hosts_file}"]
    if ssh.port is not None:
        argv += ["-p", str(ssh.port)]
    if ssh.user is not None:
        argv += ["-l", ssh.user]
    argv += [
        # Never prompt: a password or host-key question would hang a parallel run silently.
        "-oBatchMode=yes",
        # A dead or firewalled node is reported in seconds, not after the kernel's 2 minutes.
        f"-oConnectTimeout={ssh.connect_timeout or DEFAULT_CONNECT_TIMEOUT}",
        # A node that dies mid-command is noticed within 15 s.
        "-oServerAliveInterval=5",
        "-oServerAliveCountMax=3",
        # No terminal: output stays byte-exact and the remote side gets no job-control signals.
        "-T",
    ]
    if multiplex:
        argv += [
            # Reuse one connection per node: the handshake is paid once, not per command.
            "-oControlMaster=auto",
            f"-oControlPath={control_dir()}/%C",
            f"-oControlPersist={CONTROL_PERSIST_S}",
        ]
    return argv


def ssh_base_argv(host: str, ssh: SshOptions, *, multiplex: bool = True) -> list[str]:
    """`ssh ... host` without the remote command."""
    return ["ssh", *ssh_options(ssh, multiplex=multiplex), "--", host]


def node_argv(node: Node, argv: Sequence[str], *, multiplex: bool = True) -> list[str]:
    """The local argv that runs `argv` on `node`: argv itself for this machine, ssh otherwise.

    ssh hands the remote shell one string, so each word is quoted: the remote side runs exactly
    `argv`, whatever characters it holds.
    """
    if not argv:
        raise RemoteError("empty command", "give the command to run after `--`")
    if node.is_local:
        return list(argv)
    return [*ssh_base_argv(node.host, node.ssh, multiplex=multiplex), shlex.join(argv)]


# ----------------------------------------------------------------------------- running

LineCallback = Callable[[str, str, str], None]
"""on_line(node, stream, line): stream is 'stdout' or 'stderr'; line has no trailing newline."""


_READ_CHUNK = 1 << 16


async def _pump(
    stream: asyncio.StreamReader,
    sink: bytearray,
    node: str,
    name: str,
    on_line: LineCallback | None,
) -> None:
    """Read a stream to EOF in chunks (no line-length limit); hand complete lines to on_line."""
    pending = b""
    while chunk := await stream.read(_READ_CHUNK):
        sink += chunk
        if on_line is not None:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                on_line(node, name, raw.decode("utf-8", errors="replace"))
    if on_line is not None and pending:
        on_line(node, name, pending.decode("utf-8", errors="replace"))


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
    pumps = [
        asyncio.ensure_future(_pump(proc.stdout, out, node.host, "stdout", on_line)),
        asyncio.ensure_future(_pump(proc.stderr, err, node.host, "stderr", on_line)),
    ]
    if stdin is not None:
        try:
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the command exited (or ssh failed) before reading it all; its status says why
        proc.stdin.close()
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        timed_out = True
        _kill_group(proc)
        await proc.wait()
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
        failure=classify(proc.returncode, stderr, timed_out, via_ssh=not node.is_local),
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
) -> list[NodeResult]:
    """Run `argv` on every node at once; results in the order of `nodes`.

    `argv` and `stdin` may be mappings from node host to that node's own value.
    """
    if any(not node.is_local for node in nodes) and shutil.which("ssh") is None:
        raise RemoteError("no `ssh` client on this machine", "install openssh-client")
    per_argv = argv if isinstance(argv, Mapping) else {n.host: argv for n in nodes}
    per_stdin = stdin if isinstance(stdin, Mapping) else {n.host: stdin for n in nodes}
    return list(
        await asyncio.gather(
            *(
                _run_one(node, per_argv[node.host], per_stdin[node.host], timeout, on_line)
                for node in nodes
            )
        )
    )


def run_on_nodes(
    nodes: Sequence[Node],
    argv: Sequence[str] | PerNode,
    *,
    stdin: bytes | Mapping[str, bytes] | None = None,
    timeout: float | None = None,
    on_line: LineCallback | None = None,
) -> list[NodeResult]:
    """Synchronous `run_on_nodes_async`: run `argv` on every node at once.

    `stdin` is sent to each node (how the probe travels); `timeout` bounds each node's run,
    connect included; `on_line` sees output lines as they arrive.
    """
    return asyncio.run(
        run_on_nodes_async(nodes, argv, stdin=stdin, timeout=timeout, on_line=on_line)
    )


async def _ssh_hostname(node: Node) -> str:
    if node.is_local:
        return "127.0.0.1" if node.host == "localhost" else node.host
    proc = await asyncio.create_subprocess_exec(
        "ssh",
        *ssh_options(node.ssh, multiplex=False),
        "-G",
        "--",
        node.host,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await proc.communicate()
    for line in out.decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value:
            return value.strip()
    return node.host


def ssh_hostnames(nodes: Sequence[Node]) -> dict[str, str]:
    """The name or address ssh really connects to for each node (`ssh -G`: HostName from the
    ssh config applied); no connection is made."""

    async def _all() -> list[str]:
        return list(await asyncio.gather(*(_ssh_hostname(n) for n in nodes)))

    return dict(zip((n.host for n in nodes), asyncio.run(_all()), strict=True))


def close_connections(nodes: Sequence[Node]) -> None:
    """Ask the shared ssh connections to these nodes to exit (`ssh -O exit`), all at once."""
    procs = [
        subprocess.Popen(
            ["ssh", *ssh_options(node.ssh), "-O", "exit", "--", node.host],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for node in nodes
        if not node.is_local
    ]
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


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
