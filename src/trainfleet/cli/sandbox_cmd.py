"""`trainfleet sandbox up|down|status`: a real multi-node cluster on this Linux machine.

trainfleet sandbox up --nodes 3 --ifnames ens14f0,ens14f1,ens14f2
trainfleet exec -c /run/trainfleet/sandbox/tf/cluster.yaml -- hostname
trainfleet sandbox down
"""

from __future__ import annotations

import argparse
import json

from trainfleet import sandbox
from trainfleet.errors import SandboxError
from trainfleet.sandbox import FAULTS
from trainfleet.sandbox.users import SANDBOX_USER

HELP = "a multi-node cluster in network namespaces on this machine"
DESCRIPTION = """\
A real multi-node cluster on one Linux machine (root): each node is a network namespace
with its own interface name, hostname, /etc/hosts and sshd, on one bridge. For rehearsing
a multi-node launch before paying for GPUs, and for trainfleet's own tests. Its ssh key,
known_hosts, ssh_config, cluster.yaml and hostfile live in its state dir; ~/.ssh is never
touched."""


def _fault_help() -> str:
    lines = ["faults (--fault NAME[@NODE], NODE a 1-based index or hostname):"]
    lines += [f"  {name:24} {kind.what} [{kind.reproduces}]" for name, kind in FAULTS.items()]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="up|down|status")
    up = sub.add_parser(
        "up",
        help="create the sandbox",
        epilog=_fault_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    up.add_argument(
        "--ifnames",
        default="",
        metavar="A,B,..",
        help="interface name inside each node, one for all or one per node (default eth0)",
    )
    up.add_argument("--slots", type=int, default=1, help="slots per node in the written specs")
    up.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME[@NODE]",
        help="inject a fault (repeatable; list below)",
    )
    up.add_argument(
        "--subnet",
        help="IPv4 /24 for the nodes (default: one derived from --name, or the next free one)",
    )
    up.add_argument("--master-port", type=int, default=29500)
    up.add_argument(
        "--login-shell",
        metavar="PATH",
        help="root's login shell on the nodes (e.g. /bin/sh: skip ~/.bashrc; default: unchanged)",
    )
    up.add_argument(
        "--node-local-dir",
        metavar="DIR",
        help="an existing directory that each node sees as its own private copy (no shared "
        "storage there: what clusters without NFS look like)",
    )
    up.add_argument(
        "--auth",
        choices=("key", "password"),
        default="key",
        help="key: root logs in with the sandbox's own key, trusted everywhere (default); "
        "password: fresh servers, only the test user's password works (see the state dir's "
        "`password`), nothing is trusted: what `trainfleet setup ssh` starts from",
    )
    up.add_argument(
        "--slurm",
        action="store_true",
        help="also a real Slurm: munge, slurmctld on node 1 and a slurmd on every node "
        "(Debian's munge, slurmctld, slurmd and slurm-client packages); srun, sbatch and "
        "salloc reach it with SLURM_CONF set as printed",
    )
    for p in (
        up,
        sub.add_parser("down", help="remove everything `up` made"),
        sub.add_parser("status", help="nodes and their state"),
    ):
        p.add_argument("--name", default=None, help="sandbox name (default tf)")
        p.add_argument("name_arg", nargs="?", metavar="NAME", help="the same as --name NAME")
        p.add_argument("--json", action="store_true", help="print JSON")


def _run_up(args: argparse.Namespace) -> int:
    box = sandbox.up(
        nodes=args.nodes,
        name=args.name,
        ifnames=[n for n in args.ifnames.split(",") if n],
        slots=args.slots,
        faults=args.fault,
        subnet=args.subnet,
        master_port=args.master_port,
        login_shell=args.login_shell,
        node_local_dir=args.node_local_dir,
        auth=args.auth,
        slurm=args.slurm,
    )
    if args.json:
        print(json.dumps(box.to_json(), indent=2))
        return 0
    print(
        f"sandbox {box.name!r} is up: {len(box.nodes)} nodes on bridge {box.bridge} ({box.subnet})"
    )
    for node in box.nodes:
        faults = [f.name for f in box.faults if f.node == node.index]
        extra = f"  faults: {', '.join(faults)}" if faults else ""
        print(f"  {node.hostname:12} {node.address:15} {node.ifname:10}{extra}".rstrip())
    print(f"cluster.yaml: {box.cluster_file}")
    print(f"hostfile:     {box.hostfile}   (with --ssh-config {box.ssh_config})")
    if box.slurm:
        from trainfleet.sandbox.slurm import slurm_env

        print(
            f"slurm:        export SLURM_CONF={slurm_env(box)['SLURM_CONF']}   (then srun, sbatch)"
        )
    for change in box.host_changes:  # the nodes share this machine's ARP table
        print(f"raised:       {change}   (room for every sandbox node's ARP entries)")
    if box.auth == "password":
        print(f"password:     {box.password_file}   (user {SANDBOX_USER})")
        print(f"try:          trainfleet setup ssh -c {box.cluster_file}")
        return 0
    print(f"try:          trainfleet exec -c {box.cluster_file} -- hostname")
    return 0


def _run_down(args: argparse.Namespace) -> int:
    removed = sandbox.down(args.name)
    if args.json:
        print(json.dumps({"name": args.name, "removed": removed}, indent=2))
    elif removed:
        print(f"sandbox {args.name!r} is down ({len(removed)} items removed)")
    else:
        print(f"sandbox {args.name!r} was not up; nothing to remove")
    return 0


def _run_status(args: argparse.Namespace) -> int:
    found = sandbox.status(args.name)
    if found is None:
        if args.json:
            print(json.dumps({"name": args.name, "up": False}))
        else:
            print(f"sandbox {args.name!r} is not up")
        return 1
    box, nodes = found
    if args.json:
        print(
            json.dumps(
                {**box.to_json(), "up": True, "nodes": [n.to_json() for n in nodes]}, indent=2
            )
        )
        return 0
    print(f"sandbox {box.name!r}: {len(nodes)} nodes, {box.subnet}, state in {box.state_dir}")
    for st in nodes:
        state = (
            "up"
            if st.netns_present and st.sshd_running
            else ("no sshd" if st.netns_present else "gone")
        )
        faults = f"  faults: {', '.join(st.faults)}" if st.faults else ""
        print(f"  {st.node.hostname:12} {st.node.address:15} {st.node.ifname:10} {state}{faults}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.name and args.name_arg and args.name != args.name_arg:
        raise SandboxError(
            f"two sandbox names given ({args.name_arg} and --name {args.name})", "give one"
        )
    name = args.name or args.name_arg or sandbox.DEFAULT_NAME
    args = argparse.Namespace(**{**vars(args), "name": name})
    return {"up": _run_up, "down": _run_down, "status": _run_status}[args.action](args)
