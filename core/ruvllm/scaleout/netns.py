"""A Ray cluster of separate hosts on one Linux machine: each host its own network, PID and
mount namespace, joined by a private bridge.

Why namespaces: what breaks across machines (GCS and raylet gRPC between addresses, the object
store across nodes, replica placement, a node dying) cannot show on one Ray node. A host here
has its own address on the bridge (``10.77.N.1`` the head, ``.2``, ``.3``... the workers), its
own process tree (killing the host kills exactly its processes, as a power cut would, and
``ray stop`` inside it sees only its own) and its own ``/tmp`` (Ray's session directory and
address file, so the hosts and any other Ray on the machine do not share them). Ray itself is
started with ``ray start --head`` / ``ray start --address=...``, as on real machines. Nothing
leaves the machine: the bridge has no uplink, and forwarding is not enabled; the root namespace
reaches the hosts through the bridge's own address (``10.77.N.254``).

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), ``ip``, ``unshare`` and ``nsenter``;
:func:`unavailable_reason` says which is missing. ``tests/scaleout/test_multi_node.py`` and
``benchmarks/multi_node.py`` both start their cluster with :class:`NetnsCluster`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from ruvllm.errors import ClusterStartError, NamespacesUnavailable

#: Ray's GCS port on the head.
GCS_PORT = 6379
#: Each host's /tmp (a tmpfs: Ray's session directory, logs, sockets).
TMP_SIZE = "2g"
#: Plasma store of each node: replicas exchange small messages only; Ray's default is 30 % of RAM.
OBJECT_STORE_BYTES = 200 * 1024 * 1024
#: Failure detection: the GCS checks every raylet each 0.5 s and declares a node dead after 4
#: misses (Ray's defaults: every 3 s, 5 misses), so a killed host shows dead within seconds.
HEAD_ENV = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "1000",
            "RAY_health_check_failure_threshold": "4"}

#: PID 1 of a host's PID namespace: reaps the Ray daemons that ``ray start`` leaves behind (a PID
#: namespace's init must, or they stay zombies) and holds the namespace open.
_REAPER = ("import os, time\n"
           "while True:\n"
           "    try:\n"
           "        os.wait()\n"
           "    except ChildProcessError:\n"
           "        time.sleep(0.5)\n")
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21
#: Where a host's mount namespace keeps the machine's /tmp before its own tmpfs covers it (an
#: empty directory every Debian has; the bind lives only in the host's namespace).
HOST_SEES_TMP = "/mnt"


def _keep_under_tmp() -> str:
    """Shell that binds back, into a host's private /tmp, the directories under the machine's
    /tmp this process runs from (a checkout and its virtualenv there, as CI's clone may be):
    without them the host's PID 1, this same Python, would not exist inside it."""
    paths = [Path(p).resolve() for p in (sys.prefix, os.getcwd())]
    tmp = Path("/tmp")
    tops = sorted({p.relative_to(tmp).parts[0] for p in paths if p.is_relative_to(tmp) and p != tmp})
    return "".join(f" && mkdir -p /tmp/{top} && mount --bind {HOST_SEES_TMP}/{top} /tmp/{top}"
                   for top in tops)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (None when they can), named for a skip message."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (this is {sys.platform})"
    for tool in ("ip", "unshare", "nsenter", "taskset"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    caps = _effective_caps()
    missing = [name for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
               if not caps >> bit & 1]
    if missing:
        return f"this process (uid {os.geteuid()}) lacks {' and '.join(missing)}: run it as root"
    probe = f"rvlprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def _effective_caps() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that made the cluster dies (a crashed
    or killed test), which takes the host down with it (``unshare --kill-child``), so no Ray
    process outlives its cluster's owner."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _sh(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterStartError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")


def sweep_stale(min_age: float = 300.0) -> None:
    """Remove what clusters whose owner died left behind: their processes die with the owner
    (see ``_die_with_parent``), their namespaces and bridge stay. A namespace of ours with no
    process in it, made more than ``min_age`` s ago (a cluster still starting has an empty one
    for a moment), goes, and its cluster's bridge with it."""
    for path in Path("/run/netns").glob("rvl*-*"):
        with contextlib.suppress(OSError):
            if time.time() - path.stat().st_mtime < min_age:
                continue
        if subprocess.run(["ip", "netns", "pids", path.name], capture_output=True, text=True).stdout.strip():
            continue
        subprocess.run(["ip", "netns", "delete", path.name], capture_output=True)
        subprocess.run(["ip", "link", "delete", path.name.split("-")[0]], capture_output=True)


def free_subnet() -> int:
    """N of the first 10.77.N.0/24 no interface of the root namespace uses (so two clusters, say a
    test and a person's benchmark, can run side by side)."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    for n in range(256):
        if f"10.77.{n}." not in used:
            return n
    raise ClusterStartError("every 10.77.N.0/24 is in use")


def _cpu_cgroup(name: str, cpus: float | None) -> Path:
    """A cgroup allowing ``cpus`` CPUs' time (cgroup v2's ``cpu.max``, else v1's CFS quota; None:
    no cap), and weighted 10x a plain process, so that it gets that time on a machine busy with
    other work (the cap alone bounds it from above only; equal CPU per node needs both)."""
    quota = -1 if cpus is None else int(cpus * 100_000)
    v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")
    period = 100_000
    if (v2 / "cgroup.controllers").exists() and "cpu" in (v2 / "cgroup.subtree_control").read_text():
        group = v2 / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {period}")
        (group / "cpu.weight").write_text("1000")
    elif (v1 / "cpu.cfs_quota_us").exists():
        group = v1 / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cpu.shares").write_text("10240")
    else:
        raise ClusterStartError("no cgroup CPU controller to cap a host's CPU time (cgroup v2 with the cpu "
                                "controller enabled, or v1's cpu hierarchy at /sys/fs/cgroup/cpu)")
    return group


@attrs.define(kw_only=True)
class Host:
    """One host: its network namespace, address, CPUs and PID-namespace init process."""

    name: str
    netns: str
    ip: str
    #: Machine CPUs every process of the host runs on (``taskset``).
    cpus: tuple[int, ...]
    #: CPUs its Ray node offers for scheduling (``ray start --num-cpus``).
    num_cpus: int
    head: bool = False
    #: ``unshare``, whose only child is the host's PID 1 (the reaper); None while the host is down.
    init: subprocess.Popen | None = None
    #: The cgroup every process of the host joins (a CPU quota), if any.
    cgroup: Path | None = None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` on the host's CPUs, in its cgroup (a process joins before it execs, so all its
        children are in it too)."""
        pinned = ["taskset", "-c", ",".join(map(str, self.cpus)), *argv]
        if self.cgroup is None:
            return pinned
        return ["sh", "-c", f'echo $$ > {self.cgroup}/cgroup.procs && exec "$@"', "sh", *pinned]

    @property
    def pid1(self) -> int:
        """The host's PID 1 as the root namespace sees it (what nsenter enters)."""
        assert self.init is not None, f"host {self.name} is down"
        deadline = time.monotonic() + 10
        while True:
            children = Path(f"/proc/{self.init.pid}/task/{self.init.pid}/children").read_text().split()
            if children:
                return int(children[0])
            if time.monotonic() > deadline or self.init.poll() is not None:
                raise ClusterStartError(f"host {self.name}: its namespace init did not start")
            time.sleep(0.05)


