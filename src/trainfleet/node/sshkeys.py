"""The one job `setup ssh` runs on each node (and on this machine): keys, known_hosts,
authorized_keys. Shipped like every node program (`trainfleet.node`); `run(job)` sends its
TrustAnswer (`answer.send`).

    >>> parse_ssh_g("hostname 10.0.0.2\\nuserknownhostsfile /h/kh /h/kh2")["userknownhostsfile"]
    ['/h/kh', '/h/kh2']
    >>> pick_identity(None, [], exists=lambda path: False)[1]  # nothing there: create one
    True

A job is a TrustJob, built by `job(**asked)` (what is not asked for is None or empty):

    identity     private key to use (None: what `ssh -G` says, else the first default key that
                 exists, else ~/.ssh/id_ed25519)
    known_hosts  the known_hosts file to use (None: `ssh -G`'s first UserKnownHostsFile)
    ssh_g        argv of `ssh ... -G -- HOST`, built by the launch machine with the node's options
    lookup       names whose known keys to report (`ssh-keygen -F`)
    make_key     create the key when it is missing
    remove       names whose known_hosts entries to drop first (confirmed changed keys only)
    add_known    known_hosts lines to add when missing
    authorize    public keys to add to ~/.ssh/authorized_keys when missing
    dry_run      report what would change, change nothing

The answer (TrustAnswer) says what is there and what changed. Every change only appends,
except `remove`, which `ssh-keygen -R` makes (it keeps FILE.old).
"""

import os
import socket
import subprocess
from typing import Any, Callable, Dict, List, Optional, Tuple, TypedDict, cast

from trainfleet.node import answer

DEFAULT_IDENTITIES = (
    "id_rsa",
    "id_ecdsa",
    "id_ecdsa_sk",
    "id_ed25519",
    "id_ed25519_sk",
    "id_xmss",
    "id_dsa",
)
NEW_KEY = "~/.ssh/id_ed25519"


class TrustJob(TypedDict):
    """`main`'s input; the fields are described in the module's docstring."""

    identity: Optional[str]
    known_hosts: Optional[str]
    ssh_g: Optional[List[str]]
    lookup: List[str]
    make_key: bool
    remove: List[str]
    add_known: List[str]
    authorize: List[str]
    dry_run: bool


class TrustAnswer(TypedDict):
    hostname: str
    uid: int
    identity: str
    key_created: bool
    known_hosts: str
    authorized_keys: str
    pubkey: Optional[str]
    key_missing: bool
    known: Dict[str, List[str]]
    """{name asked in `lookup`: its known keys}."""
    removed: List[str]
    known_added: int
    authorized_added: int


def job(**asked: Any) -> TrustJob:
    """A TrustJob that asks for `asked` and nothing else: the launch side's one builder.

    >>> job(lookup=["gpu-node-1"])["make_key"], job(lookup=["gpu-node-1"])["lookup"]
    (False, ['gpu-node-1'])
    """
    nothing = TrustJob(identity=None, known_hosts=None, ssh_g=None, lookup=[], make_key=False,
                       remove=[], add_known=[], authorize=[], dry_run=False)  # fmt: skip
    unknown = set(asked) - set(nothing)
    if unknown:
        raise TypeError("not a trust job field: %s" % ", ".join(sorted(unknown)))
    # Every key asked is a TrustJob field (checked just above); the values are the caller's.
    return cast(TrustJob, {**nothing, **asked})


def parse_ssh_g(text: str) -> Dict[str, Any]:
    """The settings of `ssh -G` that setup needs: identityfile and userknownhostsfile as lists
    (always there), hostname, port, user, hostkeyalias, proxyjump, proxycommand as str (when
    ssh printed them)."""
    out: Dict[str, Any] = {"identityfile": [], "userknownhostsfile": []}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "identityfile":
            out[key].append(value)
        elif key == "userknownhostsfile":
            out[key] = value.split()
        elif key in ("hostname", "port", "user", "hostkeyalias", "proxyjump", "proxycommand"):
            out[key] = value
    return out


def pick_identity(
    explicit: Optional[str], identityfiles: List[str], exists: Callable[[str], bool]
) -> Tuple[str, bool]:
    """(private key path, True when it has to be created)."""
    if explicit:
        path = os.path.expanduser(explicit)
        return path, not exists(path)
    defaults = ["~/.ssh/" + name for name in DEFAULT_IDENTITIES]
    custom = [f for f in identityfiles if f not in defaults]
    if custom:
        path = os.path.expanduser(custom[0])
        return path, not exists(path)
    for name in defaults:
        path = os.path.expanduser(name)
        if exists(path):
            return path, False
    return os.path.expanduser(NEW_KEY), True


