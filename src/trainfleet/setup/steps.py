"""The setup steps, in the order `trainfleet setup` runs them, and how each one runs: the one
table that `trainfleet setup` (every step, `setup.every`), `trainfleet setup STEP`, its
`--help` and the catalog's fix commands read.

    >>> [step.name for step in STEPS]
    ['ssh', 'hostfile', 'env', 'pyenv', 'firewall', 'hosts', 'sync']
    >>> BY_NAME["firewall"].command, BY_NAME["sync"].command
    ('setup firewall', 'sync')
    >>> hostfile_out(StepOptions(), "/etc/cluster/cluster.yaml")
    '/etc/cluster/hostfile'

Each step builds on the ones before it (the hostfile step counts GPUs over the ssh trust the
ssh step sets up; pyenv and sync copy over it; firewall and hosts read the interfaces env
recorded). A step's module is imported when it runs: `--help` imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainfleet.cluster import Cluster
from trainfleet.errors import SetupError
from trainfleet.setup.result import Confirm, SetupResult


def no_password(nodes: list[str]) -> str:
    """StepOptions' password when none was given: nothing to ask it with."""
    from trainfleet.nodeset import fold_names

    raise SetupError(
        f"{fold_names(nodes)} do(es) not accept this machine's key yet, and no way to ask for "
        "the password was given",
        "run `trainfleet setup ssh` in a terminal, or pass the password with --password-stdin",
    )


@dataclass(kw_only=True, slots=True)
class StepOptions:
    """What the user gave the steps (their flags); what a step does not read is ignored.
    The defaults are `trainfleet setup`'s (every step)."""

    known_hosts: str | None = None
    """ssh: trust the host keys this file holds instead of asking."""
    password: Callable[[list[str]], str] = no_password
    """ssh: asks the login password once, for the nodes that do not take this machine's key
    (`trainfleet setup`'s flags always give one; the default raises SetupError)."""
    hostfile_out: str | None = None
    """hostfile: the hostfile to write (default: next to the cluster file, else ./hostfile)."""
    cluster_out: str | None = None
    """hostfile, env, pyenv: the cluster.yaml to write (default: the one given)."""
    cpu_slots: int | None = None
    """hostfile: slots of nodes without GPUs."""
    venv: str | None = None
    """pyenv: where the nodes get the environment (default: this machine's venv path)."""
    requirements: str | None = None
    wheel_dirs: Sequence[str] = ()
    packages: Sequence[str] = ()
    ds_ops: str | None = None
    firewall_mode: str = "apply"
    """firewall: print, apply or revert (`trainfleet setup` applies: its one question covers
    it)."""
    revert: bool = False
    """hosts: remove the lines it added."""
    state_file: str | None = None
    """firewall, hosts: where what was added is recorded."""
    code_dir: str | None = None
    """sync: the code directory (default: cluster.yaml's workdir)."""


class RunStep(Protocol):
    """How a step runs: its library function called with what `options` holds for it."""

    def __call__(
        self,
        cluster: Cluster,
        options: StepOptions,
        /,
        *,
        cluster_file: str | None,
        dry_run: bool,
        confirm: Confirm,
    ) -> SetupResult: ...


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    help: str
    """One line for `trainfleet setup --help`'s list of steps."""
    run: RunStep

    @property
    def command(self) -> str:
        """The trainfleet command that runs this step alone."""
        return self.name if self.name == "sync" else f"setup {self.name}"


def hostfile_out(options: StepOptions, cluster_file: str | None) -> str:
    """Where the hostfile step writes: --out, else next to the cluster file, else ./hostfile."""
    if options.hostfile_out:
        return options.hostfile_out
    return str(Path(cluster_file).parent / "hostfile") if cluster_file else "hostfile"


def _ssh(
    cluster: Cluster,
    options: StepOptions,
    *,
    cluster_file: str | None,
    dry_run: bool,
    confirm: Confirm,
) -> SetupResult:
    from trainfleet.setup.trust import setup_ssh

    return setup_ssh(cluster, confirm=confirm, password=options.password,
                     trusted_file=options.known_hosts, dry_run=dry_run)  # fmt: skip


