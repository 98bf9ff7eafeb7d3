"""`trainfleet setup ssh|hostfile|env|firewall`: from fresh servers to a clean doctor.

trainfleet setup ssh -c cluster.yaml
trainfleet setup hostfile --hosts gpu-node-1,gpu-node-2 --out hostfile
trainfleet setup firewall -c cluster.yaml --apply
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from trainfleet.cli.common import CLUSTER_YAML_EXAMPLE, add_cluster_arguments, cluster_from_args
from trainfleet.errors import SetupError

HELP = "ssh trust, host keys, hostfile, per-node env, firewall rule: each checked by doctor"
DESCRIPTION = """\
What the seeds do by hand, as commands that show what they change, change only what is
missing (a second run says "nothing changed") and end with the matching doctor checks:

  ssh       this machine's key (created if missing); every node's host keys shown and
            confirmed, written under every name the node is reached by; every node trusts
            every node, itself included. Where this machine's key is not accepted yet, the
            password is asked once (--password-stdin for scripts) and never kept.
  hostfile  GPUs counted on every node (CPU nodes: --slots); a DeepSpeed hostfile and a
            cluster.yaml written.
  env       each node's interface towards the master, python, CUDA_HOME and what its
            non-interactive PATH lacks, recorded per node in cluster.yaml.
  firewall  the minimal rule that lets the cluster's nodes reach each other over TCP on the
            data interface, for the active firewall (iptables, nftables, ufw, firewalld);
            printed, or with --apply added (and recorded); --revert removes exactly that.
            A firewall is never disabled.

Every question can be answered up front with --yes; --dry-run shows the changes only."""


# ----------------------------------------------------------------------------- prompts


def make_confirm(yes: bool, out, *, replace_changed: bool = False) -> Callable[..., bool]:
    """Show the question with its details; yes for --yes (for changed host keys only with
    --replace-changed-host-keys), ask on a terminal, else no."""

    def confirm(question: str, changed_keys: bool = False) -> bool:
        print(question, file=out, flush=True)
        if changed_keys and replace_changed:
            print("yes (--replace-changed-host-keys)", file=out)
            return True
        if yes and not changed_keys:
            print("yes (--yes)", file=out)
            return True
        if not sys.stdin.isatty():
            why = "pass --yes"
            if changed_keys:
                why = (
                    "--yes does not replace CHANGED host keys: compare the fingerprints on the"
                    " nodes' consoles, then pass --replace-changed-host-keys"
                )
            print(f"not a terminal: not confirmed; nothing was changed ({why})", file=out)
            return False
        try:
            return input("[y/N] ").strip().lower() in ("y", "yes")
        except EOFError:
            return False

    return confirm


def make_password(from_stdin: bool) -> Callable[[list[str]], str]:
    def password(nodes: list[str]) -> str:
        from trainfleet.nodeset import fold_names

        where = fold_names(nodes)
        if from_stdin:
            secret = sys.stdin.readline().rstrip("\r\n")
            if not secret:
                raise SetupError(
                    "--password-stdin: no password on stdin",
                    "pipe it in, e.g. `trainfleet setup ssh ... --password-stdin < password-file`",
                )
            return secret
        if not sys.stdin.isatty():
            raise SetupError(
                f"{where} do(es) not accept this machine's key yet, and there is no terminal to "
                "ask for the password",
                "run it in a terminal, or pass the password with --password-stdin",
            )
        import getpass

        return getpass.getpass(
            f"password on {where} (used once to install the key there, never kept): "
        )

    return password


# ----------------------------------------------------------------------------- arguments


def _common(parser: argparse.ArgumentParser, *, cluster: bool = True) -> None:
    if cluster:
        add_cluster_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="show the changes, make none")
    parser.add_argument("-y", "--yes", action="store_true", help="answer yes to every question")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.epilog = CLUSTER_YAML_EXAMPLE
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="step", required=True, metavar="ssh|hostfile|env|firewall")
    ssh = sub.add_parser("ssh", help="every node trusts every node (keys, host keys)")
    _common(ssh)
    ssh.add_argument(
        "--known-hosts",
        metavar="FILE",
        help="trust the host keys this file holds (checked against what the nodes offer) "
        "instead of asking",
    )
    ssh.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the login password from stdin's first line (used once, never kept; new host "
        "keys then need --yes or --known-hosts)",
    )
    ssh.add_argument(
        "--replace-changed-host-keys",
        action="store_true",
        help="replace known_hosts entries whose key CHANGED (a reinstalled node, or someone in "
        "between): only after comparing the fingerprints; --yes never does",
    )
    hostfile = sub.add_parser("hostfile", help="count GPUs, write a hostfile and cluster.yaml")
    _common(hostfile)
    hostfile.add_argument("--out", default="hostfile", metavar="FILE", help="default: hostfile")
    hostfile.add_argument(
        "--cluster-out",
        metavar="FILE",
        help="cluster.yaml to write (default: the one given with -c, else cluster.yaml next to "
        "--out)",
    )
    hostfile.add_argument("--slots", type=int, metavar="N", help="slots of nodes without GPUs")
    env = sub.add_parser("env", help="record each node's interface, python, CUDA_HOME, PATH")
    _common(env)
    env.add_argument(
        "--cluster-out", metavar="FILE", help="default: the -c file, else ./cluster.yaml"
    )
    firewall = sub.add_parser("firewall", help="the rule that lets the nodes reach each other")
    _common(firewall)
    what = firewall.add_mutually_exclusive_group()
    what.add_argument("--apply", action="store_true", help="add the rule (after showing it)")
    what.add_argument("--revert", action="store_true", help="remove what --apply added")
    firewall.add_argument(
        "--state",
        metavar="FILE",
        help="where --apply records what it added (default: CLUSTER.yaml.firewall.json next to "
        "-c, else ~/.trainfleet/firewall.json)",
    )


# ----------------------------------------------------------------------------- run


def _ssh(args: argparse.Namespace, out):
    from trainfleet.setup.trust import setup_ssh

    return setup_ssh(
        cluster_from_args(args),
        confirm=make_confirm(args.yes, out, replace_changed=args.replace_changed_host_keys),
        password=make_password(args.password_stdin),
        trusted_file=args.known_hosts,
        dry_run=args.dry_run,
    )


def _hostfile(args: argparse.Namespace, out):
    from trainfleet.setup.hostfile import setup_hostfile

    return setup_hostfile(
        cluster_from_args(args),
        hostfile_out=args.out,
        cluster_in=args.cluster_file,
        cluster_out=args.cluster_out,
        cpu_slots=args.slots,
        dry_run=args.dry_run,
    )


def _env(args: argparse.Namespace, out):
    from trainfleet.setup.env import setup_env

    return setup_env(
        cluster_from_args(args),
        cluster_in=args.cluster_file,
        cluster_out=args.cluster_out,
        dry_run=args.dry_run,
    )


def _firewall(args: argparse.Namespace, out):
    from trainfleet.setup.fwapply import setup_firewall

    return setup_firewall(
        cluster_from_args(args),
        mode="apply" if args.apply else "revert" if args.revert else "print",
        state_file=args.state,
        cluster_in=args.cluster_file,
        confirm=make_confirm(args.yes, out),
        dry_run=args.dry_run,
    )


def run(args: argparse.Namespace) -> int:
    from trainfleet.setup.result import render

    out = sys.stderr if args.json else sys.stdout
    steps = {"ssh": _ssh, "hostfile": _hostfile, "env": _env, "firewall": _firewall}
    result = steps[args.step](args, out)
    print(json.dumps(result.to_json(), indent=2) if args.json else render(result))
    return result.exit_code
