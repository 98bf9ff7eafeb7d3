"""The node's network as the probe sees it: names, interfaces, the route to the master, who
listens on which port, the firewall's rules, and the reverse lookups c10d makes there.
"""

import glob
import json
import os
import select
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Set

from trainfleet.node import system


def resolve(name):
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return {"error": str(exc)}
    seen = []
    for info in infos:
        addr = info[4][0]
        if addr not in seen:
            seen.append(addr)
    return {"addresses": seen}


_LOOKUPS = """
import json, socket, sys, threading, time
said = threading.Lock()
def look(address):
    start = time.time()
    try:
        outcome = {"name": socket.getnameinfo(("::ffff:" + address, 0, 0, 0),
                                              socket.NI_NUMERICSERV)[0]}
    except (OSError, ValueError) as exc:
        outcome = {"error": str(exc)}
    outcome["seconds"] = round(time.time() - start, 3)
    with said:
        sys.stdout.write(json.dumps([address, outcome]) + "\\n")
        sys.stdout.flush()
sys.stdout.write("null\\n")
sys.stdout.flush()
for address in json.loads(sys.argv[1]):
    threading.Thread(target=look, args=(address,), daemon=True).start()
time.sleep(3600)
"""
"""The lookups, in a child process of their own: some builds of Python (Debian's 3.11) let one
resolver call run at a time (and nothing else run meanwhile), so a lookup that waits on a
silent DNS server would hold up every name the probe resolves after it (seen: 20 s for two
lookups and the probe's own). The child first says it runs (`null`: the lookups' bound starts
there, not while Python starts on a busy node), then how each lookup ended."""
LOOKUPS_START_S = 30.0
"""How long the child may take to start (a busy node starts Python slowly: that is no answer
from the resolver; lookups that never started are not reported)."""


