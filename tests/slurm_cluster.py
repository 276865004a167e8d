"""A real SLURM cluster on this host for the tests of ``slurm/``: munged, slurmctld and slurmd.

``SlurmCluster.start()`` installs Debian's packages when they are missing and it runs as root,
writes a configuration into a new temporary directory (state, spool directories and logs live
there), starts the daemons in the background and waits until the nodes are idle; ``stop()``
cancels what still runs, stops exactly the processes it started and removes the directory.
Nothing else is touched, except the packages.

The cluster has two nodes on this one host, ``n1`` and ``n2``, each with every CPU of the host
(a heterogeneous job needs one node per component). Each slurmd runs in its own mount
namespace, where its spool directory and PMIx's client directory are bind-mounted on the same
paths: PMIx reaches a step's peers by those paths, which would otherwise collide between the two
slurmd. ``n1`` declares two GPUs whose device files are ``/dev/null`` and ``/dev/zero``: SLURM
schedules and binds them like any GPU, and the ranks, finding no CUDA, train on the CPU.

``SlurmCluster.start(testbed=bed)`` stands the cluster up on a :class:`hethpc.testbed.Testbed`
instead: munged and slurmctld on its head (the switch namespace, ``10.77.0.254``), one slurmd
per testbed node, inside that node's network namespace, cgroup and hostname (and a mount
namespace of its own, as above), so a job's ranks talk over the node's shaped link and share its
CPU quota. The nodes are named by their hostnames (``<name>-node0``, ...) and each declares the
host's CPUs: the node's cgroup, not SLURM, caps what they get. No CPU binding there (every
slurmd would bind its first task to the same core of the one host; srun says "cluster
configuration lacks support for cpu binding" and goes on). Every task prints
``hethpc-testbed: task <rank> on <hostname>`` first. Client commands (:meth:`SlurmCluster.run`,
:meth:`SlurmCluster.sbatch`) run on the head.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hethpc.testbed import Testbed

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
PROGRAMS = ["slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "munged", "sinfo"]
NODES = ["n1", "n2"]


class Unavailable(Exception):
    """This host cannot stand up a cluster (not root, no SLURM); the message says why.

    Anything else that goes wrong on the way up is an error, not a reason to skip."""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def install_if_missing() -> None:
    """Debian's SLURM and munge packages, when a program is missing (root only)."""
    if all(shutil.which(p) for p in PROGRAMS):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        missing = [p for p in PROGRAMS if not shutil.which(p)]
        raise Unavailable(
            f"SLURM is not installed ({', '.join(missing)} missing) and installing it needs root "
            f"and apt-get: apt-get install {' '.join(PACKAGES)}"
        )
    # Keep the packages' services from starting: the fixture starts its own daemons.
    policy = Path("/usr/sbin/policy-rc.d")
    made = not policy.exists()
    if made:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            upd = subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
            if upd.returncode == 0:
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            raise Unavailable(f"apt-get install {' '.join(PACKAGES)} failed: {proc.stderr[-500:]}")
    finally:
        if made:
            policy.unlink()


