"""The node probe: a stdlib-only script sent over ssh stdin; prints one JSON fact sheet.

    ssh node python3 - < probe.py      # (trainfleet appends the call to main(params))

It never imports trainfleet: a node needs only python3 for doctor. In one run it gathers facts
(names, interfaces, routes, listeners, firewall, limits, memory, disk, software, GPUs) and, at
the same time, runs the active tests whose other end is the other nodes' probes: it listens on
the ports the launch node chose for it, connects to every peer's ports, ssh's to every peer
(itself included) and writes a token that peers look for (shared storage). Every peer starts
at the same moment, so a connect refused means "not listening yet" and is retried until the
deadline, while a timeout means a firewall dropped it. Python >= 3.8 syntax only: the node's
python may be old.
"""

import base64
import glob
import hashlib
import json
import os
import resource
import select
import shutil
import socket
import subprocess
import sys
import threading
import time

PROBE_VERSION = 1
ENV_PREFIXES = ("NCCL_", "GLOO_", "MASTER_", "TORCH_", "CUDA_", "DS_", "TP_SOCKET", "PDSH_")
TOOLS = ("nvcc", "ninja", "torchrun", "deepspeed", "pdsh", "nvidia-smi", "gcc")
CLIENT_NAME_LIMIT_S = 2.0
"""How long the master's reverse lookups of its clients may take (each rank's connection to
c10d's store pays one)."""
PACKAGES = ("torch", "deepspeed", "transformers", "accelerate", "datasets", "peft")
IMPORT_SCRIPT = r"""
import json, sys
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    try:
        nccl = torch.cuda.nccl.version() if torch.version.cuda else None
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    except Exception as exc:
        out["nccl_error"] = repr(exc)
    out["torch_distributed"] = torch.distributed.is_available()
    out["gloo"] = torch.distributed.is_available() and torch.distributed.is_gloo_available()
except Exception as exc:
    out["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
for name in ("deepspeed", "transformers", "accelerate"):
    try:
        module = __import__(name)
        out[name] = getattr(module, "__version__", "?")
    except Exception as exc:
        out[name + "_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


def run(argv, timeout=5.0, env=None):
    """(returncode, stdout, stderr) of argv; 127 when missing, 124 on timeout."""
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
        return proc.returncode, proc.stdout, proc.stderr
    except FileNotFoundError:
        return 127, "", "not found"
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %s s" % timeout
    except OSError as exc:
        return 126, "", str(exc)


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


def client_names(addresses, limit):
    """What c10d's TCPStore on this node (the master) gets when it names a client: it listens on
    both stacks, so a client at A is ::ffff:A, and getnameinfo fails with EAI_AGAIN (c10d's
    `err=-3`) when no hosts entry names that form and no DNS server answers. Per address:
    {"name"} or {"error"}, with the seconds it took; one thread each, bounded by `limit`."""
    found = {}

    def lookup(address):
        start = time.time()
        try:
            name = socket.getnameinfo(("::ffff:" + address, 0, 0, 0), socket.NI_NUMERICSERV)[0]
            outcome = {"name": name}
        except (OSError, ValueError) as exc:
            outcome = {"error": str(exc)}
        outcome["seconds"] = round(time.time() - start, 3)
        found[address] = outcome  # whole, in one step: the caller may read it at its deadline

    threads = [threading.Thread(target=lookup, args=(a,), daemon=True) for a in addresses]
    for thread in threads:
        thread.start()
    deadline = time.time() + limit
    for thread in threads:
        thread.join(max(0.0, deadline - time.time()))
    late = {"error": "no answer in %gs" % limit, "seconds": limit}
    return {a: found.get(a) or dict(late) for a in addresses}


def interfaces():
    code, out, err = run(["ip", "-j", "addr", "show"])
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
    code, out, err = run(["ip", "-j", "route", "get", address])
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


def _socket_owners(inodes):
    """pid owning each socket inode; scans /proc/*/fd, so only for the few inodes asked."""
    owners = {}
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
        code, out, err = run(argv)
        if code != 127:
            result[key] = {"rc": code, "out": out[-20000:], "err": err.strip()[-500:]}
    return result


def read_first(path, default=None):
    try:
        return open(path).read().strip()
    except OSError:
        return default


def memory():
    info = {}
    for line in (read_first("/proc/meminfo", "") or "").splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            info[key] = int(rest.split()[0]) * 1024
    return info


def statvfs(path):
    try:
        st = os.statvfs(path)
        return {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}
    except OSError as exc:
        return {"error": str(exc)}


def limits():
    out = {}
    for key, which in (("memlock", resource.RLIMIT_MEMLOCK), ("nofile", resource.RLIMIT_NOFILE)):
        soft, _ = resource.getrlimit(which)
        out[key] = None if soft == resource.RLIM_INFINITY else soft
    return out


def _dist_infos():
    """{normalized name: (version, path)} from the *.dist-info dirs on sys.path (no imports)."""
    found = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info"):
                dist, _, version = name[: -len(".dist-info")].partition("-")
                key = dist.lower().replace("_", "-").replace(".", "-")
                found.setdefault(key, (version, os.path.join(entry, name)))
    return found


def package_versions(dists):
    versions = {name: dists[name][0] if name in dists else None for name in PACKAGES}
    for wheel in ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11"):
        if wheel in dists:
            versions["nccl_wheel"] = dists[wheel][0]
    return versions


def _install_key(dists):
    stamp = [sys.executable, os.path.realpath(sys.executable)]
    for name in PACKAGES:
        version, path = dists.get(name, ("-", ""))
        mtime = os.path.getmtime(path) if path else 0
        stamp.append("%s=%s@%s" % (name, version, mtime))
    return hashlib.sha256("|".join(stamp).encode()).hexdigest()[:24]


def imports(timeout, versions, dists):
    """Import the training stack in a subprocess; cached per interpreter + installed versions,
    so N nodes on one shared install (or repeated runs) import it once."""
    if not versions.get("torch") and not versions.get("deepspeed"):
        return {"skipped": "no torch or deepspeed installed"}
    cache_dir = os.path.join(os.path.expanduser("~"), ".cache", "trainfleet")
    key = _install_key(dists)
    cache = os.path.join(cache_dir, "imports-%s.json" % key)
    lock = cache + ".lock"
    deadline = time.time() + timeout + 5
    while time.time() < deadline:
        try:
            with open(cache) as f:
                result = json.load(f)
                result["cached"] = True
                return result
        except (OSError, ValueError):
            pass
        try:
            os.makedirs(cache_dir, exist_ok=True)
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break  # this probe imports; others on the same install wait for its result
        except FileExistsError:
            try:
                if time.time() - os.path.getmtime(lock) > timeout + 10:
                    os.unlink(lock)  # a probe died while importing
            except OSError:
                pass
            time.sleep(0.2)
        except OSError:
            break  # read-only home: import without the cache
    try:
        code, out, err = run([sys.executable, "-c", IMPORT_SCRIPT], timeout=timeout)
        if code != 0:
            return {"import_error": (err.strip().splitlines() or ["exit %s" % code])[-1]}
        result = json.loads(out.strip().splitlines()[-1])
        try:
            tmp = "%s.%d" % (cache, os.getpid())
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, cache)
        except OSError:
            pass  # the cache only saves the next probe an import
        return result
    finally:
        try:
            os.unlink(lock)
        except OSError:
            pass


def gpus():
    code, out, _ = run(
        [
            "nvidia-smi",
            "--query-gpu=index,name,memory.total,driver_version",
            "--format=csv,noheader,nounits",
        ],
        timeout=15,
    )
    if code == 127:
        return None
    if code != 0:
        return {"error": "nvidia-smi exit %s" % code}
    devices = []
    for line in out.strip().splitlines():
        index, name, mem, driver = [p.strip() for p in line.split(",")[:4]]
        devices.append(
            {"index": int(index), "name": name, "memory_mib": int(float(mem)), "driver": driver}
        )
    code, out, _ = run(
        [
            "nvidia-smi",
            "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
            "--format=csv,noheader,nounits",
        ],
        timeout=15,
    )
    apps = (
        [
            dict(zip(("pid", "name", "used_mib", "gpu"), [p.strip() for p in line.split(",")]))
            for line in out.strip().splitlines()
            if line.strip()
        ]
        if code == 0
        else []
    )
    return {"devices": devices, "processes": apps}


def infiniband():
    devices = {}
    for port_dir in glob.glob("/sys/class/infiniband/*/ports/*"):
        parts = port_dir.split("/")
        devices.setdefault(parts[4], {})[parts[6]] = {
            "state": read_first(port_dir + "/state"),
            "link_layer": read_first(port_dir + "/link_layer"),
            "rate": read_first(port_dir + "/rate"),
        }
    return devices


def code_hash(workdir, limit=2000):
    digest = hashlib.sha256()
    count = 0
    for root, dirs, files in os.walk(workdir):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in ("__pycache__", "node_modules", "venv", "runs", "outputs", "wandb")
        )
        for name in sorted(files):
            if name.endswith((".py", ".sh", ".yaml", ".yml", ".json", ".toml")):
                path = os.path.join(root, name)
                try:
                    if os.path.getsize(path) > 1 << 20:
                        continue
                    digest.update(path.encode() + b"\0" + open(path, "rb").read())
                except OSError:
                    continue
                count += 1
                if count >= limit:
                    return {"sha256": digest.hexdigest(), "files": count, "truncated": True}
    return {"sha256": digest.hexdigest(), "files": count}


JIT_LOCK_STALE_S = 60
"""A JIT build lock this old that no process holds or builds under is a leftover (the margin
covers a holder on another node of a shared file system, which no probe here can see)."""


def _holders(paths):
    """pid -> the reason it may be using a lock of `paths`: it holds the lock open (torch's
    FileBaton keeps the fd it created the lock with until it removes it), or it works in the
    lock's directory (ninja and the compilers of a build). Only processes this user may
    inspect."""
    dirs = set(os.path.dirname(p) for p in paths)
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink("/proc/%s/cwd" % entry)
            if cwd in dirs:
                found[int(entry)] = cwd
                continue
            for fd in os.listdir("/proc/%s/fd" % entry):
                target = os.readlink("/proc/%s/fd/%s" % (entry, fd))
                if target in paths:
                    found[int(entry)] = target
                    break
        except OSError:
            continue
    return found


def jit_locks(extensions_dir=None):
    """torch's JIT build locks: cpp_extension creates BUILD_DIR/lock before it builds or loads an
    op (DeepSpeed's fused_adam, cpu_adam, shm comm...) and removes it when done; every other
    process that wants the op waits while it exists. A process killed in between leaves it, and
    every later start waits for it forever. Per lock: its age and the pids that hold it or
    work in its directory."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    roots = [extensions_dir, os.environ.get("TORCH_EXTENSIONS_DIR")]
    roots.append(os.path.join(cache, "torch_extensions"))
    paths = set()
    for root in roots:
        if root:  # TORCH_EXTENSIONS_DIR/OP/lock, or the default root/pyXY_cuZ/OP/lock
            paths.update(glob.glob(os.path.join(root, "*", "lock")))
            paths.update(glob.glob(os.path.join(root, "*", "*", "lock")))
    if not paths:
        return []
    real = dict((path, os.path.realpath(path)) for path in paths)  # as /proc names them
    holders = _holders(set(real.values()))
    now = time.time()
    locks = []
    for path in sorted(paths):
        try:
            age = now - os.stat(path).st_mtime
        except OSError:
            continue  # released while we looked
        here = (real[path], os.path.dirname(real[path]))
        mine = [pid for pid, what in holders.items() if what in here]
        locks.append({"path": path, "age_s": round(age, 1), "busy_pids": sorted(mine)})
    return locks


def stale_jit_locks(extensions_dir=None):
    """The locks no process works under and older than JIT_LOCK_STALE_S."""
    return [
        lock
        for lock in jit_locks(extensions_dir)
        if not lock["busy_pids"] and lock["age_s"] >= JIT_LOCK_STALE_S
    ]


# ----------------------------------------------------------------------------- active tests


class Listeners:
    """Listens on the chosen ports. A connection is read to EOF: connectivity checks close at
    once, the bandwidth sender streams; bytes and times per sender address are kept."""

    def __init__(self, ports):
        self.status = {}
        self.sockets = []
        self.accepted = 0
        self.streams = {}  # sender address -> (bytes, first byte time, last byte time)
        self._readers = []
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # As torch's TCPStore does: a port in TIME_WAIT from the last run is free, a port
            # another process listens on is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
                sock.listen(64)
                sock.settimeout(0.1)
                self.sockets.append(sock)
                self.status[str(port)] = "listening"
            except OSError as exc:
                sock.close()
                self.status[str(port)] = "bind failed: %s" % exc.strerror
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        if self.sockets:
            self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            ready, _, _ = select.select(self.sockets, [], [], 0.1)
            for sock in ready:
                try:
                    conn, addr = sock.accept()
                except OSError:
                    continue
                self.accepted += 1
                reader = threading.Thread(target=self._drain, args=(conn, addr[0]), daemon=True)
                self._readers.append(reader)
                reader.start()

    def _drain(self, conn, address):
        total, first, last = 0, None, None
        conn.settimeout(5)
        try:
            while True:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                last = time.time()
                first = first or last
                total += len(chunk)
        except OSError:
            pass
        finally:
            conn.close()
        if total:
            self.streams[address] = (total, first, last)

    def close_when(self, expected, deadline):
        while self.accepted < expected and time.time() < deadline:
            time.sleep(0.05)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.closed_at = time.time()
        for reader in self._readers:
            reader.join(max(0.0, deadline + 2 - time.time()))
        for sock in self.sockets:
            sock.close()


def send_stream(address, port, seconds):
    """Stream zeros to a peer's listener for `seconds`; the receiver measures the rate."""
    try:
        sock = socket.create_connection((address, port), timeout=3)
    except OSError as exc:
        return "not connected: %s" % (exc.strerror or exc)
    block = bytes(1 << 16)
    end = time.time() + seconds
    sent = 0
    try:
        sock.settimeout(max(0.5, seconds * 2))
        while time.time() < end:
            sent += sock.send(block)
    except OSError as exc:
        return "interrupted: %s" % (exc.strerror or exc)
    finally:
        sock.close()
    return "sent %d bytes" % sent


def tcp_check(address, port, deadline, attempt_timeout):
    """('open' or why not, time of the last attempt). Refused is retried until the deadline:
    the peer's probe may not listen yet (its ssh session can start seconds later)."""
    last = "timeout"
    while True:
        remaining = deadline - time.time()
        if remaining <= 0:
            return last, time.time()
        try:
            socket.create_connection(
                (address, port), timeout=min(attempt_timeout, remaining)
            ).close()
            return "open", time.time()
        except socket.timeout:
            return "timeout", time.time()
        except ConnectionRefusedError:
            last = "refused"
        except OSError as exc:
            if exc.errno == 113:
                return "no-route", time.time()  # EHOSTUNREACH: firewalld's icmp-host-prohibited
            last = "error: %s" % (exc.strerror or exc)
        time.sleep(0.1)


def ssh_check(argv, timeout):
    """Authenticate only (`ssh -N -v`, stopped at 'Authenticated to'): no remote shell runs,
    so the N x N matrix costs handshakes, not N x N shell start-ups."""
    start = time.time()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        return {"rc": 127, "stderr": str(exc), "seconds": 0.0}
    lines = []
    outcome = {"rc": None}

    def read():
        for line in proc.stderr:
            if line.startswith("Authenticated to"):
                outcome["rc"] = 0
                proc.kill()
                return
            if not line.startswith("debug"):
                lines.append(line.rstrip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive() or outcome["rc"] is None:
        try:
            rc = proc.wait(0.1 if not reader.is_alive() else 0)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is None:
            proc.kill()
            lines.append("timed out after %s s" % timeout)
            rc = 124
        outcome["rc"] = rc
    proc.wait()
    err = "\n".join(lines).strip()
    if len(err) > 800:  # ssh's verdict can be in the banner's first line or in the last
        err = err[:400] + "\n...\n" + err[-400:]
    return {"rc": outcome["rc"], "stderr": err, "seconds": round(time.time() - start, 3)}


def active_tests(params, results):
    """Threads for the outbound TCP and ssh tests; fills `results` in place."""
    threads = []
    deadline = time.time() + params["connect_timeout"] + params.get("skew", 2)
    tcp = results.setdefault("tcp", {})
    ssh = results.setdefault("ssh", {})

    last_attempt = results.setdefault("tcp_last_attempt", {})

    def do_tcp(peer, port):
        status, when = tcp_check(peer["address"], port, deadline, params["connect_timeout"])
        tcp.setdefault(peer["node"], {})[str(port)] = status
        last_attempt.setdefault(peer["node"], {})[str(port)] = when

    # At most a few handshakes at once per node: N probes each opening N at the same moment
    # starve each other into timeouts on a loaded machine.
    ssh_slots = threading.Semaphore(params.get("ssh_parallel", 8))

    def do_ssh(peer):
        with ssh_slots:
            ssh[peer["node"]] = ssh_check(peer["ssh_argv"], params.get("ssh_timeout", 25))

    for peer in params["peers"]:
        if peer["node"] != params["node"]:
            for port in peer["ports"]:
                threads.append(threading.Thread(target=do_tcp, args=(peer, port)))
        if peer.get("ssh_argv"):
            threads.append(threading.Thread(target=do_ssh, args=(peer,)))
    for thread in threads:
        thread.start()
    return threads


def main(params):
    started = time.time()
    workdir = params.get("workdir") or os.getcwd()
    me = params["node"]
    active = {}
    listeners = Listeners(params.get("listen_ports", []))
    active["listen_since"] = time.time()
    token_dir = os.path.join(workdir, ".trainfleet-doctor-%s" % params.get("run_id", "x"))
    # No token (and no shared-storage facts) where the launcher promised to write nothing.
    share_token = bool(params.get("peers")) and params.get("share_token", True)
    if share_token:
        try:
            os.mkdir(token_dir)  # never makedirs: a missing workdir is a finding, not created
            open(os.path.join(token_dir, me), "w").write(str(os.getpid()))
            active["token"] = "written"
        except OSError as exc:
            active["token"] = "not written: %s" % (exc.strerror or exc)
    threads = active_tests(params, active) if params.get("peers") else []

    hostname = socket.gethostname()
    dists = _dist_infos()
    versions = package_versions(dists)
    facts = {
        "probe_version": PROBE_VERSION,
        "node": me,
        "pid": os.getpid(),
        "time": time.time(),
        "hostname": hostname,
        "fqdn": socket.getfqdn(),
        "resolve": {
            name: resolve(name) for name in {hostname, params.get("master_name") or hostname}
        },
        "interfaces": interfaces(),
        "route_to_master": route_to(params.get("master_addr")),
        "client_names": client_names(params.get("client_addresses", []), CLIENT_NAME_LIMIT_S),
        "listening": listening(set(params.get("owner_ports", []))),
        "firewall": firewall(),
        "ipv6_disabled": read_first("/proc/sys/net/ipv6/conf/all/disable_ipv6"),
        "port_range": read_first("/proc/sys/net/ipv4/ip_local_port_range"),
        "limits": limits(),
        "shm": statvfs("/dev/shm"),
        "memory": memory(),
        "workdir": {"path": workdir, "exists": os.path.isdir(workdir), "disk": statvfs(workdir)},
        "python": {"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3]},
        "packages": versions,
        "tools": {tool: shutil.which(tool) for tool in TOOLS},
        "path": os.environ.get("PATH", ""),
        "cuda_home": os.environ.get("CUDA_HOME"),
        "env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)},
        "gpus": gpus(),
        "infiniband": infiniband(),
        "jit_locks": jit_locks(params.get("extensions_dir")),
        "code": None if params.get("quick") or not os.path.isdir(workdir) else code_hash(workdir),
    }
    if not params.get("quick"):
        facts["imports"] = imports(params.get("import_timeout", 20), versions, dists)

    for thread in threads:
        thread.join()
    target = params.get("bandwidth_to")
    reachable = (
        active.get("tcp", {})
        .get((target or {}).get("node"), {})
        .get(str((target or {}).get("port")))
        == "open"
    )
    if target and not reachable:
        active["bandwidth_send"] = "skipped: the port is not reachable"
    elif target:
        active["bandwidth_send"] = send_stream(
            target["address"], target["port"], params.get("bandwidth_seconds", 0.3)
        )
    peers = [p for p in params.get("peers", []) if p["node"] != me]
    listeners.close_when(
        len(peers) * len(listeners.sockets) + (1 if params.get("bandwidth_from") else 0),
        started + params.get("connect_timeout", 3) + 2 * params.get("skew", 2),
    )
    active["listen"] = listeners.status
    active["listen_until"] = listeners.closed_at
    by_address = {p["address"]: p["node"] for p in peers}
    active["bandwidth_in"] = {
        by_address.get(addr, addr): {"bytes": n, "seconds": round(last - first, 4)}
        for addr, (n, first, last) in listeners.streams.items()
        if n > 1 << 16
    }
    if share_token:
        seen = set(os.listdir(token_dir)) if os.path.isdir(token_dir) else set()
        active["shared"] = {p["node"]: p["node"] in seen for p in peers}
    facts["active"] = active
    facts["seconds"] = round(time.time() - started, 3)
    sys.stdout.write(json.dumps(facts) + "\n")


def remove_stale_jit_locks(paths, extensions_dir=None):
    """Removes those of `paths` that are stale now (checked again here, at the last moment):
    never a lock a build holds, never a path that is not one of torch's JIT locks.
    -> {path: what was done}."""
    stale = set(lock["path"] for lock in stale_jit_locks(extensions_dir))
    outcome = {}
    for path in paths:
        if path not in stale:
            outcome[path] = "kept: gone already, or a build is under way there now"
            continue
        try:
            os.remove(path)
            outcome[path] = "removed"
        except OSError as exc:
            outcome[path] = "not removed: %s" % (exc.strerror or exc)
    return outcome


def remove_main(job):
    """doctor --fix on a node: job {"paths", "extensions_dir"}; prints the outcome as JSON."""
    outcome = remove_stale_jit_locks(job["paths"], job.get("extensions_dir"))
    sys.stdout.write(json.dumps(outcome) + "\n")


def payload(params, function="main"):
    """The bytes to send on stdin: this file plus the call to `function(params)` (main: the
    fact sheet; remove_main: doctor --fix's JIT locks)."""
    source = open(__file__.replace(".pyc", ".py")).read()
    encoded = base64.b64encode(json.dumps(params).encode()).decode()
    return (source + "\n%s(json.loads(base64.b64decode(%r)))\n" % (function, encoded)).encode()
