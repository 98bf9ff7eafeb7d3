"""Runs in every rank ahead of the user's script (stdlib only, Python 3.8 syntax).

    torchrun ... /tmp/trainfleet-x/shim.py train.py --lr 1e-4
    torchrun ... /tmp/trainfleet-x/shim.py -m my_pkg.train --lr 1e-4

It reports, on stderr, when the rank started, entered `torch.distributed.init_process_group`
and came out of it (what the launcher's join watchdog counts), every minute that it waits
for torch's JIT build lock (see wrap_baton), a heartbeat at every step of a Hugging Face
Trainer (see wrap_trainer), and its Flight Recorder records when a hang report asks (see
answer_flight_record_requests); it adds `--local_rank=N` for
scripts that expect the argument (seed 004: DeepSpeed's runner passes it, torchrun does not),
then runs the script as `__main__`: its exceptions, exit codes and output are its own. A
script that succeeded without `destroy_process_group()` gets it called for it (see
release_process_group).

What runs: `-m MODULE` and `*.py` files with runpy, in this process. Any other first word is
looked up as torchrun's --no-python would (a path, else the node's PATH): a console script of
this very python (pip's `#!/venv/bin/python` wrappers: llamafactory-cli, axolotl, trl) still
runs in this process, so that its joins are seen; anything else (a shell script, another
interpreter's program, a binary) runs as this process's child with the torchrun environment,
and its exit code is the rank's.
TRAINFLEET_NO_PYTHON=1 makes every command such an executable. A first word found nowhere ends
the rank with 127, as a shell would, naming the node's PATH.

Environment it reads: TRAINFLEET_RUN_ID (marks lines as this run's), TRAINFLEET_LOCAL_RANK_ARG
(auto | always | never), TRAINFLEET_NODE_ENV (optional JSON file: per node, its ranks and the
file beside it with its variables to set before the script runs; how the deepspeed backend gives
each node its own environment),
TRAINFLEET_PREFIX_OUTPUT=1 (prefix every output line with `[defaultN]:`, N the local rank, as
torchrun's --tee does; for DeepSpeed's launcher, which gives a node's ranks one stdout),
TRAINFLEET_JIT_LOCK_REPORT_S (seconds between the lock-wait reports; default 60).

It is one file on purpose, the one node module that imports no other: its source is written on
the node as DIR/shim.py and run by the launcher as a script, on nodes where trainfleet may not be
installed (or is another version), ahead of the user's own imports.
"""

import atexit
import contextlib
import functools
import gc
import importlib.abc
import importlib.util
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List

MARK = "@@trainfleet"

# The rank contract: the variables the launch side's plans set on every rank
# (trainfleet.launch.backends.ssh and .deepspeed), named here only.
RUN_ID_ENV = "TRAINFLEET_RUN_ID"
"""This run's id: marks the shim's lines and the run's processes (`procs.kill_run`)."""
RESTART_ENV = "TRAINFLEET_RESTART"
"""How many times the run was started again (`--max-restarts`): for the user's script."""
LOCAL_RANK_ARG_ENV = "TRAINFLEET_LOCAL_RANK_ARG"
"""auto | always | never: whether the script gets `--local_rank=N`."""
NO_PYTHON_ENV = "TRAINFLEET_NO_PYTHON"
"""1: every command runs as an executable, never in this process (`launch --no-python`)."""
PREEMPT_SIGNAL_ENV = "TRAINFLEET_PREEMPT_SIGNAL"
"""USR1 under `--requeue`: the signal each rank gets before the Slurm job's time limit. The
script saves a checkpoint and exits 0; the job is requeued and the script, started again with
TRAINFLEET_RESTART=N, resumes from it. `trainfleet train` does this itself."""


def mark(event):
    sys.stderr.write(
        "%s:%s:%s:%s\n"
        % (MARK, os.environ.get(RUN_ID_ENV, "-"), event, os.environ.get("RANK", "?"))
    )
    sys.stderr.flush()


SCRIPT: Dict[str, Any] = {}
"""`module`: the script's namespace, as init_process_group saw it; `succeeded`: it ended 0."""


