"""Starting, joining and leaving Ray, and what the measurer needs to know about its nodes.

Ray is the only execution engine. With no address we start an embedded single-machine instance that is
quiet, has no dashboard, a bounded object store, keeps its files under a fresh temp dir, reports no usage
statistics and listens on 127.0.0.1 only (:func:`loopback_only`); with an address (``--ray-address`` or
``RAY_ADDRESS``) we join an existing cluster. We shut down only what we started: an embedded instance is
stopped (and its temp dir removed) at :meth:`RaySession.close`, at interpreter exit and after Ctrl-C; a
cluster we joined is only left.
"""

from __future__ import annotations

import atexit
import ipaddress
import glob
import logging
import os
import re
import shutil
import socket
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import psutil
import ray
from ray._private import ray_constants

from ..errors import AnsorError, short_message
from ..torchless import WORKER_ENV

logger = logging.getLogger("ansor")

#: Object store of the embedded instance: builds (~100 KB each) and reference outputs are all it holds.
DEFAULT_OBJECT_STORE_BYTES = 256 * 2 ** 20
#: Name prefix of an embedded instance's temp dir; the tuner's pid follows.
TEMP_PREFIX = "ansor-ray-"
#: How long an idle worker beyond Ray's soft limit lives (Ray's default: 1 s). Longer than a batch's run
#: phase, during which the CPU hold leaves build workers idle; the cost is a worker's memory for 10 s.
IDLE_WORKER_KEEP_MS = 10_000
#: Bytes read from the end of a dead worker's stderr to find why it died (Ray's and Python's crash reports).
DEATH_LOG_TAIL = 64 * 1024
#: Seconds to wait for a cluster given by address to answer before calling it unreachable.
CONNECT_TIMEOUT_S = 10.0

#: Environment of an embedded instance, read by each Ray process at import: with it Ray takes 127.0.0.1 as
#: the node's address, where every server binds (checked with ``ss -ltnp`` on Ray 2.60; docs/safety.md).
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_PROMPT_ENABLED": "0",
}
LOOPBACK_IP = "127.0.0.1"
#: A joined cluster's workers' mark (:mod:`ansor.torchless`; Ray merges an actor's ``env_vars`` with it). The
#: embedded Ray's raylet gets it in its environment instead (:func:`_worker_mark`): as a job runtime_env it
#: made every start's first tasks wait 2.9 s for workers instead of 1.65 s.
WORKER_RUNTIME_ENV = {"env_vars": {WORKER_ENV: "1"}}


class RayUnavailableError(AnsorError):
    """Ray could not be started or reached (a cluster address that does not answer)."""


class RayDiedError(RayUnavailableError):
    """The Ray instance or cluster went away during the run: not bad input, so the scripts exit with 1."""

    exit_code = 1


class LoopbackSettings:
    """Makes the Ray instances this process starts listen on 127.0.0.1 only, until :meth:`restore`.

    Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when ``ray`` is imported, into
    ``ray_constants.ENABLE_RAY_CLUSTER``; with it true (the Linux default) ``ray.init`` even rewrites a
    node address of ``127.0.0.1`` into the machine's network address, and the servers bind to all
    interfaces. Setting the variable after the import changes nothing in this process, so the constant
    is set too; the variable still matters for the processes Ray starts. Both are restored afterwards (a
    later ``ray.init`` that joins a cluster needs the real address).
    """

    def __init__(self) -> None:
        self._saved_env = _set_env(LOOPBACK_ENV)
        self._saved_flag = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False

    def restore(self) -> None:
        ray_constants.ENABLE_RAY_CLUSTER = self._saved_flag
        _restore_env(self._saved_env)


