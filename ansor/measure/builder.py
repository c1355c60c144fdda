"""Builders: replay, compile and export candidates as parallel Ray tasks with a hard timeout.

Each build is a Ray task taking one CPU, so a batch compiles on every free core of the cluster. It returns
the exported shared library as bytes: the runner that times it may live on another node. A build that
outlives its timeout is force-cancelled, which kills its worker process; nothing else can stop a compiler
stuck in C++.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import ray
import tvm
from tvm.support import cc as tvm_cc

from .. import apply
from ..errors import StepError
from ..loop_state import State
from ..search_task import SearchTask
from ..target import is_gpu
from ..transform_steps import Step
from .ray_session import current_node
from .shipping import TaskHandle, ship, task_key
from .types import BuildResult, ErrorNo

logger = logging.getLogger("ansor")

DEFAULT_BUILD_TIMEOUT = 15.0
#: Seconds a submitted build may wait for a worker (queued behind others' work, cold start, TVM import).
WORKER_START_TIMEOUT = 120.0
#: Error messages are stored in logs; a TVM trace can be hundreds of lines.
MAX_ERROR_CHARS = 2000

#: A build job: a task and the state to build, ``None`` for the unscheduled program (the reference).
BuildJob = tuple[SearchTask, Optional[State]]


def short_error(err: BaseException) -> str:
    """``Type: message``, trimmed to what a log line should carry."""
    text = f"{type(err).__name__}: {str(err).strip()}"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + " ..."


def build_program(task: SearchTask, steps: Optional[Sequence[Step]]) -> BuildResult:
    """Replay ``steps`` (``None``: no schedule), compile for the task's target and export the library.

    Runs in whichever process calls it (a Ray worker in measurement, this process in benchmarks). Never
    raises: every failure becomes a :class:`BuildResult` with Ansor's error code.
    """
    start = time.time()

    def failed(code: ErrorNo, msg: str) -> BuildResult:
        return BuildResult(None, int(code), msg, time.time() - start, start)

    try:
        state = None if steps is None else task.compute_dag.init_state().with_steps(steps)
        mod, packed = apply.kernel(task, state)
    except StepError as err:
        return failed(ErrorNo.INSTANTIATION_ERROR, short_error(err))
    except Exception as err:  # a bug in replay rather than a bad state: keep the trace
        return failed(ErrorNo.UNKNOWN_ERROR, short_error(err) + "\n" + traceback.format_exc(limit=5))
    try:
        executable = tvm.compile(mod, target=task.target)
        with tempfile.TemporaryDirectory(prefix="ansor-build-") as tmp:
            path = os.path.join(tmp, "candidate.so")
            executable.export_library(path, **_link_options(task))
            with open(path, "rb") as f:
                lib = f.read()
    except Exception as err:  # TVM reports lowering/codegen errors as assorted exception types
        code = ErrorNo.COMPILE_DEVICE if is_gpu(task.target) else ErrorNo.COMPILE_HOST
        return failed(code, short_error(err))
    return BuildResult(lib, int(ErrorNo.NO_ERROR), "", time.time() - start, start, packed=tuple(packed))


def _link_options(task: SearchTask) -> dict:
    """``export_library`` options: a CPU library links with ``gcc``, not TVM's default ``g++``.

    LLVM's object code only calls TVM's C runtime API, so libstdc++ is not needed, and leaving it out
    halves the link (~45 ms instead of ~90 ms per candidate here). GPU modules keep TVM's default.
    """
    if is_gpu(task.target) or shutil.which("gcc") is None:
        return {}
    return {"fcompile": functools.partial(tvm_cc.create_shared, cc="gcc")}


@ray.remote(num_cpus=1, max_retries=1, num_returns="streaming")  # retried only if its node or worker is lost
def _build_remote(handle: TaskHandle, steps: Optional[tuple[Step, ...]]):
    # First item: the build has started. The timeout counts from here, so a cold worker's start-up and TVM
    # import (seconds on a loaded machine) are not charged to the candidate.
    yield time.time()
    result = build_program(handle.get(), steps)
    result.node = current_node()
    yield result


@dataclass
class _InFlight:
    index: int
    start: float  # wall clock: submission, then the worker's start marker
    deadline: float  # time.monotonic(); until the start marker arrives, the start-up deadline
    started: bool = False


class RayBuilder:
    """Builds batches of candidates on the cluster's CPUs.

    Parameters
    ----------
    timeout
        Seconds a build may run once it has started on a worker; then the worker is killed
        (``BUILD_TIMEOUT``). At most one build per cluster CPU is in flight.
    """

    def __init__(self, timeout: float = DEFAULT_BUILD_TIMEOUT):
        self.timeout = timeout

    def build(self, jobs: Sequence[BuildJob], on_done: Optional[Callable[[int, BuildResult], None]] = None,
              handles: Optional[dict[str, TaskHandle]] = None) -> list[BuildResult]:
        """Build every job; results in job order.

        ``on_done(index, result)`` fires as each finishes; ``handles`` are the tasks already shipped
        (:func:`~ansor.measure.shipping.ship`), if the caller has them.
        """
        handles = handles or ship(task for task, _ in jobs)
        results: list[Optional[BuildResult]] = [None] * len(jobs)
        pending = deque(range(len(jobs)))
        in_flight: dict[ray.ObjectRefGenerator, _InFlight] = {}
        window = max(1, int(ray.cluster_resources().get("CPU", 1)))

        def finish(gen: ray.ObjectRefGenerator, result: BuildResult) -> None:
            index = in_flight.pop(gen).index
            results[index] = result
            if on_done is not None:
                on_done(index, result)

        try:
            while pending or in_flight:
                while pending and len(in_flight) < window:
                    i = pending.popleft()
                    task, state = jobs[i]
                    steps = None if state is None else tuple(state.steps)
                    gen = _build_remote.options(scheduling_strategy="SPREAD").remote(handles[task_key(task)], steps)
                    in_flight[gen] = _InFlight(i, time.time(), time.monotonic() + WORKER_START_TIMEOUT)
                wait_s = max(0.0, min(f.deadline for f in in_flight.values()) - time.monotonic())
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=wait_s)
                for gen in ready:
                    item = in_flight[gen]
                    try:
                        value = ray.get(next(gen))
                    except (ray.exceptions.RayError, StopIteration) as err:
                        finish(gen, self._failed(err, jobs[item.index][0], item.start))
                        continue
                    if item.started:
                        finish(gen, value)
                    else:
                        item.started, item.start, item.deadline = True, value, time.monotonic() + self.timeout
                now = time.monotonic()
                for gen in [g for g, f in in_flight.items() if f.deadline <= now]:
                    item = in_flight[gen]
                    ray.cancel(gen, force=True)
                    why = (f"did not finish within {self.timeout:g} s" if item.started
                           else f"did not start within {WORKER_START_TIMEOUT:g} s")
                    finish(gen, BuildResult(None, int(ErrorNo.BUILD_TIMEOUT), f"build {why}; its worker was killed",
                                            time.time() - item.start, item.start))
        finally:  # Ctrl-C or a failing callback: do not leave compilers running on the cluster
            for gen in in_flight:
                ray.cancel(gen, force=True)
        return results  # type: ignore[return-value]

    @staticmethod
    def _failed(err: BaseException, task: SearchTask, start: float) -> BuildResult:
        if isinstance(err, ray.exceptions.WorkerCrashedError):  # the compiler took its process down
            code = ErrorNo.COMPILE_DEVICE if is_gpu(task.target) else ErrorNo.COMPILE_HOST
            msg = f"builder process died: {short_error(err)}"
        else:  # node lost twice, worker start-up failure, ...
            code, msg = ErrorNo.UNKNOWN_ERROR, f"build failed in Ray: {short_error(err)}"
        logger.warning("candidate build of %s failed: %s", task.workload_key, msg.splitlines()[0])
        return BuildResult(None, int(code), msg, time.time() - start, start)
