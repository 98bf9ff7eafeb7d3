"""Catalog entries: ssh and network."""

from __future__ import annotations

from trainfleet.catalog.ids import Area, Entry, FindingId, Sandbox

_SSH, _NET, _SW, _RES, _RUN = Area.SSH, Area.NETWORK, Area.SOFTWARE, Area.RESOURCES, Area.RUNTIME
_DOCTOR = ("test_doctor.py",)

ENTRIES: dict[FindingId, Entry] = {
    # ------------------------------------------------------------------ ssh
    FindingId.SSH_UNREACHABLE: Entry(
        area=_SSH,
        title="a node does not answer on its ssh port",
        seen="the launcher waits, then `ssh: connect to host ... Connection timed out` (or "
        "refused)",
        detect="ssh with a short ConnectTimeout from this machine and from every node; ssh's "
        "stderr tells refused, timed out, no route and a probe that never finished apart",
        fix="check the node's address, that it is up, that sshd runs and that port 22 is open",
        sandbox=Sandbox(faults=("node-down",), tests=(*_DOCTOR, "test_sandbox_exec.py")),
    ),
    FindingId.SSH_AUTH_FAILED: Entry(
        area=_SSH,
        title="no passwordless login to a node",
        seen="`Permission denied (publickey,password)`, pdsh exit 255, or a password prompt",
        detect="`ssh -o BatchMode=yes` from this machine to every node and from every node to "
        "every node, itself included",
        fix="`trainfleet setup ssh`, or `ssh-copy-id` for the pair named",
        sandbox=Sandbox(faults=("ssh-auth-failed",), tests=(*_DOCTOR, "test_sandbox_exec.py")),
        fixed_by="setup ssh",
    ),
    FindingId.SSH_HOSTKEY_UNKNOWN: Entry(
        area=_SSH,
        title="known_hosts has no key for a node",
        seen="`The authenticity of host ... can't be established`, which blocks every "
        "non-interactive run",
        detect="the same ssh with StrictHostKeyChecking=yes; ssh's stderr",
        fix="compare the fingerprints, then add the key (`doctor --fix` does both); never "
        "`StrictHostKeyChecking=no`",
        sandbox=Sandbox(faults=("ssh-hostkey-unknown",), tests=(*_DOCTOR, "test_sandbox_exec.py")),
        fixed_by="setup ssh",
    ),
    FindingId.SSH_HOSTKEY_CHANGED: Entry(
        area=_SSH,
        title="a node's host key differs from the one in known_hosts",
        seen="`REMOTE HOST IDENTIFICATION HAS CHANGED`",
        detect="the same ssh; ssh's stderr",
        fix="once the new fingerprint is confirmed, `ssh-keygen -R HOST` (never done for you)",
        sandbox=Sandbox(
            faults=("ssh-hostkey-changed", "ssh-hostkey-type-changed"),
            tests=(*_DOCTOR, "test_sandbox_exec.py", "test_setup.py"),
        ),
        fixed_by="setup ssh",
    ),
    FindingId.SSH_HOSTKEY_ALGO: Entry(
        area=_SSH,
        title="client and node share no host key algorithm",
        seen="`no matching host key type found. Their offer: ssh-rsa`",
        detect="the same ssh; ssh's stderr",
        fix="`HostKeyAlgorithms +ssh-rsa` for that host in ~/.ssh/config, or new host keys",
    ),
    FindingId.PDSH_MISSING: Entry(
        area=_SSH,
        title="DeepSpeed's runner has no pdsh on this machine",
        seen="`launcher 'pdsh' not installed`, or `rcmd: socket: Permission denied` when "
        "pdsh uses rsh",
        detect="pdsh on this machine's PATH, for clusters of two or more nodes (INFO)",
        fix="install pdsh (with `PDSH_RCMD_TYPE=ssh`), or launch with trainfleet's ssh backend",
    ),
    FindingId.REMOTE_PATH_MISSING: Entry(
        area=_SSH,
        title="the working directory or the node's python is missing there",
        seen="`cd: ...: No such file or directory`, `.../bin/python: No such file or directory`",
        detect="the probe runs with the node's configured python in the working directory",
        fix="the same layout (or shared storage) on every node, or per-node `python:` / "
        "`workdir:` in cluster.yaml",
        sandbox=Sandbox(
            setup="a node's `python:` or the `workdir:` set to a path that does not exist",
            tests=_DOCTOR,
        ),
    ),
    FindingId.REMOTE_ENV_DIFFERS: Entry(
        area=_SSH,
        title="the non-interactive environment lacks what a login shell has",
        seen="`deepspeed: command not found` or `Ninja is required to load C++ extensions` on "
        "remote nodes only; conda not active over ssh",
        detect="torchrun, deepspeed, ninja and nvcc and the PATH directories on each node's "
        "non-interactive PATH, compared with the other nodes and this machine",
        fix="activate the environment for non-interactive ssh, or `trainfleet setup env` (PATH "
        "per node in cluster.yaml)",
        sandbox=Sandbox(faults=("remote-env-differs",), tests=(*_DOCTOR, "test_sandbox_faults.py")),
        fixed_by="setup env",
    ),
    FindingId.LOGIN_SHELL_SLOW: Entry(
        area=_SSH,
        title="every ssh session takes seconds",
        seen="probes and launches crawl or time out (a heavy ~/.bashrc, a stale `pyenv rehash` "
        "lock)",
        detect="time the non-interactive login on each node; name the file and the seconds",
        fix="make the slow startup file return early for non-interactive shells",
        planned=True,
    ),
    FindingId.SLOW_NODE: Entry(
        area=_SSH,
        title="a node answers ssh but its probe starts or works far later than the others'",
        seen="a launch waits at startup for one node; doctor took long, or (with a fixed time "
        "budget) called nodes unreachable that `ssh NODE` reaches, when this machine or the "
        "nodes were busy",
        detect="each probe says when it started and then that it is alive every second; doctor "
        "waits while the probes start and work, names a node whose start or own work took over "
        "3x the other nodes' median (a warning, with the seconds), and one whose probe never "
        "started or went silent although ssh did not fail (an error)",
        fix="see what keeps the node busy (`uptime`, `top`) and time its login (`time ssh NODE "
        "true`): a startup file that waits (conda or pyenv init, a network home) should return "
        "early for non-interactive shells",
        sandbox=Sandbox(faults=("slow-login",), tests=("test_doctor_load.py",)),
    ),
    # ------------------------------------------------------------------ network
    FindingId.IFACE_MISMATCH: Entry(
        area=_NET,
        title="one interface variable for nodes whose interfaces are named differently",
        seen="`Unable to find address for: ens14f1`, `no socket interface found`",
        detect="NCCL's rules (prefix, `^`, `=`) and gloo's (exact names, the same count on "
        "every node) applied to each node's interfaces; launch reports a global value that "
        "misses a node and sets that node's own",
        fix="`interface:` per node in cluster.yaml (`doctor --fix` writes it), or a prefix list "
        "that covers every node",
        sandbox=Sandbox(
            faults=("decoy-iface",),
            setup="differently named interfaces (`--ifnames`) and one GLOO/NCCL_SOCKET_IFNAME",
            tests=_DOCTOR,
        ),
        fixed_by="setup env",
    ),
    FindingId.IFACE_WRONG: Entry(
        area=_NET,
        title="NCCL or gloo would pick an interface that does not reach the master",
        seen="with the variables unset, NCCL takes virbr0, a veth or another subnet, then hangs",
        detect="NCCL's default order emulated per node against the interface that routes to "
        "the master; virtual interfaces on the route; a pinned interface off the route",
        fix="NCCL_SOCKET_IFNAME per node: the interface that routes to the master",
        sandbox=Sandbox(faults=("decoy-iface",), tests=_DOCTOR),
        fixed_by="setup env",
    ),
    FindingId.HOSTNAME_LOOPBACK: Entry(
        area=_NET,
        title="a node's own name resolves to loopback",
        seen="gloo binds 127.0.1.1; peers get `connect [127.0.1.1]: Connection refused`",
        detect="the node's own name resolved on the node",
        fix="set the interface variables (launch does), or map the name to the node's address "
        "in /etc/hosts",
        sandbox=Sandbox(
            faults=("hostname-loopback",),
            tests=(*_DOCTOR, "test_launch.py", "test_sandbox_faults.py"),
        ),
    ),
    FindingId.HOSTNAME_UNRESOLVABLE: Entry(
        area=_NET,
        title="a name the job needs does not resolve",
        seen="`Name or service not known`, `hostname of the client socket cannot be retrieved`",
        detect="each node resolves its own name and the master's; the master names its "
        "clients' IPv4-mapped addresses, every other node the master's, timed against its "
        "resolver's settings; ssh's `Could not resolve hostname`",
        fix="/etc/hosts entries (the finding gives the lines; `trainfleet setup hosts` adds "
        "the IPv4-mapped ones), or addresses instead of names",
        sandbox=Sandbox(
            faults=("hostname-unresolvable", "client-name-unresolvable", "dns-unreachable"),
            tests=(*_DOCTOR, "test_sandbox_faults.py", "test_setup.py"),
        ),
    ),
    FindingId.FIREWALL_BLOCKS_PORTS: Entry(
        area=_NET,
        title="a firewall drops TCP between nodes on the ports NCCL and gloo pick",
        seen="ssh and the master port work, then init hangs for 10-30 min and ends in "
        "`timed out connecting`",
        detect="every node connects to listeners on every other node: the master port and "
        "random ephemeral ports; the node's iptables, nftables, ufw or firewalld state",
        fix="allow TCP from the cluster's subnet on the data interface (the exact rule is "
        "printed; `trainfleet setup firewall` adds it); never disable the firewall",
        sandbox=Sandbox(
            faults=("firewall-blocks-ports", "firewall-ssh-only"),
            tests=(*_DOCTOR, "test_launch.py", "test_sandbox_faults.py", "test_setup.py"),
        ),
        fixed_by="setup firewall --apply",
    ),
    FindingId.PORT_IN_USE: Entry(
        area=_NET,
        title="the master port is taken",
        seen="`errno: 98 - Address already in use` on 29500",
        detect="a bind test and the listening sockets on the master, with the owner's pid and "
        "command",
        fix="stop the leftover process, or another master port (launch picks a free one)",
        sandbox=Sandbox(
            faults=("port-in-use",),
            tests=(*_DOCTOR, "test_launch.py", "test_sandbox_faults.py"),
        ),
    ),
    FindingId.MTU_MISMATCH: Entry(
        area=_NET,
        title="the cluster interfaces' MTUs differ",
        seen="small collectives pass, large ones hang",
        detect="the MTU of each node's chosen interface, compared across nodes",
        fix="the same MTU end to end (nodes and switch)",
        sandbox=Sandbox(faults=("mtu-mismatch",), tests=(*_DOCTOR, "test_sandbox_faults.py")),
    ),
    FindingId.IPV6_MISMATCH: Entry(
        area=_NET,
        title="the master's name resolves to IPv6 only on some nodes",
        seen="`errno: 97 - Address family not supported`",
        detect="how each node resolves the master's name",
        fix="the master's IPv4 address as MASTER_ADDR, `NCCL_SOCKET_FAMILY=AF_INET`",
    ),
    FindingId.SLOW_LINK: Entry(
        area=_NET,
        title="one node or link is much slower than the others",
        seen="training runs, but one node drags every step",
        detect="doctor: a short stream from each node to the next, against the median; "
        "commtest: every pair of nodes, send/recv and raw TCP",
        fix="check that node's link: speed and duplex, cabling, traffic shaping",
        sandbox=Sandbox(
            faults=("slow-link",),
            tests=(*_DOCTOR, "test_commtest.py", "test_sandbox_faults.py"),
        ),
    ),
    FindingId.IB_MEMLOCK: Entry(
        area=_NET,
        title="locked memory is limited on a node with InfiniBand",
        seen="`ibv_reg_mr ... Cannot allocate memory`",
        detect="`ulimit -l` on the non-interactive path where InfiniBand devices exist",
        fix="`memlock unlimited` in limits.conf, or `--ulimit memlock=-1` for containers",
    ),
    FindingId.IB_CONFIG: Entry(
        area=_NET,
        title="InfiniBand/RoCE ports or NCCL's IB settings do not match the devices",
        seen="`Got completion from peer ... error 12`",
        detect="port state, link layer and GID index per node; NCCL_IB_HCA against the devices",
        fix="per-node NCCL_IB_HCA and NCCL_IB_GID_INDEX",
        planned=True,
    ),
    FindingId.IB_GID_INDEX: Entry(
        area=_NET,
        title="RoCE needs a GID index that carries IPv4 on the data subnet",
        seen="four or more nodes hang at the first barrier until NCCL_IB_GID_INDEX, "
        "NCCL_IB_TC or NCCL_IB_HCA are set",
        detect="each node's RoCE GID table: the index with an IPv4 address on the data subnet",
        fix="NCCL_IB_GID_INDEX per node",
        planned=True,
    ),
}
