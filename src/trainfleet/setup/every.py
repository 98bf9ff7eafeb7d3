"""`trainfleet setup` with no step: every step in order, then the full doctor.

    >>> run = setup_every(load, confirm=..., password=..., ...)  # doctest: +SKIP
    >>> run.exit_code  # doctest: +SKIP
    0

ssh, hostfile, env, pyenv (only when there is an environment path: --venv PATH, or the venv
trainfleet runs in), firewall (`--apply`: only where doctor finds ports blocked), hosts (only
where doctor finds c10d's IPv4-mapped names missing), sync (only for a code directory the user
named, `--code DIR` or cluster.yaml's `workdir:`: sync deletes what the nodes' copy has and
this one has not), then a full doctor. Each step is the one
`trainfleet setup STEP` runs, changes only what is missing and shows its changes before it
makes them. The cluster file the hostfile step writes is the one every later step reads
(`load`). A step that cannot finish, or ends with an error, stops the run there: the next
ones build on it (the hostfile step counts GPUs over the ssh trust the ssh step sets up).

With `dry_run` every step only shows what it would change; a step that cannot look before an
earlier one has made its changes (no ssh trust yet) says so, and the run goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainfleet.cluster import Cluster
from trainfleet.doctor import DoctorReport, run_doctor
from trainfleet.doctor.findings import Severity
from trainfleet.errors import SetupError
from trainfleet.setup.pyenv.step import default_target
from trainfleet.setup.result import Confirm, SetupResult
from trainfleet.setup.steps import ORDER as STEPS

RunStep = Callable[..., SetupResult]
"""run_step(step, cluster, cluster_file, *, dry_run, confirm) -> the step's result."""
Load = Callable[[str | None], Cluster]
"""load(cluster_file): the cluster as the user named it (None), or from the file a step
wrote."""