def key_of(line: str) -> Optional[str]:
    """'type base64' of a known_hosts or authorized_keys line (None for comments, markers)."""
    parts = line.split()
    for i in range(len(parts) - 1):
        if parts[i].startswith(("ssh-", "ecdsa-", "sk-")) and len(parts[i + 1]) > 40:
            return parts[i] + " " + parts[i + 1]
    return None


def _run(argv: List[str], stdin: Optional[str] = None) -> Tuple[int, str, str]:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def known_keys(path: str, name: str) -> List[str]:
    """Keys `path` holds for `name` (hashed entries included), as 'type base64'."""
    if not os.path.exists(path):
        return []
    _, out, _ = _run(["ssh-keygen", "-F", name, "-f", path])
    keys: List[str] = []
    for line in out.splitlines():
        if line.startswith(("#", "@")) or not line.strip():
            continue
        key = key_of(line)
        if key and key not in keys:
            keys.append(key)
    return keys


def append_missing(path: str, lines: List[str], dry_run: bool, by_key: bool = False) -> int:
    """Append the lines not in `path` yet (by_key: compare keys only, as authorized_keys lines
    may carry options or another comment); the count appended."""
    old = open(path).read() if os.path.exists(path) else ""

    def ident(line: str) -> str:
        return (key_of(line) or line) if by_key else line

    have = {ident(line) for line in old.splitlines()}
    new: List[str] = []
    for line in lines:
        if ident(line) not in have:
            have.add(ident(line))
            new.append(line)
    if new and not dry_run:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        gap = "\n" if old and not old.endswith("\n") else ""
        with os.fdopen(fd, "a") as f:
            f.write(gap + "".join(line + "\n" for line in new))
    return len(new)


def public_key(private: str) -> Optional[str]:
    pub = private + ".pub"
    if os.path.exists(pub):
        return key_of(open(pub).read())
    code, out, _ = _run(["ssh-keygen", "-y", "-f", private])  # .pub lost: derive it
    return key_of(out) if code == 0 else None


def make_key(private: str) -> None:
    os.makedirs(os.path.dirname(private), mode=0o700, exist_ok=True)
    comment = f"{os.environ.get('USER', '')}@{socket.gethostname()} (trainfleet setup ssh)"
    code, _, err = _run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", private]
    )
    if code != 0:
        raise RuntimeError("ssh-keygen failed: " + err.strip())


def main(job: TrustJob) -> TrustAnswer:
    """`job` done on this machine (with dry_run: only reported), as its TrustAnswer."""
    dry_run = job["dry_run"]
    settings: Dict[str, Any] = {"identityfile": [], "userknownhostsfile": []}
    if job["ssh_g"]:
        code, out, _ = _run(job["ssh_g"])
        if code == 0:
            settings = parse_ssh_g(out)
    known_files = settings["userknownhostsfile"] or ["~/.ssh/known_hosts"]
    known_hosts = os.path.expanduser(job["known_hosts"] or known_files[0])
    identity, missing = pick_identity(job["identity"], settings["identityfile"], os.path.exists)
    hostname, uid = socket.gethostname(), os.getuid()
    authorized_keys = os.path.expanduser("~/.ssh/authorized_keys")
    key_created = False
    if missing and job["make_key"] and not dry_run:
        make_key(identity)
        missing, key_created = False, True
    pubkey = None if missing else public_key(identity)
    known = {name: known_keys(known_hosts, name) for name in job["lookup"]}  # before `remove`
    removed = []
    for name in job["remove"]:
        if known_keys(known_hosts, name):
            removed.append(name)
            if not dry_run:
                _run(["ssh-keygen", "-R", name, "-f", known_hosts])
    known_added = append_missing(known_hosts, job["add_known"], dry_run)
    authorized_added = append_missing(authorized_keys, job["authorize"], dry_run, by_key=True)
    return TrustAnswer(
        hostname=hostname,
        uid=uid,
        identity=identity,
        key_created=key_created,
        known_hosts=known_hosts,
        authorized_keys=authorized_keys,
        pubkey=pubkey,
        key_missing=missing,
        known=known,
        removed=removed,
        known_added=known_added,
        authorized_added=authorized_added,
    )


def run(job: TrustJob) -> None:
    """The node's entry: main's TrustAnswer, sent."""
    answer.send(main(job))