def client_names(addresses: List[str], limit: float) -> Dict[str, Dict[str, Any]]:
    """What c10d's store gets when it names the other end of a connection: it listens on both
    stacks and connects in IPv6 form, so an IPv4 peer A is ::ffff:A, and getnameinfo fails with
    EAI_AGAIN (c10d's `err=-3`) when no hosts entry names that form and no DNS server answers.
    Per address: {"name"} or {"error"}, with the seconds it took; all of them bounded by
    `limit` from the moment the child process runs (killed then); none when it did not start."""
    found: Dict[str, Dict[str, Any]] = {}
    ready: Optional[float] = None
    if addresses:
        child = subprocess.Popen(
            [sys.executable, "-I", "-c", _LOOKUPS, json.dumps(list(addresses))],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        # Popen types the pipe Optional; stdout=PIPE was asked for just above.
        assert child.stdout is not None
        start_by, pending = time.time() + LOOKUPS_START_S, b""
        try:
            while len(found) < len(addresses):
                left = (start_by if ready is None else ready + limit) - time.time()
                if left <= 0 or not select.select([child.stdout], [], [], left)[0]:
                    break
                chunk = os.read(child.stdout.fileno(), 65536)
                if not chunk:
                    break
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip() == b"null":
                        ready = ready or time.time()
                    else:
                        _take(found, line, addresses)
        finally:
            child.kill()
            child.wait()
    if ready is None:
        return {}
    late = {"error": "no answer in %gs" % limit, "seconds": limit}
    return {a: found.get(a) or dict(late) for a in addresses}


def _take(found: Dict[str, Dict[str, Any]], line: bytes, addresses: List[str]) -> None:
    try:
        address, outcome = json.loads(line.decode())
    except ValueError:
        return
    if address in addresses and isinstance(outcome, dict):
        found[address] = outcome


def resolver(path: str = "/etc/resolv.conf") -> Dict[str, Any]:
    """What glibc's resolver does with a query no server answers: its nameservers, and the
    seconds it waits per try and how many tries (resolv.conf's `options`, then RES_OPTIONS,
    which overrides them per process; glibc's defaults are 5 s and 2)."""
    found: Dict[str, Any] = {"nameservers": [], "timeout": 5, "attempts": 2}
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        return {"error": str(exc)}
    options = []
    for raw in text.splitlines():
        words = raw.split("#")[0].split(";")[0].split()
        if len(words) >= 2 and words[0] == "nameserver":
            found["nameservers"].append(words[1])
        elif words and words[0] == "options":
            options += words[1:]
    options += os.environ.get("RES_OPTIONS", "").split()
    for option in options:
        key, _, value = option.partition(":")
        if key in ("timeout", "attempts") and value.isdigit():
            found[key] = int(value)
    return found


def interfaces():
    code, out, err = system.run(["ip", "-j", "addr", "show"])
    if code != 0:
        return {"error": err.strip() or "ip -j addr failed"}
    result = []
    for link in json.loads(out or "[]"):
        name = link.get("ifname")
        kind_path = "/sys/class/net/%s/bridge" % name
        result.append(
            {
                "name": name,
                "state": link.get("operstate"),
                "up": "UP" in link.get("flags", []),
                "mtu": link.get("mtu"),
                "link_type": link.get("link_type"),
                "bridge": os.path.isdir(kind_path),
                "ipv4": [
                    "%s/%s" % (a["local"], a["prefixlen"])
                    for a in link.get("addr_info", [])
                    if a.get("family") == "inet"
                ],
                "ipv6": [
                    "%s/%s" % (a["local"], a["prefixlen"])
                    for a in link.get("addr_info", [])
                    if a.get("family") == "inet6"
                ],
            }
        )
    return result


def route_to(address):
    if not address:
        return None
    code, out, err = system.run(["ip", "-j", "route", "get", address])
    if code != 0:
        return {"error": err.strip()}
    routes = json.loads(out or "[]")
    if not routes:
        return {"error": "no route"}
    return {
        "dev": routes[0].get("dev"),
        "src": routes[0].get("prefsrc"),
        "gateway": routes[0].get("gateway"),
    }


def _socket_owners(inodes: Set[str]) -> Dict[str, str]:
    """pid owning each socket inode; scans /proc/*/fd, so only for the few inodes asked."""
    owners: Dict[str, str] = {}
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        pid = fd_dir.split("/")[2]
        try:
            links = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in links:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.setdefault(target[8:-1], pid)
                if len(owners) == len(inodes):
                    return owners
    return owners


def _hex_addr(text):
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        addr = socket.inet_ntop(socket.AF_INET6, words)
    return addr, int(port, 16)


def listening(owner_ports):
    """Listening TCP sockets; the owning pid and command for those on `owner_ports`."""
    entries = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A":  # TCP_LISTEN
                addr, port = _hex_addr(parts[1])
                entries.append({"addr": addr, "port": port, "inode": parts[9]})
    wanted = {e["inode"] for e in entries if e["port"] in owner_ports}
    owners = _socket_owners(wanted) if wanted else {}
    for entry in entries:
        pid = owners.get(entry.pop("inode"))
        entry["pid"] = int(pid) if pid else None
        entry["cmd"] = None
        if pid:
            try:
                raw = open("/proc/%s/cmdline" % pid, "rb").read()
                entry["cmd"] = raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]
            except OSError:
                pass
    return entries


def firewall():
    result = {}
    for key, argv in (
        ("iptables", ["iptables", "-S"]),
        ("nft", ["nft", "list", "ruleset"]),
        ("ufw", ["ufw", "status"]),
        ("firewalld", ["firewall-cmd", "--state"]),
    ):
        code, out, err = system.run(argv)
        if code != 0 and os.geteuid() != 0:
            # Reading the rules takes root; an ssh user with sudo rights for the firewall
            # tools gets them without a password (-n: never a prompt), else the first answer.
            by_sudo = system.run(["sudo", "-n"] + argv)
            if by_sudo[0] == 0:
                code, out, err = by_sudo
        if code != 127:
            result[key] = {"rc": code, "out": out[-20000:], "err": err.strip()[-500:]}
    return result