@dataclass(kw_only=True, slots=True)
class SetupRun:
    results: list[SetupResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """Steps not run, with why."""
    stopped: tuple[str, SetupError] | None = None
    """The step that could not finish, and its error."""
    doctor: DoctorReport | None = None
    dry_run: bool = False

    @property
    def changed(self) -> bool:
        return any(r.changes for r in self.results) and not self.dry_run

    @property
    def exit_code(self) -> int:
        if self.stopped or any(r.exit_code for r in self.results):
            return 1
        return self.doctor.exit_code if self.doctor else 0

    def to_json(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "changed": self.changed,
            "steps": [r.to_json() for r in self.results],
            "skipped": self.skipped,
            "stopped": None
            if self.stopped is None
            else {
                "step": self.stopped[0],
                "error": self.stopped[1].what,
                "fix": self.stopped[1].fix,
            },  # fmt: skip
            "doctor": self.doctor.to_json() if self.doctor else None,
            "exit_code": self.exit_code,
        }


def setup_every(
    load: Load,
    *,
    cluster_file: str | None,
    confirm: Callable[[str], Confirm],
    run_step: RunStep,
    code_dir: str | None,
    venv: str | None = None,
    dry_run: bool = False,
) -> SetupRun:
    """Every step in STEPS order (`run_step` runs one), then the full doctor on what they
    left. `confirm` answers the steps' questions; `confirm_for(step)` in place of it, where
    given, per step."""
    run = SetupRun(dry_run=dry_run)
    cluster = load(cluster_file)
    for step in STEPS:
        if step == "sync" and not (code_dir or cluster.workdir):
            run.skipped[step] = (
                "no code directory named: pass --code DIR (or set `workdir:` in cluster.yaml) to"
                " copy it to the nodes that do not share it"
            )
            continue
        if step == "pyenv" and not (venv or default_target()):
            run.skipped[step] = (
                "trainfleet does not run in a venv here: pass --venv PATH to put this machine's "
                "training environment there on every node"
            )
            continue
        started = time.monotonic()
        try:
            result = run_step(step, cluster, cluster_file, dry_run=dry_run, confirm=confirm(step))
        except SetupError as exc:
            if dry_run and step != "ssh":
                run.skipped[step] = f"cannot look yet: {exc.what} ({exc.fix})"
                continue
            run.stopped = (step, exc)
            return run
        result.seconds = time.monotonic() - started  # the time its questions waited too
        run.results.append(result)
        if result.exit_code and not dry_run:
            return run  # its findings say what is wrong; the next steps build on it
        written = result.files.get("cluster")
        if written and not dry_run:
            cluster_file = written
            cluster = load(cluster_file)
    if not dry_run:
        run.doctor = run_doctor(cluster)
    return run


def setup_asking_once(
    load: Load,
    *,
    cluster_file: str | None,
    confirm: Confirm,
    run_step: RunStep,
    code_dir: str | None,
    venv: str | None = None,
) -> SetupRun:
    """Every step shown first (a dry run of all of them), one question for the lot, then the
    run. A step that could not be looked at before an earlier one's changes (nothing trusts
    this machine's key yet) still asks its own question when it comes: its changes were not
    in the list. So does ssh's question about the nodes' host keys (it shows their
    fingerprints, which the list does not), and replacing CHANGED ones."""
    preview = setup_every(
        load, cluster_file=cluster_file, confirm=lambda step: confirm, run_step=run_step,
        code_dir=code_dir, venv=venv, dry_run=True,
    )  # fmt: skip
    if preview.stopped:
        return preview
    # New host keys are trusted on their own question, which shows their fingerprints.
    shown = {r.step for r in preview.results} - {"ssh"}
    listed = change_list(preview)
    if listed and not confirm("\n".join(["trainfleet setup will make these changes:", *listed,
                                         "go ahead?"])):  # fmt: skip
        refused = SetupError("not confirmed; nothing was changed",
                             "run again and answer yes, or pass --yes")  # fmt: skip
        preview.stopped = ("setup", refused)
        return preview

    def after_the_one_yes(question: str, changed_keys: bool = False) -> bool:
        return confirm(question, changed_keys=True) if changed_keys else True

    return setup_every(
        load, cluster_file=cluster_file, run_step=run_step, code_dir=code_dir, venv=venv,
        confirm=lambda step: after_the_one_yes if step in shown else confirm,
    )  # fmt: skip


def change_list(preview: SetupRun) -> list[str]:
    """The changes a dry run of every step found, one line each, and the steps it could not
    look at."""
    from trainfleet.setup.result import folded_changes

    lines = []
    for result in preview.results:
        lines += [f"  {result.step}: {line.strip()}" for line in folded_changes(result.changes)]
    for step, why in preview.skipped.items():
        if why.startswith("cannot look yet"):
            lines.append(f"  {step}: cannot look before the steps above have made their changes;"
                         " it asks on its own when it comes")  # fmt: skip
    return lines


def render(run: SetupRun) -> str:
    from trainfleet.doctor.report import finding_lines
    from trainfleet.setup.result import render as render_step

    lines = []
    for result in run.results:
        lines += [render_step(result), ""]
    for step, why in run.skipped.items():
        lines += [f"trainfleet setup {step}: skipped: {why}", ""]
    if run.stopped:
        step, exc = run.stopped
        lines += [f"trainfleet setup {step}: {exc.what}", f"  fix: {exc.fix}"]
        lines.append("stopped there: the steps after it build on it")
        return "\n".join(lines)
    failed = next((r for r in run.results if r.exit_code), None)
    if failed:
        lines.append(f"stopped after `setup {failed.step}`: fix what its checks found, then run "
                     "`trainfleet setup` again")  # fmt: skip
        return "\n".join(lines)
    if run.doctor:
        shown = [f for f in run.doctor.findings if f.severity > Severity.INFO]
        head = f"doctor (full, {run.doctor.seconds:.1f} s): "
        if not shown:
            lines.append(head + "no problems found")
        else:
            lines.append(head + f"{len(shown)} problem(s):")
            for finding in shown:
                lines += finding_lines(finding, indent="  ", max_evidence=6)
    if run.dry_run:
        lines.append("trainfleet setup (dry run): nothing was changed")
    else:
        lines.append("trainfleet setup: " + ("changes made" if run.changed else "nothing changed"))
    return "\n".join(lines)
