"""`trainfleet setup [ssh|hostfile|env|pyenv|firewall|hosts]`: from fresh servers to a clean
doctor.

trainfleet setup -c cluster.yaml --yes          (every step, then the full doctor)
trainfleet setup ssh -c cluster.yaml
trainfleet setup pyenv -c cluster.yaml --venv /opt/envs/train -r requirements.txt
trainfleet setup hostfile --hosts gpu-node-1,gpu-node-2 --out hostfile
trainfleet setup firewall -c cluster.yaml --apply
trainfleet setup hosts -c cluster.yaml --revert
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TextIO

from trainfleet.cli.common import CLUSTER_YAML_EXAMPLE, add_cluster_arguments, cluster_from_args
from trainfleet.cluster import Cluster
from trainfleet.errors import SetupError
from trainfleet.setup.result import Confirm
from trainfleet.setup.steps import BY_NAME, ORDER, StepOptions, step_runner

ALONE = tuple(name for name in ORDER if name != "sync")
"""The steps `trainfleet setup STEP` runs, in setup's order (sync is `trainfleet sync`)."""

HELP = (
    "ssh trust, host keys, hostfile, per-node env, the training environment, firewall rule, "
    "/etc/hosts names c10d looks up: each checked by doctor"
)
DESCRIPTION = """\
What is otherwise done by hand on every node (ssh-copy-id for every pair of nodes, a
hostfile, NCCL_SOCKET_IFNAME per node, pip installs, firewall rules), as commands that show
what they change, change only what is missing (a second run says "nothing changed") and end
with the matching doctor checks.
With no step, every step in this order (firewall with --apply; sync only with --code DIR or
cluster.yaml's workdir:), stopping at the first that fails, then the full doctor. All their
changes are shown first in one list with one question (new host keys keep theirs, with
their fingerprints; --yes: none; --dry-run: only the list):

  ssh       this machine's key (created if missing); every node's host keys shown and
            confirmed, written under every name the node is reached by; every node trusts
            every node, itself included. Where this machine's key is not accepted yet, the
            password is asked once (--password-stdin for scripts) and never kept.
  hostfile  GPUs counted on every node (CPU nodes: --slots); a DeepSpeed hostfile and a
            cluster.yaml written.
  env       each node's interface towards the master, python, CUDA_HOME and what its
            non-interactive PATH lacks, recorded per node in cluster.yaml.
  pyenv     this machine's training environment on every node (torch, deepspeed,
            transformers, ... and -r FILE's packages, what they require, at this machine's
            versions) in --venv PATH (default: this machine's venv path), from wheels
            gathered here and copied over ssh: the nodes need no internet. Nodes that match
            are left alone; a node that cannot take a wheel (its Python, glibc, driver) is
            named and nothing is installed anywhere. cluster.yaml's `python:` points there.
            DeepSpeed's JIT ops (--ds-ops) are built on one node and copied to the others,
            so the first launch compiles nothing.
  firewall  the minimal rule that lets the cluster's nodes reach each other over TCP on the
            data interface, for the active firewall (iptables, nftables, ufw, firewalld);
            printed, or with --apply added (and recorded); --revert removes exactly that.
            A firewall is never disabled.
  hosts     where a node's resolver cannot name the IPv4-mapped addresses c10d looks up
            (doctor's `err=-3` warning: without an answering DNS server every process
            that joins a launch waits out one lookup), a line per address in /etc/hosts
            under a name of its own, e.g. `::ffff:10.0.0.12 gpu-node-2-ipv4-mapped`;
            shown, added, recorded; --revert removes exactly those lines.
  (sync)    `trainfleet sync DIR`: the code directory to the nodes that do not share it.

Every question can be answered up front with --yes; --dry-run shows the changes only."""


# ----------------------------------------------------------------------------- prompts


def make_confirm(yes: bool, out: TextIO, *, replace_changed: bool = False) -> Confirm:
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