def _set_env(values: dict[str, str]) -> dict[str, Optional[str]]:
    """Set ``values`` in this process's environment; returns what they replaced (``None``: unset)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    return saved


def _restore_env(saved: dict[str, Optional[str]]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextmanager
def loopback_only() -> Iterator[None]:
    """Within the block, Ray instances started here (``ray.cluster_utils.Cluster`` too) use loopback only."""
    settings = LoopbackSettings()
    try:
        yield
    finally:
        settings.restore()


@dataclass
class RaySession:
    """Our connection to Ray and what closing it must undo.

    Attributes
    ----------
    address
        The cluster we joined, ``None`` for the embedded instance or a connection we reused.
    owns_cluster
        We started the Ray processes, so closing stops them.
    owns_connection
        We called ``ray.init``, so closing calls ``ray.shutdown`` (which only disconnects from a joined
        cluster). False when this process was already connected to Ray; then closing does nothing.
    temp_dir
        Where the embedded instance keeps sockets and logs (removed on close).
    """

    address: Optional[str]
    owns_cluster: bool
    owns_connection: bool
    temp_dir: Optional[str] = None
    _closed: bool = False
    _loopback: Optional[LoopbackSettings] = None  # kept while the embedded instance runs

    @staticmethod
    def open(address: Optional[str] = None, *, num_cpus: Optional[int] = None,
             object_store_memory: int = DEFAULT_OBJECT_STORE_BYTES) -> "RaySession":
        """Join ``address`` (default ``$RAY_ADDRESS``), reuse this process's connection, or start Ray.

        Parameters
        ----------
        address
            A cluster address (``host:port`` or ``ray://...``); ``None`` falls back to ``$RAY_ADDRESS``
            and then to an embedded local instance.
        num_cpus
            CPUs of the embedded instance (default: all of this machine's).
        object_store_memory
            Object store size of the embedded instance, in bytes.
        """
        if ray.is_initialized():
            if address:
                logger.warning("this process is already connected to Ray; not joining %s", address)
            return RaySession(address=None, owns_cluster=False, owns_connection=False)
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address:
            session = RaySession._join(address)
        else:
            session = RaySession._start(num_cpus, object_store_memory)
        atexit.register(session.close)
        return session

    @staticmethod
    def _join(address: str) -> "RaySession":
        """Connect to the cluster at ``address``; a cluster that does not answer is a one-line error, fast."""
        if "://" not in address and address != "auto":  # Ray Client has its own timeout; auto looks locally
            _check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING,
                     runtime_env=WORKER_RUNTIME_ENV)
        except Exception as err:  # ConnectionError, RuntimeError, grpc errors...: all say "cannot join"
            raise RayUnavailableError(f"cannot join the Ray cluster at {address}: {short_message(err)} "
                                      "(give --ray-address HOST:PORT of a running cluster's head, "
                                      "or leave it out to start a local Ray)") from None
        logger.info("joined Ray cluster at %s (%s CPUs, %s GPUs)", address,
                    ray.cluster_resources().get("CPU", 0), ray.cluster_resources().get("GPU", 0))
        return RaySession(address=address, owns_cluster=False, owns_connection=True)

    @staticmethod
    def _start(num_cpus: Optional[int], object_store_memory: int) -> "RaySession":
        """Start the embedded instance: loopback only, its files under a fresh temp dir."""
        _remove_stale_temp_dirs()
        temp_dir = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
        # Ray keeps num_cpus idle workers and kills the rest after a second idle. The run phase's CPU hold
        # needs one more worker, so without headroom nearly every batch lost a build worker and the next
        # batch's builds waited ~2-3 s for a fresh process to import TVM. Headroom alone still lost one now
        # and then, so an idle worker is also kept for IDLE_WORKER_KEEP_MS, longer than a run phase.
        soft_limit = (num_cpus or os.cpu_count() or 1) + 2
        # Ray starts its workers at nice 15: our builders and runners then get a sliver of a core beside any
        # process of normal priority. Beside two busy loops a build worker took 49 s to start instead of ~2,
        # and a runner's timing would yield to any background job. They are the tuner's own work: nice 0.
        system_config = {"num_workers_soft_limit": soft_limit,
                         "idle_worker_killing_time_threshold_ms": IDLE_WORKER_KEEP_MS, "worker_niceness": 0}
        loopback = LoopbackSettings()  # kept until close: workers started later inherit this environment
        try:
            with _worker_mark():
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                         object_store_memory=object_store_memory, _temp_dir=temp_dir,
                         _node_ip_address=LOOPBACK_IP, logging_level=logging.ERROR, _system_config=system_config)
            node_ip = ray.util.get_node_ip_address()
            if not ipaddress.ip_address(node_ip).is_loopback:
                raise RayUnavailableError(f"the local Ray instance took {node_ip} as its address instead of "
                                          f"{LOOPBACK_IP}; refusing to run it on a network interface")
        except BaseException:
            if ray.is_initialized():
                ray.shutdown()
            loopback.restore()
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise
        logger.info("started a local Ray instance (%s CPUs, files in %s)",
                    ray.cluster_resources().get("CPU", 0), temp_dir)
        return RaySession(address=None, owns_cluster=True, owns_connection=True, temp_dir=temp_dir,
                          _loopback=loopback)

    def check_alive(self) -> None:
        """Raise :class:`RayDiedError` if Ray is gone (a killed raylet or GCS; a cluster that stopped).

        Checked before each batch: once its local raylet is dead, the next task submission ends this
        process from inside Ray's C++ core, with no Python error to report; this says why beforehand.
        """
        if self.owns_cluster:
            node = ray._private.worker._global_node
            essential = {ray_constants.PROCESS_TYPE_RAYLET, ray_constants.PROCESS_TYPE_GCS_SERVER}
            dead = sorted({kind for kind, _ in node.dead_processes() if kind in essential}) if node else ["Ray"]
            if dead:
                raise RayDiedError(f"the local Ray instance died ({', '.join(dead)} stopped: killed, or out of "
                                   "memory?); every finished measurement is in the log: rerun with --resume")
            return
        where = f" at {self.address}" if self.address else ""
        try:
            alive = alive_nodes()
        except Exception as err:  # the GCS does not answer
            raise RayDiedError(f"lost the Ray cluster{where}: {short_message(err)}") from None
        if not alive:
            raise RayDiedError(f"the Ray cluster{where} has no live node left")

    def close(self) -> None:
        """Disconnect, and stop the Ray processes if we started them. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            if self.owns_connection and ray.is_initialized():
                ray.shutdown()
        finally:
            if self._loopback is not None:
                self._loopback.restore()
            if self.temp_dir:
                shutil.rmtree(self.temp_dir, ignore_errors=True)


@contextmanager
def _worker_mark() -> Iterator[None]:
    """:data:`~ansor.torchless.WORKER_ENV` in this process's environment while ``ray.init`` starts the local
    Ray: its raylet keeps it and passes it to every worker it starts; this process's own later children
    (a user's scripts, a benchmark's subprocesses) do not get it."""
    saved = _set_env({WORKER_ENV: "1"})
    try:
        yield
    finally:
        _restore_env(saved)


def _remove_stale_temp_dirs() -> None:
    """Remove the temp dirs of embedded instances whose tuner died without cleaning up (``kill -9``).

    Ray's processes share their driver's fate and exit with it; its files stay. A dir is named after the
    tuner's pid, and is stale once no process with that pid runs (a reused pid only postpones the cleanup).
    """
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid = name[len(TEMP_PREFIX):].split("-", 1)[0]
        if name.startswith(TEMP_PREFIX) and pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _check_reachable(address: str) -> None:
    """Raise :class:`RayUnavailableError` unless something accepts TCP connections at ``host:port``.

    Ray itself retries an unreachable GCS for about a minute before failing; a typo in ``--ray-address``
    should cost seconds.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise RayUnavailableError(f"--ray-address {address!r} is not HOST:PORT (example: --ray-address "
                                  "10.0.0.5:6379, or ray://HOST:10001 for Ray Client)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise RayUnavailableError(f"cannot join the Ray cluster at {address}: nothing answers there "
                                  f"({err.strerror or err}); start it with `ray start --head`, give the "
                                  "head's HOST:PORT, or leave --ray-address out to start a local Ray") from None


@dataclass(frozen=True)
class NodeInfo:
    """A live Ray node and the devices it offers."""

    node_id: str
    cpus: int
    gpus: int


def alive_nodes() -> list[NodeInfo]:
    """Nodes the GCS currently considers alive."""
    nodes = []
    for node in ray.nodes():
        if node.get("Alive"):
            res = node.get("Resources", {})
            nodes.append(NodeInfo(node["NodeID"], int(res.get("CPU", 0)), int(res.get("GPU", 0))))
    return nodes


def node_alive(node_id: str) -> bool:
    return any(n.node_id == node_id for n in alive_nodes())


def current_node() -> str:
    """Id of the node this process runs on (driver or worker)."""
    return ray.get_runtime_context().get_node_id()


def death_cause(err: BaseException) -> Optional[str]:
    """Why the worker behind Ray's "actor died" error died, read from its log when that lies on this machine.

    Ray's own message only lists possible causes (OOM killer, ``ray stop``, a crash); the worker's stderr
    holds the signal Ray's handler saw and Python's fatal-error line, e.g. ``SIGSEGV (Fatal Python error:
    Segmentation fault)``. ``None`` when the log is elsewhere (another node) or says nothing of either.
    """
    pid = re.search(r"\bpid: (\d+)", str(err))
    try:
        logs = ray._private.worker.global_worker.node.get_logs_dir_path()
    except Exception:  # a Ray Client connection, or no local node: the log is not here
        return None
    found = glob.glob(os.path.join(logs, f"worker-*-{pid.group(1)}.err")) if pid else []
    if not found:
        return None
    with open(found[0], "rb") as f:
        f.seek(max(0, os.path.getsize(found[0]) - DEATH_LOG_TAIL))
        tail = f.read().decode(errors="replace")
    signals = re.findall(r"\*\*\* (SIG[A-Z]+) received", tail)
    fatal = re.findall(r"^Fatal Python error: (.+)$", tail, re.MULTILINE)
    words = signals[-1:] + [f"Fatal Python error: {line}" for line in fatal[-1:]]
    return ", ".join(words) or None


@ray.remote(num_gpus=1, max_retries=0)
def _cuda_arch() -> str:
    import tvm
    return "sm_" + tvm.cuda(0).compute_version.replace(".", "")


def cluster_cuda_arch(timeout: float = 120.0) -> Optional[str]:
    """``sm_XY`` of a GPU of the cluster (asked on a GPU node), or None when the cluster has no GPU.

    The machine that runs the search often has no GPU; the arch a CUDA target is compiled for must be the
    runners', so it is asked where they run.
    """
    if not ray.cluster_resources().get("GPU"):
        return None
    return ray.get(_cuda_arch.remote(), timeout=timeout)
