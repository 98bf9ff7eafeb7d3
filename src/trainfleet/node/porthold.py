"""A port held on purpose: the leftover process of a last run that keeps the master port (the
sandbox's `port-in-use` fault, seed 000), or a resolver that takes queries and never answers
(`dns-unreachable`). Prints `ready` once it holds the port, then sleeps."""

import socket
import time


def hold(port):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", port))
    sock.listen(8)
    print("ready", flush=True)
    while True:
        time.sleep(3600)


def hold_udp(address, port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, port))
    print("ready", flush=True)
    while True:
        time.sleep(3600)
