"""Catalog entries: software on the nodes, their resources, and what happens at run time."""

from __future__ import annotations

from trainfleet.catalog.ids import Area, Entry, FindingId, Sandbox

_SSH, _NET, _SW, _RES, _RUN = Area.SSH, Area.NETWORK, Area.SOFTWARE, Area.RESOURCES, Area.RUNTIME
_DOCTOR = ("test_doctor.py",)
_FAKE_GPU = ("test_fake_gpu.py",)
"""The GPU findings' cluster tests, on simulated GPUs (sandbox/fakegpu.py)."""

ENTRIES: dict[FindingId, Entry] = {
    # ------------------------------------------------------------------ software
    FindingId.VERSION_MISMATCH: Entry(
        area=_SW,
        title="python, torch, NCCL or DeepSpeed versions differ across nodes",
        seen="deadlocks or cryptic errors in the first collective",
        detect="versions from each node's configured python (an import, else package "
        "metadata); transformers and accelerate only warn",
        fix="the same environment on every node: `trainfleet setup pyenv` installs this "
        "machine's versions there",
        fixed_by="setup pyenv",
    ),
    FindingId.TORCH_MISSING: Entry(
        area=_SW,
        title="torch cannot be imported on a node",
        seen="`ImportError` on one node only",
        detect="`import torch` in a subprocess with a timeout, with each node's python",
        fix="install torch there (`trainfleet setup pyenv`), or point the node's `python:` at the "
        "environment that has it",
        fixed_by="setup pyenv",
        sandbox=Sandbox(
            faults=("torch-import-error",),
            setup="a node's `python:` set to an interpreter without torch",
            tests=_DOCTOR,
        ),
    ),
    FindingId.CUDA_HOME_MISSING: Entry(
        area=_SW,
        title="a GPU node has neither CUDA_HOME nor nvcc for DeepSpeed's op builds",
        seen="`CUDA_HOME does not exist` when DeepSpeed builds an op",
        detect="CUDA_HOME and nvcc on the non-interactive path of nodes with GPUs",
        fix="CUDA_HOME for that node in cluster.yaml `env:`",
        fixed_by="setup env",
    ),
    FindingId.NINJA_MISSING: Entry(
        area=_SW,
        title="ninja is not on the PATH the ranks get",
        seen="`RuntimeError: Ninja is required to load C++ extensions`",
        detect="ninja on the non-interactive PATH of nodes with DeepSpeed; the same text in a "
        "rank's error",
        fix="`pip install ninja` into that node's python, or its PATH per node",
    ),
    FindingId.CODE_DIFFERS: Entry(
        area=_SW,
        title="the code in the working directory differs between nodes",
        seen="a hang, or `Detected mismatch between collectives`",
        detect="a hash of the working directory on each node",
        fix="the same code everywhere (`trainfleet sync`), or shared storage",
        sandbox=Sandbox(
            setup="node-local working directories (`--node-local-dir`), one node's copy edited",
            tests=(*_DOCTOR, "test_setup.py"),
        ),
        fixed_by="sync",
    ),
    FindingId.SHARED_DIR_MISSING: Entry(
        area=_SW,
        title="the nodes do not share the working directory",
        seen="checkpoints or data missing on the other nodes",
        detect="a token file each node writes in the working directory, looked for by the "
        "others (INFO)",
        fix="shared storage, or copies of code and data on every node",
        sandbox=Sandbox(
            setup="node-local working directories (`--node-local-dir`)",
            tests=(*_DOCTOR, "test_setup.py"),
        ),
    ),
    FindingId.JIT_LOCK_STALE: Entry(
        area=_SW,
        title="a torch JIT build lock left by a killed build",
        seen="every rank that loads the op waits in silence, forever, right after the rendezvous",
        detect="lock files under the node's torch extensions directory older than a minute "
        "that no process holds or builds under; trainfleet's wrapper in each rank names a lock"
        " it waits for",
        fix="`trainfleet doctor --fix` removes it after checking again, or `rm` the lock named",
        sandbox=Sandbox(
            setup="a lock in a node's TORCH_EXTENSIONS_DIR, held by a process then killed",
            tests=_DOCTOR,
        ),
    ),
    FindingId.ENV_NOT_FORWARDED: Entry(
        area=_SW,
        title="a variable set in the launching shell does not reach the other nodes",
        seen="NCCL_DEBUG or NCCL_IB_HCA work on the launch node only; a global interface "
        "variable reaches nodes where it is wrong",
        detect="show per rank where each variable came from (`--dry-run`); forward DeepSpeed's "
        "prefixes; keep interface variables per node",
        fix="cluster.yaml `env:` (per node where values differ)",
        planned=True,
    ),
    # ------------------------------------------------------------------ resources
    FindingId.GPU_COUNT_MISMATCH: Entry(
        area=_RES,
        title="a node has fewer GPUs than its slots",
        seen="`invalid device ordinal`, `No slot 2 specified on host`",
        detect="the GPUs found on each node against its slots; the same text in a rank's error",
        fix="the node's real GPU count as its slots",
        sandbox=Sandbox(faults=("fake-gpu-count",), tests=_FAKE_GPU),
    ),
    FindingId.GPU_BUSY: Entry(
        area=_RES,
        title="other processes hold a node's GPUs",
        seen="out of memory at start",
        detect="`nvidia-smi --query-compute-apps` on each node; the busy-device text in a "
        "rank's error",
        fix="stop the processes named (pid and command)",
        sandbox=Sandbox(faults=("fake-gpu-busy",), tests=_FAKE_GPU),
    ),
    FindingId.GPU_UNHEALTHY: Entry(
        area=_RES,
        title="a GPU fails NVIDIA's own diagnostic (DCGM)",
        seen="one node slows or crashes the job; the other checks see nothing",
        detect="`doctor --gpu-diag` runs `dcgmi diag -r 1` (`-r 2` with `--gpu-diag 2`) on each "
        "node and reports each failed test with its GPU",
        fix="exclude the GPU or drain the node and have it checked",
        planned=True,
    ),
    FindingId.NVIDIA_SMI_FAILED: Entry(
        area=_RES,
        title="nvidia-smi is installed on a node but fails",
        seen="`NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver`; "
        "CUDA sees no device, or ranks fail with `CUDA driver initialization failed`",
        detect="nvidia-smi's exit code and message on each node",
        fix="load the driver (reboot after a driver upgrade, or reinstall the driver matching "
        "the kernel)",
        sandbox=Sandbox(faults=("fake-gpu-no-driver",), tests=_FAKE_GPU),
    ),
    FindingId.GPU_ECC_UNCORRECTED: Entry(
        area=_RES,
        title="a GPU has uncorrected ECC memory errors since the driver loaded",
        seen="`CUDA error: uncorrectable ECC error encountered`, NaNs, a crash hours in",
        detect="`nvidia-smi --query-gpu` ecc.errors.uncorrected.volatile.total per GPU",
        fix="exclude the GPU (`-e NODE:GPU`); reset it or drain the node for service",
        sandbox=Sandbox(faults=("fake-gpu-ecc",), tests=_FAKE_GPU),
    ),
    FindingId.GPU_REMAP_PENDING: Entry(
        area=_RES,
        title="a GPU has row remapping pending or failed (retired pages pending before Ampere)",
        seen="ECC errors come back after they were 'fixed'; Xid 63/64",
        detect="`nvidia-smi --query-remapped-rows` pending and failure; retired_pages.pending",
        fix="pending: reset the GPU (`nvidia-smi -r -i GPU`) or reboot the node; failed: the GPU "
        "needs replacing, exclude it (`-e NODE:GPU`)",
        sandbox=Sandbox(faults=("fake-gpu-remap",), tests=_FAKE_GPU),
    ),
    FindingId.GPU_XID: Entry(
        area=_RES,
        title="the kernel log has NVIDIA Xid errors since boot",
        seen="`GPU has fallen off the bus` (Xid 79), ranks stuck or killed, NCCL timeouts",
        detect="`NVRM: Xid` lines in `dmesg` (or `journalctl -k`) on each node, read as the "
        "node allows; 'not readable' where it does not",
        fix="fatal Xids (48, 63, 64, 74, 79, 92, 94, 95, 119, 120): exclude the GPU and have "
        "the node checked; others: look up the Xid in NVIDIA's Xid catalog",
        sandbox=Sandbox(faults=("fake-gpu-xid",), tests=_FAKE_GPU),
    ),
    FindingId.GPU_MIG_ENABLED: Entry(
        area=_RES,
        title="a GPU is in MIG mode",
        seen="CUDA sees MIG instances, not the GPU; NCCL fails or each rank gets a slice",
        detect="mig.mode.current per GPU",
        fix="disable MIG (`nvidia-smi -i GPU -mig 0`, then reset the GPU) or exclude it",
        sandbox=Sandbox(faults=("fake-gpu-mig",), tests=_FAKE_GPU),
    ),
    FindingId.CUDA_DRIVER_TOO_OLD: Entry(
        area=_RES,
        title="a node's driver supports an older CUDA than its torch was built for",
        seen="`The NVIDIA driver on your system is too old`, `torch.cuda.is_available()` False",
        detect="the CUDA version the driver supports (`nvidia-smi -q`) against "
        "`torch.version.cuda` on each node",
        fix="upgrade the driver, or install the torch build for the driver's CUDA "
        "(`pip install torch --index-url https://download.pytorch.org/whl/cuXYZ`)",
        sandbox=Sandbox(faults=("fake-gpu-old-driver",), tests=_FAKE_GPU),
    ),
    FindingId.GPU_DRIVER_DIFFERS: Entry(
        area=_RES,
        title="nodes run different NVIDIA drivers",
        seen="NCCL or CUDA behaves differently on one node; hangs that follow one node",
        detect="driver_version on every node",
        fix="install the same driver on every node",
    ),
    FindingId.NVLINK_DOWN: Entry(
        area=_RES,
        title="an NVLink of a GPU is down while the node's other links are up",
        seen="one node's all-reduce is several times slower; NCCL falls back to PCIe",
        detect="`nvidia-smi nvlink --status`: a link without a speed where the node has others",
        fix="reset the GPU or reboot the node; if it stays down, have the node serviced",
        sandbox=Sandbox(faults=("fake-gpu-nvlink",), tests=_FAKE_GPU),
    ),
    FindingId.GPU_PCIE_DEGRADED: Entry(
        area=_RES,
        title="a GPU's PCIe link runs narrower than it can (x8 of x16)",
        seen="slow host transfers, offload and data loading on one node",
        detect="pcie.link.width.current against pcie.link.width.max (the generation drops at "
        "idle by design and is not judged)",
        fix="reseat the GPU or its riser; check the slot in the BIOS",
        sandbox=Sandbox(faults=("fake-gpu-pcie",), tests=_FAKE_GPU),
    ),
    FindingId.GPU_THROTTLED: Entry(
        area=_RES,
        title="a GPU's clocks are held down by hardware slowdown, heat or power brake",
        seen="one rank is the straggler on every step",
        detect="clocks_event_reasons hw_slowdown, hw_thermal_slowdown, "
        "hw_power_brake_slowdown, sw_thermal_slowdown (idle is not a fault)",
        fix="check the node's cooling and power supply; exclude the GPU until it is fixed",
        sandbox=Sandbox(faults=("fake-gpu-throttled",), tests=_FAKE_GPU),
    ),
    FindingId.GPU_PERSISTENCE_OFF: Entry(
        area=_RES,
        title="persistence mode is off on a node's GPUs",
        seen="every start pays seconds of driver load; GPU state can reset between jobs",
        detect="persistence_mode per GPU",
        fix="`sudo nvidia-smi -pm 1` on the node (or enable nvidia-persistenced)",
        sandbox=Sandbox(faults=("fake-gpu-persistence",), tests=_FAKE_GPU),
    ),
    FindingId.SHM_SMALL: Entry(
        area=_RES,
        title="/dev/shm is under 1 GiB",
        seen="`unhandled system error`, NCCL shared-memory failures in containers",
        detect="the size of /dev/shm on each node",
        fix="`--shm-size` for the container, or remount /dev/shm larger",
    ),
    FindingId.SHM_BUS_ERROR: Entry(
        area=_RES,
        title="/dev/shm too small for the data loader workers",
        seen="`Bus error` (exit -7) in data loader workers or NCCL, in containers",
        detect="/dev/shm size and free space per node against workers x batch size",
        fix="a larger /dev/shm, or fewer workers",
        planned=True,
    ),
    FindingId.RAM_INSUFFICIENT: Entry(
        area=_RES,
        title="the ranks of a node need more host RAM than it has",
        seen="a host OOM kill (exit -9) that grows with the GPUs per node",
        detect="`trainfleet train`'s preflight: the planner's host RAM per node (loading, "
        "offloaded states) against MemAvailable",
        fix="zero.Init / low-memory loading, fewer ranks per node, or the planner's config "
        "that fits",
    ),
    FindingId.DISK_LOW: Entry(
        area=_RES,
        title="little free space where the job writes",
        seen="`No space left on device` at the first checkpoint",
        detect="free space at the working directory on each node; train's check before each "
        "checkpoint; ENOSPC in a rank's error (a restart cause)",
        fix="another output directory, or fewer kept checkpoints",
        sandbox=Sandbox(
            setup="OUTPUT on a tmpfs shrunk below the next checkpoint", tests=("test_chaos.py",)
        ),
    ),
    FindingId.CLOCK_SKEW: Entry(
        area=_RES,
        title="a node's clock is off",
        seen="logs from different nodes cannot be put in order",
        detect="each node's clock against this machine's while the probe runs",
        fix="NTP (chrony, systemd-timesyncd) on every node",
    ),
    # ------------------------------------------------------------------ runtime
    FindingId.RENDEZVOUS_TIMEOUT: Entry(
        area=_RUN,
        title="ranks did not all join the rendezvous",
        seen="stuck at init for 10-30 minutes without a word",
        detect="the join watchdog (--join-timeout) names the ranks that did not join and runs "
        "doctor on them; doctor's real gloo all_reduce when no cause is known",
        fix="the findings doctor then names (firewall, interfaces, names)",
    ),
    FindingId.STARTUP_TIMEOUT: Entry(
        area=_RUN,
        title="work before the first step outlasts the process group's timeout",
        seen="users raise the timeout to years (`ddp_timeout: 180000000`), which switches "
        "hang detection off",
        detect="beats with a phase before the first step (loading, tokenizing) are judged by "
        "--startup-timeout and their own progress; training by --hang-timeout",
        fix="the rank and the place it waits, as printed; a long startup that advances needs "
        "no longer timeout",
        sandbox=Sandbox(
            setup="a rank whose tokenization stops advancing before the first barrier",
            tests=("test_launch.py",),
        ),
    ),
    FindingId.RANK_CRASHED: Entry(
        area=_RUN,
        title="a rank died",
        seen="the other nodes hang until the NCCL timeout (10 min)",
        detect="fail-fast: every rank on every node is stopped within seconds; the first real "
        "error across nodes is reported, with a known fix where there is one",
        fix="the root cause printed (its node, rank and error line)",
        sandbox=Sandbox(
            setup="a rank that exits; a node's processes or its connection killed",
            tests=("test_chaos.py", "test_launch.py"),
        ),
    ),
    FindingId.RANK_HUNG: Entry(
        area=_RUN,
        title="no rank advances a step",
        seen="everything blocks until the process-group timeout (30 min for gloo)",
        detect="heartbeats: no step past --hang-timeout; every rank's stack (py-spy), the rank "
        "behind, and the collective it is stuck in with the ranks that never entered it "
        "(PyTorch's Flight Recorder)",
        fix="the rank and the place it waits, as printed",
        sandbox=Sandbox(
            setup="a rank stopped with SIGSTOP; a node's link set down",
            tests=("test_chaos.py", "test_launch.py"),
        ),
    ),
    FindingId.RANK_STRAGGLER: Entry(
        area=_RUN,
        title="one rank computes slower than the others",
        seen="every step of synchronous training takes as long as the slowest rank's; step "
        "times look alike on every rank",
        detect="busy_s heartbeats (time computing, not waiting): a rank's median above the other "
        "ranks' median by more than 20%, said by the launcher within seconds and by "
        "`trainfleet status`",
        fix="the node named: a throttled or slower GPU/CPU, another job on it",
        sandbox=Sandbox(faults=("cpu-throttle",), tests=("test_launch.py",)),
    ),
    FindingId.ORPHAN_PROCESSES: Entry(
        area=_RUN,
        title="a node could not confirm that the job's processes ended",
        seen="leftover ranks hold GPUs and port 29500",
        detect="each node's bootstrap kills its whole process group when the launcher goes "
        "away; a node that could not confirm it is named",
        fix="check that node once it answers: `trainfleet exec ... -- ps -eo pid,args`",
    ),
    FindingId.NESTED_LAUNCHER: Entry(
        area=_RUN,
        title="the command starts a launcher of its own inside each rank",
        seen="`torchrun`, `deepspeed`, `accelerate launch` or FORCE_TORCHRUN=1 starts a second "
        "layer of ranks per rank",
        detect="the launcher word in the command (torchrun, deepspeed, accelerate launch) is "
        "refused before anything starts; llamafactory-cli train, axolotl train and trl sft run "
        "the module their launcher starts, refused only when given that launcher's options",
        fix="the script and its arguments after `--`: the refusal names the command to use",
        sandbox=Sandbox(setup="a launcher word in the command", tests=("test_migration.py",)),
    ),
    FindingId.OUTPUT_NOT_SHARED: Entry(
        area=_RUN,
        title="`trainfleet train`'s OUTPUT is not on storage every node mounts",
        seen="each node writes its own partial checkpoints",
        detect="every rank looks for a file written on the launch node under OUTPUT; a "
        "restart would meet it again, so none is made",
        fix="put --output on storage every node mounts",
    ),
}
