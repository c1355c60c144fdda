"""Starting, joining and leaving Ray, and what the measurer needs to know about its nodes.

Ray is the only execution engine. With no address we start an embedded single-machine instance that is
quiet, has no dashboard, a bounded object store, keeps its files under a fresh temp dir and listens on
127.0.0.1 only; with an address (``--ray-address`` or ``RAY_ADDRESS``) we join an existing cluster. We
shut down only what we started: an embedded instance is stopped (and its temp dir removed) at
:meth:`RaySession.close`, at interpreter exit and after Ctrl-C; a cluster we joined is only left.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Optional

import ray

logger = logging.getLogger("ansor")

#: Object store of the embedded instance: builds (~100 KB each) and reference outputs are all it holds.
DEFAULT_OBJECT_STORE_BYTES = 256 * 2 ** 20


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
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            logger.info("joined Ray cluster at %s (%s CPUs, %s GPUs)", address,
                        ray.cluster_resources().get("CPU", 0), ray.cluster_resources().get("GPU", 0))
            session = RaySession(address=address, owns_cluster=False, owns_connection=True)
        else:
            # Without this Ray binds its services to every interface of the machine (see TVM_NOTES).
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            temp_dir = tempfile.mkdtemp(prefix="ansor-ray-")
            # Ray keeps num_cpus idle workers and kills the rest after a second idle. The run phase's CPU
            # hold needs one more worker, so without headroom nearly every batch lost a build worker and
            # the next batch's builds waited ~2-3 s for a fresh process to import TVM.
            soft_limit = (num_cpus or os.cpu_count() or 1) + 2
            try:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                         object_store_memory=object_store_memory, _temp_dir=temp_dir,
                         logging_level=logging.ERROR, _system_config={"num_workers_soft_limit": soft_limit})
            except BaseException:
                shutil.rmtree(temp_dir, ignore_errors=True)
                raise
            logger.info("started a local Ray instance (%s CPUs, files in %s)",
                        ray.cluster_resources().get("CPU", 0), temp_dir)
            session = RaySession(address=None, owns_cluster=True, owns_connection=True, temp_dir=temp_dir)
        atexit.register(session.close)
        return session

    def close(self) -> None:
        """Disconnect, and stop the Ray processes if we started them. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self.owns_connection and ray.is_initialized():
            ray.shutdown()
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


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
