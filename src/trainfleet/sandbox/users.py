"""The password-only sandbox: one test user with a password, its own home on every node.

    >>> user = SandboxUser(uid=4242, gid=100, home="/run/tf/home", login_shell="/bin/sh")
    >>> passwd_line(user)
    'tfuser:x:4242:100:trainfleet sandbox user:/run/tf/home:/bin/sh'
    >>> free_uid("root:x:0:0::/root:/bin/sh\\nbob:x:4200:100::/home/bob:/bin/sh\\n")
    4201

What fresh servers look like before `trainfleet setup ssh` (`sandbox up --auth password`): sshd
accepts the user's password and nothing else, no key is trusted anywhere, root cannot log in.
Each node has its own /etc/passwd, /etc/shadow and /etc/sudoers.d (through /etc/netns/NETNS/,
which `ip netns exec` mounts over /etc: the user may run the firewall tools with `sudo -n`, as
on servers whose admin allows that, and nothing else as root) and its own home: the state
dir's nodes/HOST/home, mounted over STATE/home in the mount namespace of that node's sshd, so
every node has its own ~/.ssh at the same path, as separate machines do. On this machine,
STATE/home holds the launch side's ssh files (key, known_hosts); the user's real ~/.ssh is
never read or written.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from trainfleet.errors import SandboxError

SANDBOX_USER = "tfuser"
"""The login name every node accepts (with its password) in a password-only sandbox."""
FIRST_UID = 4200
AUTH_MODES = ("key", "password")


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxUser:
    name: str = SANDBOX_USER
    uid: int
    gid: int
    home: str
    """The same path on every node (each node mounts its own directory there)."""
    login_shell: str


def free_uid(passwd_text: str, start: int = FIRST_UID) -> int:
    """The first uid from `start` on that no line of /etc/passwd uses."""
    used = set()
    for line in passwd_text.splitlines():
        parts = line.split(":")
        if len(parts) > 2 and parts[2].isdigit():
            used.add(int(parts[2]))
    uid = start
    while uid in used:
        uid += 1
    return uid


def passwd_line(user: SandboxUser) -> str:
    fields = [user.name, "x", str(user.uid), str(user.gid), "trainfleet sandbox user"]
    return ":".join([*fields, user.home, user.login_shell])


def shadow_line(user: SandboxUser, password_hash: str, days_since_epoch: int) -> str:
    """Last change today: 0 would mean 'must change the password' and sshd would refuse."""
    return f"{user.name}:{password_hash}:{days_since_epoch}:0:99999:7:::"


def with_line(text: str, line: str) -> str:
    """`text` (an /etc file) with `line` appended, newline-terminated."""
    return text + ("" if not text or text.endswith("\n") else "\n") + line + "\n"


def hash_password(password: str) -> str:
    """A SHA-512 crypt(3) hash for /etc/shadow (openssl reads the password on stdin)."""
    if shutil.which("openssl") is None:
        raise SandboxError(
            "`openssl` not found (it hashes the test user's password)", "apt-get install openssl"
        )
    done = subprocess.run(
        ["openssl", "passwd", "-6", "-stdin"],
        input=password + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.startswith("$6$"):
        raise SandboxError(f"openssl passwd failed: {done.stderr.strip()}", "check openssl")
    return done.stdout.strip()


def new_user(state: Path) -> SandboxUser:
    group = 100  # `users` on Debian and most distributions
    shell = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"
    uid = free_uid(Path("/etc/passwd").read_text())
    return SandboxUser(uid=uid, gid=group, home=str(state / "home"), login_shell=shell)


FIREWALL_TOOLS = ("iptables", "ip6tables", "nft", "ufw", "firewall-cmd")


def sudoers_line(user: SandboxUser) -> str | None:
    """The user may run the firewall tools as root without a password, as an admin gives a
    deploy user on GPU servers (what `setup firewall --apply` needs, through `sudo -n`);
    None when this machine has no sudo."""
    if shutil.which("sudo") is None:
        return None
    search = "/usr/sbin:/sbin:/usr/bin:/bin"
    tools = [path for t in FIREWALL_TOOLS if (path := shutil.which(t, path=search))]
    return f"{user.name} ALL=(root) NOPASSWD: {', '.join(tools)}\n" if tools else None


def write_login_files(state: Path, netns_etc: list[Path], user: SandboxUser) -> str:
    """Create the password and each node's passwd/shadow with the user in them.

    `netns_etc`: /etc/netns/NETNS of every node; a passwd already there (another login shell
    for root) is kept. Returns the password, which is also kept in STATE/password (0600) for
    tests and for the person trying the sandbox out.
    """
    password = secrets.token_urlsafe(12)
    password_file = state / "password"
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)
    shadow = with_line(
        Path("/etc/shadow").read_text(),
        shadow_line(user, hash_password(password), int(time.time() // 86400)),
    )
    for etc in netns_etc:
        etc.mkdir(parents=True, exist_ok=True)
        passwd = etc / "passwd"
        passwd_text = (passwd if passwd.exists() else Path("/etc/passwd")).read_text()
        (etc / "passwd").write_text(with_line(passwd_text, passwd_line(user)))
        (etc / "passwd").chmod(0o644)
        (etc / "shadow").write_text(shadow)
        (etc / "shadow").chmod(0o600)
        if rule := sudoers_line(user):
            (etc / "sudoers.d").mkdir(mode=0o755, exist_ok=True)
            (etc / "sudoers.d" / "trainfleet-sandbox").write_text(rule)
            (etc / "sudoers.d" / "trainfleet-sandbox").chmod(0o440)
    # The launch side's home: this machine's ssh files for the cluster (no key yet).
    Path(user.home).mkdir(mode=0o700, exist_ok=True)
    return password


def make_node_home(node_dir: Path, user: SandboxUser) -> Path:
    """The node's private home (mounted over user.home in its sshd's mount namespace)."""
    home = node_dir / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    os.chown(home, user.uid, user.gid)
    return home