@attrs.define
class NetnsCluster:
    """Head + ``workers`` hosts on a bridge, each running a Ray node (:meth:`start`, :meth:`close`;
    or ``with NetnsCluster(...) as cluster``). ``worker_cpus``: Ray CPUs per worker node (the head
    gets none, so replicas land on the workers; its ``node:__internal_head__`` resource pins what
    must stay there). ``cpu_sets``: the machine CPUs each worker is pinned to, default one CPU
    each, round-robin over this process's affinity; the head runs on all of them. ``cpu_quota``
    (e.g. 0.5) instead caps every worker host at that many CPUs' time (a cgroup's CPU quota) on
    all of this process's CPUs: equal CPU per node for any node count, which pinning whole CPUs
    cannot give three nodes on two cores; every host's cgroup then also outweighs other work on
    the machine (the head's is not capped), for measurements on a shared machine."""

    workers: int = 2
    worker_cpus: int = 1
    cpu_sets: Sequence[Sequence[int]] | None = None
    cpu_quota: float | None = None
    subnet: int | None = None
    #: Extra environment of every Ray process (e.g. RAY_ settings).
    env: Mapping[str, str] = attrs.field(factory=dict)
    hosts: list[Host] = attrs.field(factory=list, init=False)
    bridge: str = attrs.field(default="", init=False)
    _tag: str = attrs.field(factory=lambda: uuid.uuid4().hex[:5], init=False)
    #: Ray token authentication with this cluster's own token (never ~/.ray/auth_token): ``ray
    #: start --address`` in Ray 2.60 does not turn token auth on by itself, so it is set for all.
    _token: str = attrs.field(factory=lambda: uuid.uuid4().hex + uuid.uuid4().hex, init=False)

    # ------------------------------------------------------------------ addresses
    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def address(self) -> str:
        """``RAY_ADDRESS`` of the cluster (the head's GCS)."""
        return f"{self.head.ip}:{GCS_PORT}"

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    # ------------------------------------------------------------------ life cycle
    def __enter__(self) -> NetnsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout: float = 120.0) -> None:
        """Make the bridge and hosts, start Ray on each, and wait until every node is alive. On
        any failure everything made so far is removed before the error propagates."""
        reason = unavailable_reason()
        if reason is not None:
            raise NamespacesUnavailable(reason)
        sweep_stale()
        try:
            self._make_network()
            for host in self.hosts:
                self._boot(host)
            self._start_ray(self.head)
            for host in self.hosts[1:]:
                self._start_ray(host)
            self.wait_for_nodes(len(self.hosts), timeout=timeout)
        except BaseException:
            self.close()
            raise

    def _make_network(self) -> None:
        n = free_subnet() if self.subnet is None else self.subnet
        self.subnet = n
        self.bridge = f"rvl{self._tag}"
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"10.77.{n}.254/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        mine = sorted(os.sched_getaffinity(0))
        sets = self.cpu_sets or [tuple(mine) if self.cpu_quota else (mine[i % len(mine)],)
                                 for i in range(self.workers)]
        names = ["head"] + [f"worker{i + 1}" for i in range(self.workers)]
        for i, name in enumerate(names):
            host = Host(name=name, netns=f"rvl{self._tag}-{name}", ip=f"10.77.{n}.{i + 1}",
                        cpus=tuple(mine) if i == 0 else tuple(sets[i - 1]),
                        num_cpus=0 if i == 0 else self.worker_cpus, head=i == 0)
            if self.cpu_quota:
                host.cgroup = _cpu_cgroup(f"rvl{self._tag}-{name}", None if host.head else self.cpu_quota)
            self.hosts.append(host)
            outer, inner = f"rvl{self._tag}h{i}", f"rvl{self._tag}g{i}"
            _sh("ip", "netns", "add", host.netns)
            _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            _sh("ip", "link", "set", outer, "master", self.bridge)
            _sh("ip", "link", "set", outer, "up")
            _sh("ip", "link", "set", inner, "netns", host.netns)
            _sh("ip", "-n", host.netns, "link", "set", "lo", "up")
            _sh("ip", "-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", inner)
            _sh("ip", "-n", host.netns, "link", "set", inner, "up")

    def _boot(self, host: Host) -> None:
        """Start the host's PID 1 in fresh PID and mount namespaces inside its network namespace,
        with a tmpfs on /tmp; ``--kill-child``: if unshare dies, the host dies with it, and unshare
        dies with this process."""
        script = (f"mount --bind /tmp {HOST_SEES_TMP} && mount -t tmpfs -o size={TMP_SIZE} tmpfs /tmp"
                  f"{_keep_under_tmp()} && exec {sys.executable} -c '{_REAPER}'")
        host.init = subprocess.Popen(
            host.wrap(["ip", "netns", "exec", host.netns, "unshare", "--pid", "--fork", "--kill-child",
                       "--mount-proc", "sh", "-c", script]),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_die_with_parent)
        host.pid1  # noqa: B018 -- waits until the init process exists

    def command(self, host: Host, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host`` (its network, PID and mount namespaces, on its CPUs)."""
        return host.wrap(["nsenter", "-t", str(host.pid1), "--net", "--mount", "--pid", f"--wd={os.getcwd()}",
                          "--", *argv])

    @property
    def environ(self) -> dict[str, str]:
        """What a process needs to join the cluster: ``RAY_ADDRESS`` and the cluster's token."""
        return {**os.environ, **self.env, "RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": self._token}

    def popen(self, host: Host, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              **kw: object) -> subprocess.Popen:
        """Start ``argv`` on ``host`` with this cluster's environment (:attr:`environ`)."""
        return subprocess.Popen(self.command(host, argv), env={**self.environ, **(env or {})},
                                **kw)  # type: ignore[call-overload]

    def _start_ray(self, host: Host) -> None:
        ray = str(Path(sys.executable).with_name("ray"))
        argv = [ray, "start", f"--node-ip-address={host.ip}", f"--num-cpus={host.num_cpus}", "--num-gpus=0",
                f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats"]
        if host.head:
            argv += ["--head", f"--port={GCS_PORT}", "--include-dashboard=false"]
        else:
            argv += [f"--address={self.address}"]
        proc = self.popen(host, argv, env=HEAD_ENV if host.head else None, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise ClusterStartError(f"`ray start` on {host.name} ({host.ip}) failed:\n{out[-3000:]}")

    def alive_nodes(self) -> dict[str, bool]:
        """Node IP -> alive, as the head's GCS sees it (asked from inside the head); a host that
        was restarted is alive when its new node is."""
        code = ("import json, ray; ray.init(log_to_driver=False, logging_level='ERROR'); "
                "print(json.dumps([[n['NodeManagerAddress'], n['Alive']] for n in ray.nodes()]))")
        out = subprocess.run(self.command(self.head, [sys.executable, "-c", code]), capture_output=True,
                             text=True, env=self.environ,
                             timeout=60)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
        alive: dict[str, bool] = {}
        for ip, up in json.loads(lines[-1]) if lines else []:
            alive[ip] = alive.get(ip, False) or up
        return alive

    def wait_for_nodes(self, count: int, timeout: float = 60.0) -> None:
        """Until ``count`` nodes of this cluster are alive."""
        deadline = time.monotonic() + timeout
        while True:
            alive = self.alive_nodes()
            if sum(alive.values()) >= count:
                return
            if time.monotonic() > deadline:
                raise ClusterStartError(f"only {alive} of {count} nodes alive after {timeout:.0f} s")
            time.sleep(1)

    def kill_host(self, name: str) -> None:
        """Every process of host ``name`` killed at once (SIGKILL to its PID 1 takes the whole PID
        namespace down): the raylet, object store, workers and replicas, as in a power cut. Its
        address stays on the bridge, so peers get refused connections, not silence."""
        host = self.host(name)
        if host.init is None:
            return
        with contextlib.suppress(ProcessLookupError, FileNotFoundError, ClusterStartError):
            os.kill(host.pid1, signal.SIGKILL)
        host.init.kill()
        host.init.wait(timeout=30)
        host.init = None

    def restart_host(self, name: str) -> None:
        """Boot host ``name`` again and start its Ray node (it rejoins the head's cluster)."""
        host = self.host(name)
        self.kill_host(name)
        self._boot(host)
        self._start_ray(host)

    def close(self) -> None:
        """Kill every host (workers first, then the head) and remove namespaces, veths and the
        bridge. Safe to call twice and after a partial start."""
        for host in reversed(self.hosts):
            with contextlib.suppress(Exception):
                self.kill_host(host.name)
        for i, host in enumerate(self.hosts):
            subprocess.run(["ip", "link", "delete", f"rvl{self._tag}h{i}"], capture_output=True)
            subprocess.run(["ip", "netns", "delete", host.netns], capture_output=True)
        if self.bridge:
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        for host in self.hosts:
            for _ in range(20):  # empty once the killed processes' parents have reaped them
                if host.cgroup is None or not host.cgroup.exists():
                    break
                with contextlib.suppress(OSError):
                    host.cgroup.rmdir()
                time.sleep(0.1)
        self.hosts.clear()


@attrs.define
class RayServe:
    """``ruvllm serve --ray`` running on a cluster's head; ``url`` is its address on the bridge."""

    url: str
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        """SIGINT first (Serve shuts its application down), SIGKILL after 20 s."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def serve_on_head(cluster: NetnsCluster, options: Sequence[str], *, log: Path, port: int = 8000,
                  timeout: float = 240.0) -> RayServe:
    """Run ``ruvllm serve --ray --host <head ip> --port <port> <options>`` inside the head, as the
    multi-node recipe in docs/scale-out.md does, and wait until it lists its model (reached from
    this, the root, namespace through the bridge)."""
    import httpx

    ruvllm = str(Path(sys.executable).with_name("ruvllm"))
    argv = [ruvllm, "serve", "--ray", "--host", cluster.head.ip, "--port", str(port), *options]
    out = log.open("wb")
    proc = cluster.popen(cluster.head, argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    served = RayServe(url=f"http://{cluster.head.ip}:{port}", proc=proc, log=log)
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(served.url + "/v1/models", timeout=5).status_code == 200:
                return served
        if proc.poll() is not None or time.monotonic() > deadline:
            served.stop()
            tail = log.read_text(errors="replace")[-3000:]
            raise ClusterStartError(f"`ruvllm serve --ray` on the head did not come up "
                                    f"(exit {proc.poll()}):\n{tail}")
        time.sleep(1)
