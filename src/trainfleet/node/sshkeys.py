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
from typing import Dict, List, Optional, TypedDict

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


def job(**asked):
    """A TrustJob that asks for `asked` and nothing else: the launch side's one builder.

    >>> job(lookup=["gpu-node-1"])["make_key"], job(lookup=["gpu-node-1"])["lookup"]
    (False, ['gpu-node-1'])
    """
    nothing = TrustJob(identity=None, known_hosts=None, ssh_g=None, lookup=[], make_key=False,
                       remove=[], add_known=[], authorize=[], dry_run=False)  # fmt: skip
    unknown = set(asked) - set(nothing)
    if unknown:
        raise TypeError("not a trust job field: %s" % ", ".join(sorted(unknown)))
    nothing.update(asked)
    return nothing


def parse_ssh_g(text):
    """The settings of `ssh -G` that setup needs."""
    out = {"identityfile": [], "userknownhostsfile": []}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "identityfile":
            out[key].append(value)
        elif key == "userknownhostsfile":
            out[key] = value.split()
        elif key in ("hostname", "port", "user", "hostkeyalias", "proxyjump", "proxycommand"):
            out[key] = value
    return out


def pick_identity(explicit, identityfiles, exists):
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


def key_of(line):
    """'type base64' of a known_hosts or authorized_keys line (None for comments, markers)."""
    parts = line.split()
    for i in range(len(parts) - 1):
        if parts[i].startswith(("ssh-", "ecdsa-", "sk-")) and len(parts[i + 1]) > 40:
            return parts[i] + " " + parts[i + 1]
    return None


def _run(argv, stdin=None):
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def known_keys(path, name):
    """Keys `path` holds for `name` (hashed entries included), as 'type base64'."""
    if not os.path.exists(path):
        return []
    _, out, _ = _run(["ssh-keygen", "-F", name, "-f", path])
    keys = []
    for line in out.splitlines():
        if line.startswith(("#", "@")) or not line.strip():
            continue
        key = key_of(line)
        if key and key not in keys:
            keys.append(key)
    return keys


def append_missing(path, lines, dry_run, by_key=False):
    """Append the lines not in `path` yet (by_key: compare keys only, as authorized_keys lines
    may carry options or another comment); the count appended."""
    old = open(path).read() if os.path.exists(path) else ""

    def ident(line):
        return (key_of(line) or line) if by_key else line

    have = {ident(line) for line in old.splitlines()}
    new = []
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


def public_key(private):
    pub = private + ".pub"
    if os.path.exists(pub):
        return key_of(open(pub).read())
    code, out, _ = _run(["ssh-keygen", "-y", "-f", private])  # .pub lost: derive it
    return key_of(out) if code == 0 else None


def make_key(private):
    os.makedirs(os.path.dirname(private), mode=0o700, exist_ok=True)
    comment = f"{os.environ.get('USER', '')}@{socket.gethostname()} (trainfleet setup ssh)"
    code, _, err = _run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", private]
    )
    if code != 0:
        raise RuntimeError("ssh-keygen failed: " + err.strip())


def main(job: TrustJob):
    """-> TrustAnswer."""
    dry_run = job["dry_run"]
    settings = {"identityfile": [], "userknownhostsfile": []}
    if job["ssh_g"]:
        code, out, _ = _run(job["ssh_g"])
        if code == 0:
            settings = parse_ssh_g(out)
    known_files = settings["userknownhostsfile"] or ["~/.ssh/known_hosts"]
    known_hosts = os.path.expanduser(job["known_hosts"] or known_files[0])
    identity, missing = pick_identity(job["identity"], settings["identityfile"], os.path.exists)
    result = {
        "hostname": socket.gethostname(),
        "uid": os.getuid(),
        "identity": identity,
        "key_created": False,
        "known_hosts": known_hosts,
        "authorized_keys": os.path.expanduser("~/.ssh/authorized_keys"),
    }
    if missing and job["make_key"] and not dry_run:
        make_key(identity)
        missing, result["key_created"] = False, True
    result["pubkey"] = None if missing else public_key(identity)
    result["key_missing"] = missing
    result["known"] = {name: known_keys(known_hosts, name) for name in job["lookup"]}
    removed = []
    for name in job["remove"]:
        if known_keys(known_hosts, name):
            removed.append(name)
            if not dry_run:
                _run(["ssh-keygen", "-R", name, "-f", known_hosts])
    result["removed"] = removed
    result["known_added"] = append_missing(known_hosts, job["add_known"], dry_run)
    result["authorized_added"] = append_missing(
        result["authorized_keys"], job["authorize"], dry_run, by_key=True
    )
    return result


def run(job: TrustJob):
    """The node's entry: main's TrustAnswer, sent."""
    answer.send(main(job))