def wrap_init(dist):
    original = dist.init_process_group
    if getattr(original, "_trainfleet", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        mark("entered")
        result = original(*args, **kwargs)
        mark("joined")
        answer_flight_record_requests()
        # The namespace the script runs in (runpy's module, __main__ while it runs).
        SCRIPT["module"] = sys.modules.get("__main__")
        return result

    # A mark on the function object, read back by getattr: wraps' type declares none.
    init_process_group._trainfleet = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


JIT_LOCK_REPORT_S = float(os.environ.get("TRAINFLEET_JIT_LOCK_REPORT_S") or 60)


def wrap_baton(file_baton):
    """torch's JIT build lock (what cpp_extension takes to build or load DeepSpeed's ops): a
    rank waiting for it says so every JIT_LOCK_REPORT_S, naming the lock. torch waits in
    silence, and forever when a build killed earlier left the lock."""
    original = file_baton.FileBaton.wait
    if getattr(original, "_trainfleet", False):
        return

    @functools.wraps(original)
    def wait(self, *args, **kwargs):
        done = threading.Event()
        started = time.time()

        def report():
            while not done.wait(JIT_LOCK_REPORT_S):
                sys.stderr.write(
                    "trainfleet: rank %s has waited %.0f s for torch's JIT build lock %s: "
                    "another process builds this op, or a build killed earlier left the lock "
                    "and this wait never ends (`trainfleet doctor` names a stale lock, "
                    "`--fix` removes it)\n"
                    % (os.environ.get("RANK", "?"), time.time() - started, self.lock_file_path)
                )
                sys.stderr.flush()

        threading.Thread(target=report, name="trainfleet-jit-lock", daemon=True).start()
        try:
            return original(self, *args, **kwargs)
        finally:
            done.set()

    # A mark on the function object, read back by getattr: wraps' type declares none.
    wait._trainfleet = True  # type: ignore[attr-defined]
    file_baton.FileBaton.wait = wait


SAVE_BEAT_EVERY_S = 10.0
"""How often a long phase (a checkpoint save) beats its progress, here and in `heartbeat`."""
FLIGHT_RECORD_POLL_S = 0.5
FLIGHT_RECORD_KEEP = 8
"""Entries kept per process group in a summary (the last ones, and every one not complete)."""


def flight_record(c10d, rank):
    """A summary of this rank's Flight Recorder records (torch's JSON dump: gloo's, and NCCL's
    where torch has it), small enough to gather from every rank of a large job."""
    entries: List[Dict[str, Any]] = []
    status: Dict[str, Any] = {}
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            data = json.loads(dump(True, False))
        except Exception:  # a backend without records, or a torch whose dump differs
            continue
        status.update(data.get("pg_status") or {})
        entries += data.get("entries") or []
    kept: List[Dict[str, Any]] = []
    per_group: Dict[Any, int] = {}  # pg_id: as torch's dump has it
    for entry in reversed(entries):
        group = entry.get("pg_id")
        per_group[group] = per_group.get(group, 0) + 1
        if per_group[group] <= FLIGHT_RECORD_KEEP or not entry.get("retired"):
            pg = entry.get("process_group") or ["", ""]
            kept.append({
                "pg_id": group, "pg_name": pg[1] if len(pg) > 1 else "",
                "collective_seq_id": entry.get("collective_seq_id"),
                "profiling_name": entry.get("profiling_name"),
                "input_sizes": entry.get("input_sizes"),
                "input_dtypes": entry.get("input_dtypes"),
                "is_p2p": entry.get("is_p2p"), "state": entry.get("state"),
                "retired": entry.get("retired"),
            })  # fmt: skip
    return {"rank": rank, "pid": os.getpid(), "pg_status": status, "entries": kept[::-1]}


def answer_flight_record_requests():
    """A daemon thread that writes this rank's Flight Recorder summary to
    DIR/flight/rankN.json whenever DIR/flight/rankN.request changes (DIR: this shim's
    directory; the node's hang dump writes the request, one per rank: the deepspeed backend's
    DIR has the same path on every node). A thread, because a rank stuck in a collective never
    returns to the interpreter's main loop, where a signal handler would run."""
    if SCRIPT.get("flight_record_thread"):
        return  # a second init_process_group (after a destroy)
    SCRIPT["flight_record_thread"] = True
    rank = os.environ.get("RANK", "0")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flight")
    request = os.path.join(out, "rank%s.request" % rank)

    def loop():
        answered = None
        c10d = sys.modules.get("torch._C._distributed_c10d")
        while True:
            time.sleep(FLIGHT_RECORD_POLL_S)
            try:
                with open(request) as f:
                    token = f.read().strip()
            except OSError:
                continue
            if token == answered:
                continue
            answered = token
            try:
                c10d = c10d or __import__("torch._C._distributed_c10d", fromlist=["_"])
                summary = flight_record(c10d, int(rank))
                summary["request"] = token
                path = os.path.join(out, "rank%s.json" % rank)
                with open(path + ".tmp", "w") as f:
                    json.dump(summary, f)
                os.replace(path + ".tmp", path)
            except Exception as exc:  # never the rank's end: say why and keep running
                sys.stderr.write("trainfleet: flight record not written: %s\n" % exc)

    threading.Thread(target=loop, name="trainfleet-flight-record", daemon=True).start()


def beat(step, **fields):
    """A heartbeat line, as `trainfleet.heartbeat.beat` writes it (the shim runs on nodes that
    need not have trainfleet installed)."""
    line = {"step": int(step), "pid": os.getpid()}
    line.update((k, v) for k, v in fields.items() if v is not None)
    run_id, rank = os.environ.get(RUN_ID_ENV, "-"), os.environ.get("RANK", "0")
    sys.stderr.write("%s:%s:beat:%s:%s\n" % (MARK, run_id, rank, json.dumps(line)))
    sys.stderr.flush()


def wrap_trainer(trainer_module):
    """Hugging Face's Trainer (and what subclasses it: TRL's, LLaMA-Factory's, axolotl's) gets
    a callback that beats at every optimizer step, with the total and the last logged loss,
    and at every evaluation batch (phase `evaluating`); its checkpoint saves beat `saving`
    with the bytes written so far: a script started unchanged is seen by `trainfleet status`
    and judged by the hang watchdog as `trainfleet train` is (an evaluation or a save longer
    than --hang-timeout is no hang while it advances). A trainer that beats itself
    (`trainfleet train`'s) sets `trainfleet_beats = True` on its class and gets none."""
    trainer = getattr(trainer_module, "Trainer", None)
    # transformers' TrainerCallback where it is imported: a class the checker cannot see here.
    base: Any = getattr(sys.modules.get("transformers.trainer_callback"), "TrainerCallback", None)
    if trainer is None or base is None or getattr(trainer.__init__, "_trainfleet", False):
        return
    original = trainer.__init__

    class Beats(base):
        def __init__(self):
            self.loss = None
            self.evaluated = 0  # evaluation batches: the phase's progress

        def on_log(self, args, state, control, logs=None, **kwargs):
            if isinstance(logs, dict) and isinstance(logs.get("loss"), (int, float)):
                self.loss = float(logs["loss"])
                beat(state.global_step, loss=self.loss)  # (the step's log comes after its end)

        def on_step_end(self, args, state, control, **kwargs):
            beat(state.global_step, total_steps=state.max_steps or None, loss=self.loss)

        def on_prediction_step(self, args, state, control, **kwargs):
            self.evaluated += 1
            beat(state.global_step, phase="evaluating", phase_progress=self.evaluated)

        def on_evaluate(self, args, state, control, **kwargs):
            self.evaluated = 0
            beat(state.global_step, phase="training")  # the phase ends (as train's worker)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not getattr(type(self), "trainfleet_beats", False):
            try:
                self.add_callback(Beats())
            except Exception as exc:  # the training is the user's: it goes on without beats
                sys.stderr.write("trainfleet: no heartbeats from this Trainer: %s\n" % exc)

    # A mark on the function object, read back by getattr: wraps' type declares none.
    __init__._trainfleet = True  # type: ignore[attr-defined]
    trainer.__init__ = __init__
    save = getattr(trainer, "_save_checkpoint", None)
    if save is None:
        return

    @functools.wraps(save)
    def _save_checkpoint(self, *args, **kwargs):
        if getattr(type(self), "trainfleet_beats", False):
            return save(self, *args, **kwargs)
        step = self.state.global_step
        folder = os.path.join(str(self.args.output_dir), "checkpoint-%d" % step)
        with saving_beats(step, folder):
            saved = save(self, *args, **kwargs)
        beat(step, phase="training")  # the phase ends (as train's worker says it)
        return saved

    trainer._save_checkpoint = _save_checkpoint


@contextlib.contextmanager
def saving_beats(step, folder):
    """Beat phase `saving` now and every SAVE_BEAT_EVERY_S seconds with the bytes under
    `folder` so far (heartbeat.beating's rule: each increase is progress), until the block
    ends."""

    def written():
        total = 0
        for root, _, files in os.walk(folder):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:
                    pass  # removed while the save renames its files
        return total

    def send():
        beat(step, phase="saving", phase_progress=written())

    with periodically(send, SAVE_BEAT_EVERY_S, "trainfleet-saving-beats"):
        yield


@contextlib.contextmanager
def periodically(send, every, name):
    """send() now, then every `every` seconds from a daemon thread, until the block ends: the
    beats of a long phase (here, and `trainfleet.heartbeat.beating` for scripts)."""
    stop = threading.Event()

    def loop():
        while not stop.wait(every):
            send()

    send()
    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps what HOOKS name as soon as each module is imported, without importing torch
    itself (a script that never uses it pays nothing)."""

    HOOKS = {
        "torch.distributed": wrap_init,
        "torch.utils.file_baton": wrap_baton,
        "transformers.trainer": wrap_trainer,
    }

    def __init__(self):
        self.waiting = dict(self.HOOKS)

    def find_spec(self, name, path, target=None):
        if name not in self.waiting:
            return None
        hook = self.waiting.pop(name)
        if not self.waiting:
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        spec = importlib.util.find_spec(name)  # the others find it: this name is no longer ours
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            hook(module)

        # This one loader's method, replaced on purpose: the module runs, then the hook.
        spec.loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec


def wants_local_rank(target, is_module):
    """True when the script's source defines a --local_rank / --local-rank option."""
    try:
        if is_module:
            spec = importlib.util.find_spec(target)
            path = spec.origin if spec else None
        else:
            path = target
        if path is None:
            return False  # no such module, or one without a source file
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except (OSError, TypeError, ImportError, ValueError):
        return False
    return "--local_rank" in text or "--local-rank" in text


def python_shebang(path):
    """True when `path` is a script whose #! line names this very interpreter (the same
    directory, the same binary: pip's console scripts of this environment)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return False
    if not first.startswith(b"#!"):
        return False
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        words = [shutil.which(words[1]) or words[1]]
    if not words or "python" not in os.path.basename(words[0]):
        return False
    interpreter = words[0]
    same_dir = os.path.dirname(os.path.abspath(interpreter)) == os.path.dirname(
        os.path.abspath(sys.executable)
    )
    return same_dir and os.path.realpath(interpreter) == os.path.realpath(sys.executable)


def resolve(word):
    """The file torchrun's --no-python would run for `word`, or None."""
    if os.sep in word:
        return word if os.path.isfile(word) else None
    return shutil.which(word)


def run_executable(word, path, args):
    """Run the program as this rank's child and end with its exit code. A child, not an exec:
    the output prefixing (a pipe read by this process's threads) and the exit mark live on."""
    mark("started")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        child = subprocess.Popen([word] + args, executable=path)
    except OSError as exc:
        sys.stderr.write("trainfleet: cannot run %s: %s\n" % (path, exc))
        mark("exit=126")
        sys.exit(126)

    def forward(signum, _frame):
        child.send_signal(signum)

    # SIGUSR1/2 too: the bootstrap passes a Slurm job's time-limit signal on to the ranks.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    code = child.wait()
    code = code if code >= 0 else 128 - code  # killed by signal N: 128+N, as a shell says
    mark("exit=%d" % code)
    sys.exit(code)


def node_env():
    """This node's variables: the table TRAINFLEET_NODE_ENV names says which node's ranks hold
    RANK and names that node's file beside it. A node is sent only its own file (no node reads
    another's secrets); where nodes share the directory, each file still has its own name."""
    path = os.environ.get("TRAINFLEET_NODE_ENV")
    if not path:
        return {}
    with open(path) as f:
        table = json.load(f)
    rank = int(os.environ.get("RANK", "0"))
    for entry in table:
        if entry["first_rank"] <= rank < entry["first_rank"] + entry["slots"]:
            with open(os.path.join(os.path.dirname(path), entry["env_file"])) as f:
                return json.load(f)["env"]
    return {}


def _copy_lines(read_fd, write_fd, tag):
    pending = b""
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        pending += chunk
        lines = pending.split(b"\n")
        pending = lines.pop()
        if lines:
            os.write(write_fd, b"".join(tag + line + b"\n" for line in lines))
    if pending:
        os.write(write_fd, tag + pending + b"\n")


def prefix_output(tag):
    """Every line written to this process's stdout and stderr (its children's too) gets `tag`
    in front, as torchrun's --tee does: for launchers that give a node's ranks one stdout."""
    copiers = []
    for fd in (1, 2):
        read_fd, write_fd = os.pipe()
        original = os.dup(fd)
        os.dup2(write_fd, fd)
        os.close(write_fd)
        copier = threading.Thread(target=_copy_lines, args=(read_fd, original, tag), daemon=True)
        copier.start()
        copiers.append(copier)

    def drain():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(devnull, fd)  # closes the pipes' last write ends here: the copiers finish
        for copier in copiers:
            copier.join(timeout=2)

    atexit.register(drain)


def main(argv):
    # DeepSpeed's launcher puts its --local_rank before the script (it thinks the shim is
    # the script): it is handed on to the user's script, where DeepSpeed would have put it.
    passed = []
    while argv and argv[0].startswith(("--local_rank", "--local-rank")):
        passed.append(argv.pop(0))
    if not argv:
        sys.exit("trainfleet: no script given")
    os.environ.update(node_env())
    if os.environ.get("TRAINFLEET_PREFIX_OUTPUT") == "1":
        prefix_output(("[default%s]:" % os.environ.get("LOCAL_RANK", "0")).encode())
    is_module = argv[0] == "-m"
    target, args = (argv[1], argv[2:]) if is_module else (argv[0], argv[1:])
    mode = os.environ.get(LOCAL_RANK_ARG_ENV, "auto")
    if not is_module and not target.endswith(".py"):
        path = resolve(target)
        if path is None:
            sys.stderr.write(
                "trainfleet: %s: not found on this node (not a file, and not on PATH=%s)\n"
                % (target, os.environ.get("PATH", ""))
            )
            mark("exit=127")
            sys.exit(127)
        if os.environ.get(NO_PYTHON_ENV) == "1" or not python_shebang(path):
            # An executable gets --local_rank only when asked (`--local-rank-arg always`).
            if mode == "always":
                local = "--local_rank=%s" % os.environ.get("LOCAL_RANK", "0")
                args = passed + args if passed else args + [local]
            run_executable(target, path, args)
        target = path
    args = passed + args
    has_arg = any(a.startswith(("--local_rank", "--local-rank")) for a in args)
    if not has_arg and (
        mode == "always" or (mode == "auto" and wants_local_rank(target, is_module))
    ):
        args = args + ["--local_rank=%s" % os.environ.get("LOCAL_RANK", "0")]
    sys.meta_path.insert(0, _AfterImport())
    atexit.register(end_script_namespace)
    mark("started")
    sys.argv = [target] + args
    try:
        if is_module:
            if target.split(".")[0] != "trainfleet":  # as `python -m`; trainfleet's own
                sys.path[0] = os.getcwd()  # workers run without it (node/isolated.py)
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        # The rank's own exit code, which launchers report imprecisely or not at all.
        code = exc.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        if status == 0:
            exc.__traceback__ = None  # its frames would keep the script's objects alive
            release_process_group()
        mark("exit=%d" % status)
        raise
    except BaseException:
        mark("exit=1")  # what the interpreter exits with after an uncaught exception
        raise
    release_process_group()
    mark("exit=0")


def end_script_namespace():
    """Last at exit (registered before the script's own handlers, so it runs after them): the
    namespace of a script that succeeded is cleared and collected, while the interpreter is
    whole. Modules the script imported keep that namespace alive (dill's `_main_module`,
    `sys.modules["__mp_main__"]`), and with it what holds the process group (a DDP model, an
    Accelerator): the group's gloo threads would otherwise end in the interpreter's own
    teardown, which can abort a rank that finished ("terminate called without an active
    exception", exit -6)."""
    module = SCRIPT.get("module")
    if not SCRIPT.get("succeeded") or module is None or module is sys.modules.get("__main__"):
        return
    vars(module).clear()
    gc.collect()


def release_process_group():
    """Destroys the default process group a script that succeeded left behind.

    Without it, gloo's worker threads can outlive the interpreter's teardown and abort a rank
    that had finished its work ("terminate called without an active exception", exit -6),
    failing the run after the fact. Only after success: a rank that failed may have peers
    still inside a collective, where destroying could block (torchtitan destroys only then).
    Reference cycles are collected first; what the script's namespace still holds is let go
    at exit (end_script_namespace).
    """
    SCRIPT["succeeded"] = True
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    gc.collect()
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # the script's work is done: say so, and let the rank exit 0
        sys.stderr.write("trainfleet: destroying the process group at exit: %s\n" % exc)


if __name__ == "__main__":
    main(sys.argv[1:])
