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


@dataclass(frozen=True, slots=True)
class StepCall:
    """One step's run: the cluster, the user's options and how the run goes."""

    cluster: Cluster
    options: StepOptions
    cluster_file: str | None
    dry_run: bool
    confirm: Confirm


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    help: str
    """One line for `trainfleet setup --help`'s list of steps."""
    body: Callable[[StepCall], SetupResult]
    """Its library function called with what the options hold for it."""

    @property
    def command(self) -> str:
        """The trainfleet command that runs this step alone."""
        return self.name if self.name == "sync" else f"setup {self.name}"

    def run(
        self,
        cluster: Cluster,
        options: StepOptions,
        *,
        cluster_file: str | None,
        dry_run: bool,
        confirm: Confirm,
    ) -> SetupResult:
        return self.body(StepCall(cluster, options, cluster_file, dry_run, confirm))


def hostfile_out(options: StepOptions, cluster_file: str | None) -> str:
    """Where the hostfile step writes: --out, else next to the cluster file, else ./hostfile."""
    if options.hostfile_out:
        return options.hostfile_out
    return str(Path(cluster_file).parent / "hostfile") if cluster_file else "hostfile"


def _ssh(call: StepCall) -> SetupResult:
    from trainfleet.setup.trust.step import setup_ssh

    return setup_ssh(
        call.cluster,
        confirm=call.confirm,
        password=call.options.password,
        trusted_file=call.options.known_hosts,
        dry_run=call.dry_run,
    )


def _hostfile(call: StepCall) -> SetupResult:
    from trainfleet.setup.hostfile import setup_hostfile

    return setup_hostfile(
        call.cluster,
        hostfile_out=hostfile_out(call.options, call.cluster_file),
        cluster_in=call.cluster_file,
        cluster_out=call.options.cluster_out,
        cpu_slots=call.options.cpu_slots,
        dry_run=call.dry_run,
    )


def _env(call: StepCall) -> SetupResult:
    from trainfleet.setup.env import setup_env

    return setup_env(
        call.cluster,
        cluster_in=call.cluster_file,
        cluster_out=call.options.cluster_out,
        dry_run=call.dry_run,
    )


def _pyenv(call: StepCall) -> SetupResult:
    from trainfleet.setup.pyenv.step import setup_pyenv

    return setup_pyenv(
        call.cluster,
        target=call.options.venv,
        packages=list(call.options.packages),
        requirements=call.options.requirements,
        wheel_dirs=list(call.options.wheel_dirs),
        confirm=call.confirm,
        cluster_in=call.cluster_file,
        cluster_out=call.options.cluster_out,
        dry_run=call.dry_run,
        ds_ops=call.options.ds_ops,
    )


def _firewall(call: StepCall) -> SetupResult:
    from trainfleet.setup.firewall.apply import setup_firewall

    return setup_firewall(
        call.cluster,
        mode=call.options.firewall_mode,
        state_file=call.options.state_file,
        cluster_in=call.cluster_file,
        confirm=call.confirm,
        dry_run=call.dry_run,
    )


def _hosts(call: StepCall) -> SetupResult:
    from trainfleet.setup.etchosts import setup_hosts

    return setup_hosts(
        call.cluster,
        revert=call.options.revert,
        state_file=call.options.state_file,
        cluster_in=call.cluster_file,
        confirm=call.confirm,
        dry_run=call.dry_run,
    )


def _sync(call: StepCall) -> SetupResult:
    from trainfleet.setup.sync.step import sync_code

    directory = call.options.code_dir or call.cluster.workdir
    if directory is None:  # setup.every skips the step then; a caller of the table may not
        raise SetupError(
            "no code directory named",
            "pass --code DIR (or set `workdir:` in cluster.yaml)",
        )
    return sync_code(call.cluster, directory, confirm=call.confirm, dry_run=call.dry_run)


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
