"""Every check: a pure function of the survey that returns findings (ids: docs/findings.md).

>>> from trainfleet.doctor.checks import run_checks
>>> run_checks(survey, started=0.0, finished=1.0)  # doctest: +SKIP
"""

from __future__ import annotations

from trainfleet.doctor.checks import gpus, network, resources, slurm, software, ssh, transport
from trainfleet.doctor.collect import Survey
from trainfleet.doctor.findings import Finding, merge

CHECKS = (
    slurm.check_unreachable,
    slurm.check_task_layout,
    slurm.check_export,
    ssh.check_launch_ssh,
    ssh.check_node_to_node_ssh,
    ssh.check_slow_nodes,
    software.check_paths,
    network.check_firewall,
    network.check_port_in_use,
    network.check_hostnames,
    network.check_client_names,
    network.check_interfaces,
    transport.check_mtu,
    transport.check_ipv6,
    transport.check_slow_link,
    software.check_versions,
    software.check_torch,
    software.check_tools,
    software.check_code,
    software.check_gpu_software,
    software.check_launcher,
    software.check_jit_locks,
    resources.check_gpus,
    slurm.check_gpus,
    gpus.check_nvidia_smi,
    gpus.check_ecc,
    gpus.check_remapping,
    gpus.check_xid,
    gpus.check_mig,
    gpus.check_cuda_driver,
    gpus.check_driver_differs,
    gpus.check_nvlink,
    gpus.check_pcie,
    gpus.check_throttled,
    gpus.check_persistence,
    resources.check_shm,
    resources.check_disk,
    resources.check_memlock,
    resources.check_shared_storage,
)


def run_checks(survey: Survey, *, started: float, finished: float) -> list[Finding]:
    findings = [f for check in CHECKS for f in check(survey)]
    findings += resources.check_clocks(survey, started, finished)
    return merge(findings)
