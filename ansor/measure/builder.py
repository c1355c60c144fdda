"""Builders: replay, compile and export candidates as parallel Ray tasks with a hard timeout.

Each build is a Ray task taking one CPU, so a batch compiles on every free core of the cluster. It returns
the exported shared library as bytes: the runner that times it may live on another node. A build that
outlives its timeout is force-cancelled, which kills its worker process; nothing else can stop a compiler
stuck in C++. Each build runs under a memory cap (:mod:`ansor.measure.memory_cap`).

Whose fault is a failure? The candidate's when its build fails, hangs once started, or kills its worker
twice (the second time in a watched child, so the message says whether it was the memory cap or a crash).
The infrastructure's when the build's node or worker is lost, Ray kills it for the machine's memory, or
no worker starts it within :data:`WORKER_START_TIMEOUT`: such a build is submitted once more, and if that
fails too the candidate gets ``INFRA_ERROR`` (not learned from, proposed again later).
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
from tvm.support import cc as tvm_cc

from .. import codegen
from ..task import program
from ..errors import StepError, short_message
from ..state.loop_state import State
from ..log.measurement import BuildResult, ErrorNo, error_text
from ..task.search_task import SearchTask
from ..target import device_kind
from ..state.transform_steps import Step
from .memory_cap import IsolatedBuild, capped, default_cap_bytes, oom_result
from .ray_session import current_node, node_alive
from .shipping import TaskHandle, ship, task_key

logger = logging.getLogger("ansor")

DEFAULT_BUILD_TIMEOUT = 15.0
#: Seconds a submitted build may wait for a worker (queued behind others' work, cold start, TVM import).
WORKER_START_TIMEOUT = 120.0
#: Submissions of one build whose failures were the infrastructure's before it counts as INFRA_ERROR.
MAX_INFRA_ATTEMPTS = 2

#: A build job: a task and the state to build, ``None`` for the unscheduled program (the reference).
BuildJob = tuple[SearchTask, Optional[State]]


def build_program(task: SearchTask, steps: Optional[Sequence[Step]], memory_cap: Optional[int] = None) -> BuildResult:
    """Replay ``steps`` (``None``: the correctness reference, :func:`~ansor.task.program.reference`), compile
    for the task's target and export the library.

    Runs in whichever process calls it (a Ray worker in measurement, this process in benchmarks). Never
    raises: every failure becomes a :class:`BuildResult` with Ansor's error code. ``memory_cap``: the cap
    this process runs under (bytes), so that a failed allocation is reported as reaching it.
    """
    start = time.time()

    def failed(code: ErrorNo, msg: str) -> BuildResult:
        return BuildResult(None, int(code), msg, time.time() - start, start)

    try:
        if steps is None:
            mod, packed = program.reference(task), []
        else:
            mod, packed = program.kernel(task, task.compute_dag.init_state().with_steps(steps))
    except StepError as err:
        return failed(ErrorNo.INSTANTIATION_ERROR, error_text(err))
    except Exception as err:  # a bug in replay rather than a bad state: keep the trace
        return failed(ErrorNo.UNKNOWN_ERROR, error_text(err) + "\n" + traceback.format_exc(limit=5))
    try:
        executable = codegen.compile(mod, task.target)
        if steps is not None and device_kind(task.target).device_module and not executable.mod.imports:
            return failed(_compile_error(task), "no kernel: the program binds no loop to a GPU block or thread, "
                          "so it would run on the host and read device memory")
        with tempfile.TemporaryDirectory(prefix="ansor-build-") as tmp:
            path = os.path.join(tmp, "candidate.so")
            executable.export_library(path, **_link_options(task))
            with open(path, "rb") as f:
                lib = f.read()
    except Exception as err:  # TVM reports lowering/codegen errors as assorted exception types
        code = _compile_error(task)
        return oom_result(memory_cap, error_text(err), start, code) or failed(code, error_text(err))
    return BuildResult(lib, int(ErrorNo.NO_ERROR), "", time.time() - start, start, packed=tuple(packed))


def _compile_error(task: SearchTask) -> ErrorNo:
    return ErrorNo[device_kind(task.target).compile_error]


def _link_options(task: SearchTask) -> dict:
    """``export_library`` options: a CPU library links with ``gcc``, not TVM's default ``g++``.

    LLVM's object code only calls TVM's C runtime API, so libstdc++ is not needed, and leaving it out
    halves the link (~45 ms instead of ~90 ms per candidate here). GPU modules keep TVM's default.
    """
    if device_kind(task.target).device_module or shutil.which("gcc") is None:
        return {}
    return {"fcompile": functools.partial(tvm_cc.create_shared, cc="gcc")}


@ray.remote(num_cpus=1, max_retries=0, num_returns="streaming")  # RayBuilder decides what is retried
def _build_remote(handle: TaskHandle, steps: Optional[tuple[Step, ...]], memory_gib: Optional[float],
                  isolated: bool):
    # First item: the build has started, and where. The timeout counts from here, so a cold worker's start-up
    # and TVM import (seconds on a loaded machine) are not charged to the candidate.
    cap = int(memory_gib * 2 ** 30) if memory_gib else default_cap_bytes()
    if isolated:  # the candidate killed a worker once: find out why, in a process this worker survives
        task = handle.get()
        child = IsolatedBuild(task, steps, cap)  # returns once the process has imported TVM
        yield time.time(), current_node()
        result = child.result(_compile_error(task))
    else:
        yield time.time(), current_node()
        task = handle.get()
        with capped(cap):
            result = build_program(task, steps, cap)
    result.node = current_node()
    yield result


@dataclass
class _InFlight:
    index: int
    start: float  # wall clock: submission, then the worker's start marker
    deadline: float  # time.monotonic(); until the start marker arrives, the start-up deadline
    started: bool = False
    node: str = ""  # where it runs, from the start marker


@dataclass
class _Attempts:
    """What went wrong with one build so far."""

    infra: int = 0  # submissions lost to the infrastructure
    crashed: bool = False  # its worker died once: the next submission runs isolated


class RayBuilder:
    """Builds batches of candidates on the cluster's CPUs.

    Parameters
    ----------
    timeout
        Seconds a build may run once it has started on a worker; then the worker is killed
        (``BUILD_TIMEOUT``). At most one build per cluster CPU is in flight.
    memory_gib
        Memory cap of each build worker in GiB (default: per node, see :mod:`~ansor.measure.memory_cap`).
    start_timeout
        Seconds a submitted build may wait for a worker before the attempt counts as lost.
    """

    def __init__(self, timeout: float = DEFAULT_BUILD_TIMEOUT, memory_gib: Optional[float] = None,
                 start_timeout: float = WORKER_START_TIMEOUT):
        self.timeout = timeout
        self.memory_gib = memory_gib
        self.start_timeout = start_timeout

    def build(self, jobs: Sequence[BuildJob], on_done: Optional[Callable[[int, BuildResult], None]] = None,
              handles: Optional[dict[str, TaskHandle]] = None) -> list[BuildResult]:
        """Build every job; results in job order.

        ``on_done(index, result)`` fires as each finishes; ``handles`` are the tasks already shipped
        (:func:`~ansor.measure.shipping.ship`), if the caller has them.
        """
        handles = handles or ship(task for task, _ in jobs)
        results: list[Optional[BuildResult]] = [None] * len(jobs)
        attempts = [_Attempts() for _ in jobs]
        pending = deque(range(len(jobs)))
        in_flight: dict[ray.ObjectRefGenerator, _InFlight] = {}
        window = max(1, int(ray.cluster_resources().get("CPU", 1)))

        def finish(gen: ray.ObjectRefGenerator, result: BuildResult) -> None:
            index = in_flight.pop(gen).index
            results[index] = result
            if on_done is not None:
                on_done(index, result)

        def retry_or_finish(gen: ray.ObjectRefGenerator, why: str) -> None:
            """An infrastructure failure: submit the build again, or give up with INFRA_ERROR."""
            item = in_flight[gen]
            tried = attempts[item.index]
            tried.infra += 1
            if tried.infra < MAX_INFRA_ATTEMPTS:
                logger.warning("build of %s lost to the infrastructure (%s); submitting it again",
                               jobs[item.index][0].workload_key, why)
                in_flight.pop(gen)
                pending.appendleft(item.index)
            else:
                finish(gen, BuildResult(None, int(ErrorNo.INFRA_ERROR), f"build failed {tried.infra} times for "
                                        f"reasons outside the program; last: {why}", time.time() - item.start,
                                        item.start))

        def crashed(gen: ray.ObjectRefGenerator, err: BaseException) -> None:
            """The worker died building it: once, build it again isolated; twice, it is the candidate's."""
            item = in_flight[gen]
            task = jobs[item.index][0]
            if item.node and not node_alive(item.node):
                retry_or_finish(gen, f"node {item.node} left the cluster")
                return
            if not attempts[item.index].crashed:
                attempts[item.index].crashed = True
                logger.info("build of %s killed its worker; building it again in a watched process",
                            task.workload_key)
                in_flight.pop(gen)
                pending.appendleft(item.index)
                return
            msg = f"builder process died twice: {short_message(err, typed=True)}"
            logger.warning("candidate build of %s failed: %s", task.workload_key, msg)
            finish(gen, _failure(_compile_error(task), msg, item.start))

        try:
            while pending or in_flight:
                while pending and len(in_flight) < window:
                    i = pending.popleft()
                    task, state = jobs[i]
                    steps = None if state is None else tuple(state.steps)
                    gen = _build_remote.options(scheduling_strategy="SPREAD").remote(
                        handles[task_key(task)], steps, self.memory_gib, attempts[i].crashed)
                    in_flight[gen] = _InFlight(i, time.time(), time.monotonic() + self.start_timeout)
                wait_s = max(0.0, min(f.deadline for f in in_flight.values()) - time.monotonic())
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=wait_s)
                for gen in ready:
                    item = in_flight[gen]
                    try:
                        value = ray.get(next(gen))
                    except ray.exceptions.WorkerCrashedError as err:
                        crashed(gen, err)
                        continue
                    except (ray.exceptions.RayTaskError, StopIteration) as err:  # a bug of ours, not Ray's
                        finish(gen, _failure(ErrorNo.UNKNOWN_ERROR, f"build failed: {error_text(err)}",
                                             item.start))
                        continue
                    except ray.exceptions.RayError as err:  # node lost, killed for memory, object lost ...
                        retry_or_finish(gen, short_message(err, typed=True))
                        continue
                    if item.started:
                        finish(gen, value)
                    else:
                        (item.start, item.node), item.started = value, True
                        item.deadline = time.monotonic() + self.timeout
                now = time.monotonic()
                for gen in [g for g, f in in_flight.items() if f.deadline <= now]:
                    item = in_flight[gen]
                    ray.cancel(gen, force=True)
                    if item.started:
                        finish(gen, _failure(ErrorNo.BUILD_TIMEOUT, f"build did not finish within {self.timeout:g} "
                                             "s; its worker was killed", item.start))
                    else:
                        retry_or_finish(gen, f"no worker started it within {self.start_timeout:g} s")
        finally:  # Ctrl-C or a failing callback: do not leave compilers running on the cluster
            for gen in in_flight:
                ray.cancel(gen, force=True)
        return results  # type: ignore[return-value]


def _failure(code: ErrorNo, msg: str, start: float) -> BuildResult:
    return BuildResult(None, int(code), msg, time.time() - start, start)