def _node_line() -> str:
    """This host's hardware as ``slurmd -C`` reports it, without the node name."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    fields = dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0]))
    return " ".join(f"{k}={fields[k]}" for k in keys)


class SlurmCluster:
    """Daemons started by :meth:`start`; ``env`` is what a client command needs (``SLURM_CONF``)."""

    def __init__(self, root: Path, testbed: Testbed | None = None) -> None:
        self.root = root
        self.testbed = testbed
        self.name = f"hethpct{os.getpid()}"
        self.nodes = (
            NODES if testbed is None else [testbed.hostname(i) for i in range(len(testbed.nodes))]
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self.munged_pid: int | None = None
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        self.two_nodes = True

    def head(self, cmd: list[str]) -> list[str]:
        """``cmd`` as run where the controller is reachable: the testbed's head, or here."""
        return cmd if self.testbed is None else self.testbed.head_argv(cmd)

    # -- set-up -----------------------------------------------------------------------------
    @classmethod
    def start(cls, *, testbed: Testbed | None = None) -> SlurmCluster:
        """A cluster in a new directory under the system's temporary directory (the munge user
        must reach it, which pytest's own temporary directories do not let it); on the nodes of
        ``testbed`` (which must be up) when given, else two nodes on this host."""
        if os.geteuid() != 0:
            raise Unavailable("standing up a SLURM cluster needs root (slurmd runs jobs as users)")
        if testbed is not None and not testbed.is_up:
            raise RuntimeError(f"testbed {testbed.name} is not up: start the cluster inside it")
        install_if_missing()
        c = cls(Path(tempfile.mkdtemp(prefix="hethpc-slurm-")), testbed)
        try:
            c._configure()
            c._start_munged()
            c._start_daemons()
        except BaseException:
            c.stop()
            raise
        return c

    def _configure(self) -> None:
        r = self.root
        r.chmod(0o755)
        for d in ["state", "log", "spool", "pmix", *self.nodes]:
            (r / d).mkdir(parents=True, exist_ok=True)
        for n in self.nodes:
            (r / n / "spool").mkdir()
            (r / n / "pmix").mkdir()
        ctld, *node_ports = _free_ports(1 + len(self.nodes))
        hw = _node_line()
        bed = self.testbed
        if bed is None:
            ctld_addr = "127.0.0.1"
            nodes = "\n".join(
                f"NodeName={n} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={p} "
                f"{hw}" + (" Gres=gpu:2" if n == "n1" else "")
                for n, p in zip(NODES, node_ports, strict=True)
            )
            task = "TaskPlugin=task/affinity"
            gres = "NodeName=n1 Name=gpu File=/dev/null\nNodeName=n1 Name=gpu File=/dev/zero\n"
        else:
            from hethpc.testbed.bed import HEAD_ADDRESS

            ctld_addr = HEAD_ADDRESS
            nodes = "\n".join(
                f"NodeName={n} NodeAddr={bed.address(i)} Port={p} {hw}"
                for i, (n, p) in enumerate(zip(self.nodes, node_ports, strict=True))
            )
            # A task's host in the job log: TaskProlog's "print" lines go to its stdout.
            prolog = r / "task_prolog"
            task = f"TaskPlugin=task/none\nTaskProlog={prolog}"
            gres = ""
            prolog.write_text(
                '#!/bin/sh\necho "print hethpc-testbed: task $SLURM_PROCID on $(hostname)"\n'
            )
            prolog.chmod(0o755)
        (r / "slurm.conf").write_text(
            f"""ClusterName={self.name}
SlurmctldHost={socket.gethostname()}({ctld_addr})
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.sock
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/spool/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
{task}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
SchedulerParameters=bf_interval=1
KillWait=5
SlurmdTimeout=60
GresTypes=gpu
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        (r / "gres.conf").write_text(gres)
        if bed is not None:
            # `ip netns exec` gave each node a fresh /sys without cgroups, where slurmd's
            # detection of the cgroup version fails; no plugin here uses cgroups (a node's cap
            # is the cgroup its slurmd was started in), so name the version instead.
            (r / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        (r / "mpi.conf").write_text(f"PMIxCliTmpDirBase={r}/pmix\n")

    def _start_munged(self) -> None:
        d = self.root / "munge"
        d.mkdir()
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        user = ["runuser", "-u", "munge", "--"] if _has_user("munge") else []
        if user:
            shutil.chown(d, "munge")
            shutil.chown(key, "munge")
        d.chmod(0o711)  # every user reaches the socket, only munge reads the rest
        cmd = [*user, "munged", f"--socket={d}/munge.sock", f"--key-file={key}",
               f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
               f"--seed-file={d}/seed", "--force"]  # fmt: skip
        proc = subprocess.run(self.head(cmd), capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"munged did not start: {proc.stderr.strip()}")
        self.munged_pid = int((d / "munged.pid").read_text())

    def _daemon(self, cmd: list[str], log: str) -> None:
        out = open(self.root / "log" / log, "wb")  # noqa: SIM115 (closed when the daemon ends)
        self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env))

    def _start_daemons(self) -> None:
        r = self.root
        conf = str(r / "slurm.conf")
        self._daemon(self.head(["slurmctld", "-D", "-f", conf]), "slurmctld.out")
        private = subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0
        self.two_nodes = private
        if self.testbed is not None:
            if not private:
                raise Unavailable("slurmd on a testbed needs its own mount namespace (unshare -m)")
            self._start_node_daemons(self.testbed, conf)
            return
        for n in NODES if private else NODES[:1]:
            mounts = (
                f"mount --bind {r}/{n}/spool {r}/spool && mount --bind {r}/{n}/pmix {r}/pmix && "
                if private
                else ""
            )
            self._daemon(
                ["unshare", "-m", "sh", "-c", f"{mounts}exec slurmd -D -N {n} -f {conf}"]
                if private
                else ["slurmd", "-D", "-N", n, "-f", conf],
                f"slurmd-{n}.out",
            )
        self._wait_idle(len(NODES) if private else 1)

    def _start_node_daemons(self, bed: Testbed, conf: str) -> None:
        """One slurmd per testbed node, on the node (its cgroup, namespace, hostname)."""
        r = self.root
        for i, n in enumerate(self.nodes):
            mounts = f"mount --bind {r}/{n}/spool {r}/spool && mount --bind {r}/{n}/pmix {r}/pmix"
            cmd = ["unshare", "-m", "sh", "-c", f"{mounts} && exec slurmd -D -N {n} -f {conf}"]
            self._daemon(bed.node_argv(i, cmd), f"slurmd-{n}.out")
        self._wait_idle(len(self.nodes))

    def _wait_idle(self, want: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
            if sum(line.split()[1] == "idle" for line in out.splitlines() if line.split()) >= want:
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a SLURM daemon exited: {p.args!r}\n{self.logs()}")
            time.sleep(0.3)
        raise RuntimeError(f"the SLURM nodes did not become idle within 60 s\n{self.logs()}")

    # -- use --------------------------------------------------------------------------------
    def run(self, cmd: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.head(cmd), capture_output=True, text=True, env=self.env, timeout=60
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def sbatch(self, args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
        """Submit; the job id."""
        proc = subprocess.run(
            self.head(["sbatch", "--parsable", *args]), capture_output=True, text=True, cwd=cwd,
            env={**self.env, **(env or {})}, timeout=60,
        )  # fmt: skip
        if proc.returncode != 0:
            raise AssertionError(f"sbatch {' '.join(args)} failed: {proc.stderr}")
        return proc.stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        """The job's state; a heterogeneous job's is its worst component's."""
        out = self.run(["scontrol", "show", "job", "-o", job]).stdout
        states = re.findall(r"JobState=(\S+)", out)
        for s in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            if s in states:
                return s
        return states[0]

    def wait(self, job: str, timeout: float) -> str:
        """Wait until the job has ended; its final state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.state(job)
            if s not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
                return s
            time.sleep(0.3)
        raise AssertionError(f"job {job} still {self.state(job)} after {timeout} s\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for f in sorted((self.root / "log").glob("*")):
            tail = f.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {f.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    # -- tear-down --------------------------------------------------------------------------
    def stop(self) -> None:
        if self.procs and self.procs[0].poll() is None:
            jobs = self.run(["squeue", "-h", "-o", "%A"], check=False).stdout.split()
            if jobs:
                self.run(["scancel", *jobs], check=False)
                deadline = time.monotonic() + 15
                while (
                    time.monotonic() < deadline
                    and self.run(["squeue", "-h"], check=False).stdout.strip()
                ):
                    time.sleep(0.3)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.munged_pid is not None:
            _end_daemon(self.munged_pid)  # it writes its seed file into root as it leaves
            self.munged_pid = None
        shutil.rmtree(self.root, ignore_errors=True)


def _end_daemon(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM a daemon (not this process's child) and wait until it is gone; SIGKILL after
    ``timeout_s``."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return
            if stat.rsplit(")", 1)[1].split()[0] == "Z":  # ended, not yet reaped by init
                return
            time.sleep(0.05)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
