"""The target of a script's ``--target`` flag, and the thread count its kernels run with."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import Counter
from typing import Optional, Sequence

logger = logging.getLogger("ansor")


def set_tvm_threads(target) -> int:
    """Set ``TVM_NUM_THREADS`` to the target's core count unless the user set it; returns the count in force.

    TVM sizes its CPU thread pool once, from this variable, when the first kernel runs; Ray workers inherit
    the environment. Without it a 2-vCPU machine runs every kernel on one thread.
    """
    cores = int(target.attrs["num-cores"]) if "num-cores" in target.attrs else 1
    os.environ.setdefault("TVM_NUM_THREADS", str(cores))
    return int(os.environ["TVM_NUM_THREADS"])


def parse_target_and_threads(text: Optional[str], ray_address: Optional[str] = None, runs_here: bool = False):
    """:func:`~ansor.target.parse_target` then :func:`set_tvm_threads`; returns the target.

    ``runs_here``: the command runs the target's code on this machine (no ``ray_address``): a CPU target
    whose units this CPU lacks is an error here, not a worker killed by SIGILL at every candidate.

    A CUDA target given without ``arch`` gets the arch of a GPU of the Ray cluster (``ray_address``, else
    a local instance started just for the question); with no GPU there, TVM's default stays and
    measurement will say that no GPU can run the candidates.
    """
    from ..target import device_kind, parse_target
    target = parse_target(text)
    if device_kind(target).detect_arch and "arch" not in (text or ""):
        from ..measure.ray_session import RaySession, cluster_cuda_arch
        session = RaySession.open(ray_address)
        try:
            arch = cluster_cuda_arch()
        finally:
            session.close()
        if arch:
            target = parse_target({**json.loads(str(target)), "arch": arch})
            logger.info("CUDA arch %s detected on the cluster's GPU", arch)
    set_tvm_threads(target)
    if not device_kind(target).device_module:  # a CPU target whose code runs here must run on this CPU
        from ..errors import TargetError
        from ..target import target_label
        from ..host_cpu import host_cpu
        cpu = host_cpu()
        missing = cpu.missing(target) if runs_here and not (ray_address or os.environ.get("RAY_ADDRESS")) else []
        if missing:
            raise TargetError(f"target {target_label(target)} uses {', '.join(missing)}, which this CPU "
                              f"({cpu.model}) lacks (of these units it has: {cpu.units}); "
                              "use --target host, or --ray-address for a cluster whose nodes have them")
    return target


def announce_target(target) -> None:
    """A tuning command's first line, once its input is checked: the target and, for a CPU target, the
    matrix units this host has (so a user sees whether bf16 or AMX would be there to use)."""
    from ..host_cpu import host_cpu
    from ..target import device_kind, target_label
    host = "" if device_kind(target).device_module else f"; this host: {host_cpu().describe()}"
    print(f"target: {target_label(target)}{host}", file=sys.stderr)


def add_log_target_arg(parser: argparse.ArgumentParser) -> None:
    """``--target`` of the commands that build a network from a log's records."""
    from ..arguments import Text
    parser.add_argument("--target", default=None, type=Text("a target", "host"),
                        help="target to build for and whose records to use (default: the target most records "
                             "of the log were measured for, else 'host')")


def log_target(paths: Sequence[os.PathLike], keys: Optional[set[str]] = None) -> Optional[str]:
    """The target most records in ``paths`` were measured for (only records of ``keys`` if given)."""
    from ..log.records import load_records
    counts = Counter(rec.task.target_str for rec in load_records(list(paths))
                     if keys is None or rec.workload_key in keys)
    return counts.most_common(1)[0][0] if counts else None