def _ssh_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--known-hosts",
        metavar="FILE",
        help="trust the host keys this file holds (checked against what the nodes offer) "
        "instead of asking",
    )
    parser.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the login password from stdin's first line (used once, never kept; new host "
        "keys then need --yes or --known-hosts)",
    )
    parser.add_argument(
        "--replace-changed-host-keys",
        action="store_true",
        help="replace known_hosts entries whose key CHANGED (a reinstalled node, or someone in "
        "between): only after comparing the fingerprints; --yes never does",
    )


def _pyenv_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--venv",
        metavar="PATH",
        help="where the nodes get the environment (default: this machine's venv path)",
    )
    parser.add_argument(
        "-r",
        "--requirements",
        metavar="FILE",
        help="your project's requirements too (at the versions installed here)",
    )
    parser.add_argument(
        "--wheels",
        action="append",
        default=[],
        metavar="DIR",
        help="wheel files to use as they are (repeatable; pip's find-links are used too; other"
        " packages are packed from what is installed here)",
    )
    parser.add_argument(
        "--ds-ops",
        metavar="NAMES",
        help="DeepSpeed's JIT ops to build during setup, on one node, copied to the others "
        "(comma-separated builder names, e.g. fused_adam,cpu_adam; default: fused_adam, plus "
        "deepspeed_shm_comm with a CPU torch; none: leave them to the first launch)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # No step: every step (these options are theirs), then the full doctor.
    _common(parser)
    _ssh_arguments(parser)
    _pyenv_arguments(parser)
    parser.add_argument(
        "--out", metavar="FILE", help="the hostfile to write (default: next to -c, else ./hostfile)"
    )
    parser.add_argument("--slots", type=int, metavar="N", help="slots of nodes without GPUs")
    parser.add_argument(
        "--code",
        metavar="DIR",
        help="the code directory to copy to nodes that do not share it (default: cluster.yaml's"
        " workdir; neither: no sync)",
    )
    sub = parser.add_subparsers(dest="step", metavar="|".join(ALONE))
    steps = []
    steps.append(ssh := sub.add_parser("ssh", help=BY_NAME["ssh"].help))
    _common(ssh)
    _ssh_arguments(ssh)
    steps.append(hostfile := sub.add_parser("hostfile", help=BY_NAME["hostfile"].help))
    _common(hostfile)
    hostfile.add_argument(
        "--out", metavar="FILE", help="the hostfile to write (default: next to -c, else ./hostfile)"
    )
    hostfile.add_argument(
        "--cluster-out",
        metavar="FILE",
        help="cluster.yaml to write (default: the one given with -c, else cluster.yaml next to "
        "--out)",
    )
    hostfile.add_argument("--slots", type=int, metavar="N", help="slots of nodes without GPUs")
    steps.append(env := sub.add_parser("env", help=BY_NAME["env"].help))
    _common(env)
    env.add_argument(
        "--cluster-out", metavar="FILE", help="default: the -c file, else ./cluster.yaml"
    )
    steps.append(pyenv := sub.add_parser("pyenv", help=BY_NAME["pyenv"].help))
    _common(pyenv)
    _pyenv_arguments(pyenv)
    pyenv.add_argument(
        "--package",
        action="append",
        default=[],
        metavar="NAME",
        help="one more package installed here to put on the nodes (repeatable)",
    )
    pyenv.add_argument(
        "--cluster-out", metavar="FILE", help="default: the -c file, else ./cluster.yaml"
    )
    steps.append(firewall := sub.add_parser("firewall", help=BY_NAME["firewall"].help))
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
    steps.append(hosts := sub.add_parser("hosts", help=BY_NAME["hosts"].help))
    _common(hosts)
    hosts.add_argument("--revert", action="store_true", help="remove the lines it added")
    hosts.add_argument(
        "--state",
        metavar="FILE",
        help="where it records the lines it added (default: CLUSTER.yaml.hosts.json next to -c,"
        " else ~/.trainfleet/hosts.json)",
    )
    for step in steps:
        _keep_given_before_the_step(parser, step)


def _keep_given_before_the_step(
    parser: argparse.ArgumentParser, step: argparse.ArgumentParser
) -> None:
    """`setup -c x.yaml ssh` means `setup ssh -c x.yaml`: argparse lets a step's own defaults
    overwrite what was given before it, so the options both have (with the same default) are
    left out of the step's namespace unless given after it."""
    before = {a.dest: a.default for a in parser._actions}
    for action in step._actions:
        if action.dest != "help" and before.get(action.dest, ...) == action.default:
            action.default = argparse.SUPPRESS


# ----------------------------------------------------------------------------- run


def step_options(args: argparse.Namespace) -> StepOptions:
    """The steps' options from the flags given; a flag the step's parser lacks keeps the
    default `trainfleet setup` runs that step with (the firewall rule applied, no --revert)."""
    given = vars(args)
    mode = "apply"  # `trainfleet setup`: the rule is added, its one question covers it
    if args.step == "firewall":
        mode = "apply" if args.apply else "revert" if args.revert else "print"
    return StepOptions(
        known_hosts=given.get("known_hosts"),
        password=make_password(given.get("password_stdin", False)),
        hostfile_out=given.get("out"),
        cluster_out=given.get("cluster_out"),
        cpu_slots=given.get("slots"),
        venv=given.get("venv"),
        requirements=given.get("requirements"),
        wheel_dirs=given.get("wheels") or (),
        packages=given.get("package") or (),
        ds_ops=given.get("ds_ops"),
        firewall_mode=mode,
        revert=args.step == "hosts" and args.revert,
        state_file=given.get("state"),
        code_dir=given.get("code"),
    )


def _every(args: argparse.Namespace, out: TextIO) -> int:
    from trainfleet.setup import every

    if not (args.cluster_file or args.hostfile or args.hosts):
        raise SetupError(
            "trainfleet setup with no step sets up a cluster: no nodes were named",
            "name them: `trainfleet setup -c cluster.yaml` (or --hostfile FILE, or --hosts a,b),"
            " or run one step, e.g. `trainfleet setup ssh --help`",
        )
    confirm = make_confirm(args.yes, out, replace_changed=args.replace_changed_host_keys)
    given = args.cluster_file

    def load(path: str | None) -> Cluster:
        if path is None or path == given:
            return cluster_from_args(args)
        # the file the hostfile step wrote from --hosts/--hostfile: only the chosen nodes
        chosen = {"include": "", "exclude": "", "num_nodes": None, "num_gpus": None}
        return cluster_from_args(
            argparse.Namespace(
                **{**vars(args), **chosen, "hostfile": None, "hosts": None, "cluster_file": path}
            )  # fmt: skip
        )

    options = step_options(args)
    asked, known = options.password, {}

    def password(nodes: list[str]) -> str:  # asked once (a dry run first may need it too)
        if "password" not in known:
            known["password"] = asked(nodes)
        return known["password"]

    options.password = password
    run_step = step_runner(options)
    how = {"load": load, "cluster_file": given, "run_step": run_step, "code_dir": args.code,
           "venv": args.venv}  # fmt: skip
    if args.yes or args.dry_run:
        run = every.setup_every(**how, confirm=lambda step: confirm, dry_run=args.dry_run)
    else:  # every change in one list, one question
        run = every.setup_asking_once(**how, confirm=confirm)
    print(json.dumps(run.to_json(), indent=2) if args.json else every.render(run))
    return run.exit_code


def run(args: argparse.Namespace) -> int:
    from trainfleet.setup.result import render

    out = sys.stderr if args.json else sys.stdout
    if args.step is None:
        return _every(args, out)
    replace_changed = vars(args).get("replace_changed_host_keys", False)
    result = BY_NAME[args.step].run(
        cluster_from_args(args),
        step_options(args),
        cluster_file=args.cluster_file,
        dry_run=args.dry_run,
        confirm=make_confirm(args.yes, out, replace_changed=replace_changed),
    )
    print(json.dumps(result.to_json(), indent=2) if args.json else render(result))
    return result.exit_code
