"""The probe's active tests, whose other end is the other nodes' probes: listening on the ports
the launch node chose, connecting to every peer's, ssh to every peer, a short bandwidth stream.
"""

import select
import socket
import subprocess
import threading
import time
from typing import Dict, List, Optional


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
    the peer's probe may not listen yet (its ssh session can start seconds later). An attempt
    the deadline cut short of its own timeout proves nothing more than the refusals before it,
    and with none before it the answer is 'late' (this probe's thread started too late to
    test: a loaded node), which is no finding."""
    last = "late"
    while True:
        remaining = deadline - time.time()
        if remaining <= 0:
            return last, time.time()
        try:
            socket.create_connection(
                (address, port), timeout=min(attempt_timeout, remaining)
            ).close()
            return "open", time.time()
        except TimeoutError:
            return ("timeout" if remaining >= attempt_timeout else last), time.time()
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
    lines: List[str] = []
    outcome: Dict[str, Optional[int]] = {"rc": None}
    # Popen types the pipe Optional; stderr=PIPE was asked for just above.
    assert proc.stderr is not None
    stderr = proc.stderr

    def read():
        for line in stderr:
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
    """Threads for the outbound TCP and ssh tests of `params` (`probe.ProbeParams`); fills
    `results` in place."""
    threads = []
    deadline = time.time() + params["connect_timeout"] + params["skew"]
    tcp = results.setdefault("tcp", {})
    ssh = results.setdefault("ssh", {})

    last_attempt = results.setdefault("tcp_last_attempt", {})

    def do_tcp(peer, port):
        status, when = tcp_check(peer["address"], port, deadline, params["connect_timeout"])
        tcp.setdefault(peer["node"], {})[str(port)] = status
        last_attempt.setdefault(peer["node"], {})[str(port)] = when

    # At most a few handshakes at once (the launch node's PEER_SSH_PARALLEL says why).
    ssh_slots = threading.Semaphore(params["ssh_parallel"])

    def do_ssh(peer):
        with ssh_slots:
            ssh[peer["node"]] = ssh_check(peer["ssh_argv"], params["ssh_timeout"])

    tested = set(params["test_peers"])
    for peer in params["peers"]:
        if peer["node"] not in tested:
            continue
        if peer["node"] != params["node"]:
            for port in peer["ports"]:
                threads.append(threading.Thread(target=do_tcp, args=(peer, port)))
        if peer["ssh_argv"]:
            threads.append(threading.Thread(target=do_ssh, args=(peer,)))
    for thread in threads:
        thread.start()
    return threads