def _hostfile(
    cluster: Cluster,
    options: StepOptions,
    *,
    cluster_file: str | None,
    dry_run: bool,
    confirm: Confirm,
) -> SetupResult:
    from trainfleet.setup.hostfile import setup_hostfile

    return setup_hostfile(cluster, hostfile_out=hostfile_out(options, cluster_file),
                          cluster_in=cluster_file, cluster_out=options.cluster_out,
                          cpu_slots=options.cpu_slots, dry_run=dry_run)  # fmt: skip


def _env(
    cluster: Cluster,
    options: StepOptions,
    *,
    cluster_file: str | None,
    dry_run: bool,
    confirm: Confirm,
) -> SetupResult:
    from trainfleet.setup.env import setup_env

    return setup_env(cluster, cluster_in=cluster_file, cluster_out=options.cluster_out,
                     dry_run=dry_run)  # fmt: skip


def _pyenv(
    cluster: Cluster,
    options: StepOptions,
    *,
    cluster_file: str | None,
    dry_run: bool,
    confirm: Confirm,
) -> SetupResult:
    from trainfleet.setup.pyenv import setup_pyenv

    return setup_pyenv(cluster, target=options.venv, packages=list(options.packages),
                       requirements=options.requirements, wheel_dirs=list(options.wheel_dirs),
                       confirm=confirm, cluster_in=cluster_file, cluster_out=options.cluster_out,
                       dry_run=dry_run, ds_ops=options.ds_ops)  # fmt: skip


def _firewall(
    cluster: Cluster,
    options: StepOptions,
    *,
    cluster_file: str | None,
    dry_run: bool,
    confirm: Confirm,
) -> SetupResult:
    from trainfleet.setup.fwapply import setup_firewall

    return setup_firewall(cluster, mode=options.firewall_mode, state_file=options.state_file,
                          cluster_in=cluster_file, confirm=confirm, dry_run=dry_run)  # fmt: skip


def _hosts(
    cluster: Cluster,
    options: StepOptions,
    *,
    cluster_file: str | None,
    dry_run: bool,
    confirm: Confirm,
) -> SetupResult:
    from trainfleet.setup.etchosts import setup_hosts

    return setup_hosts(cluster, revert=options.revert, state_file=options.state_file,
                       cluster_in=cluster_file, confirm=confirm, dry_run=dry_run)  # fmt: skip


def _sync(
    cluster: Cluster,
    options: StepOptions,
    *,
    cluster_file: str | None,
    dry_run: bool,
    confirm: Confirm,
) -> SetupResult:
    from trainfleet.setup.sync import sync_code

    directory = options.code_dir or cluster.workdir
    if directory is None:  # setup.every skips the step then; a caller of the table may not
        raise SetupError(
            "no code directory named",
            "pass --code DIR (or set `workdir:` in cluster.yaml)",
        )
    return sync_code(cluster, directory, confirm=confirm, dry_run=dry_run)


STEPS: tuple[Step, ...] = (
    Step("ssh", "every node trusts every node (keys, host keys)", _ssh),
    Step("hostfile", "count GPUs, write a hostfile and cluster.yaml", _hostfile),
    Step("env", "record each node's interface, python, CUDA_HOME, PATH", _env),
    Step("pyenv", "this machine's training packages on every node, same versions", _pyenv),
    Step("firewall", "the rule that lets the nodes reach each other", _firewall),
    Step("hosts", "/etc/hosts names for the addresses c10d looks up", _hosts),
    Step("sync", "the code directory to the nodes that do not share it", _sync),
)
"""Every step, in the order `trainfleet setup` runs them."""
BY_NAME = {step.name: step for step in STEPS}
ORDER = tuple(step.name for step in STEPS)


def step_runner(options: StepOptions) -> Callable[..., SetupResult]:
    """run_step(name, cluster, cluster_file, *, dry_run, confirm) with `options`: what
    `setup.every` calls for each step."""

    def run_step(
        name: str, cluster: Cluster, cluster_file: str | None, *, dry_run: bool, confirm: Confirm
    ) -> SetupResult:
        return BY_NAME[name].run(cluster, options, cluster_file=cluster_file, dry_run=dry_run,
                                 confirm=confirm)  # fmt: skip

    return run_step
