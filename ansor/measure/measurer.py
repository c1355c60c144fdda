"""ProgramMeasurer: the one entry point the search calls to measure a batch of candidates.

A measurer is a builder and a runner (:class:`ProgramBuilder`, :class:`ProgramRunner`), Ray's by default
(:class:`~ansor.measure.builder.RayBuilder`, :class:`~ansor.measure.runner_pool.RunnerPool`); a caller
may give others, e.g. a remote runner or a test double.

A batch goes through two phases. Build: every candidate (and, once per task, the correctness reference:
the unscheduled program, :func:`~ansor.task.program.reference`) compiles in parallel on all CPUs of the
cluster. Run: each node's CPUs are reserved, the references are computed once, then every built candidate is
checked and timed, one at a time per device. Builds and runs alternate, so no timing ever shares its cores
with a compiler; on an embedded Ray the machine-wide :class:`~ansor.measure.host_lock.HostLock` extends that
to other tuners on the same machine. Every result goes to the callbacks as soon as it is known;
:meth:`ProgramMeasurer.measure` returns them in input order.

A reference that fails to run is tried once more on a fresh runner; if it fails again, the task's
candidates are timed without a check for the rest of the session, and each of their results says so
(``MeasureResult.checked`` is False; the log marks such records).
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Callable, ContextManager, Iterable, Optional, Protocol, Sequence

import ray

from ..errors import AnsorError, short_message
from ..log.measurement import MAX_COST, BuildResult, ErrorNo, MeasureCallback, MeasureInput, MeasureResult, Span
from ..task.search_task import SearchTask
from ..target import device_kind
from .builder import DEFAULT_BUILD_TIMEOUT, BuildJob, RayBuilder
from .host_lock import HostLock, host_lock_path
from .ray_session import RaySession
from .runner import RunConfig, RunReply, doubtful
from .runner_pool import MAX_CRASHES, Bar, RunJob, RunnerPool
from .shipping import TaskHandle, ship, task_key

logger = logging.getLogger("ansor")

DEFAULT_RUN_TIMEOUT = 10.0
#: The reference is the unscheduled program (naive loops, in parallel on CPUs): often 10-100x slower than a candidate.
DEFAULT_REFERENCE_TIMEOUT = 60.0
#: Runs of a task's reference before its candidates are measured unchecked.
REFERENCE_ATTEMPTS = 2
_DEFAULT_LOCK = "default"

Done = Callable[[RunJob, RunReply], None]


class ProgramBuilder(Protocol):
    """Compiles candidates (and, with ``state`` None, a task's unscheduled program) into loadable libraries."""

    def build(self, jobs: Sequence[BuildJob], on_done: Callable[[int, BuildResult], None],
              handles: dict[str, TaskHandle]) -> list[BuildResult]:
        """Every job's result, in job order; ``on_done(index, result)`` as each finishes."""


class ProgramRunner(Protocol):
    """Checks and times built candidates on the devices of the cluster."""

    def prepare(self, specs: Iterable[tuple[str, int]]) -> None:
        """Get ready for jobs of these (device, threads) kinds, without waiting (it overlaps the builds)."""

    def devices(self) -> set[str]:
        """Device kinds ("cpu", "gpu") it can run on."""

    def reserve(self) -> ContextManager[None]:
        """Keep builds off the CPUs that time candidates while the block runs."""

    def run(self, jobs: Iterable[RunJob], on_done: Done, bar: Bar) -> None:
        """Check and time every job (see :meth:`RunnerPool.run`); ``on_done`` once per job."""

    def run_references(self, jobs: Iterable[RunJob], on_done: Done, fresh: bool = False) -> None:
        """Run each job's program once for its outputs; ``on_done`` once per job."""

    def close(self) -> None:
        """Release what it holds."""


@dataclass
class MeasureTotals:
    """Where a measurer's time went, over every batch so far (wall seconds in this process; CPU seconds summed
    over the build workers): what bounds a run's trials a minute on a given machine."""

    build_s: float = 0.0  # the build phases, first submission to last result
    build_cpu_s: float = 0.0  # the builds themselves, as their workers timed them
    builds: int = 0  # candidates and reference programs built
    run_s: float = 0.0  # the run phases: CPU leases, reference runs, candidates' checks and timing


class ProgramMeasurer:
    """Builds and times candidates on Ray; use as a context manager (or call :meth:`close`).

    Parameters
    ----------
    ray_address
        Cluster to join; default ``$RAY_ADDRESS``, else an embedded local Ray (stopped on close). A process
        already connected to Ray keeps its connection and closing leaves it alone.
    build_timeout, run_timeout
        Seconds per build and per run (check + timing) before the worker is killed.
    number, repeat, min_repeat_ms, enable_cpu_cache_flush, slow_factor
        Timing parameters, defaults and meaning in :class:`~ansor.measure.runner.RunConfig` (``slow_factor``:
        a candidate this many times slower than its task's best so far is timed by one run only; ``inf``
        times all fully).
    check_correctness
        Compare each candidate's outputs with those of the task's unscheduled program (``WRONG_ANSWER``,
        tolerances in :mod:`ansor.measure.check`).
    reference_timeout
        Seconds for the one run of the unscheduled program per task; if it fails twice, the task is
        measured unchecked (with a warning, and ``checked=False`` on its results).
    build_memory_gib
        Memory cap of each build in GiB (default: 3/4 of a node's memory over its CPUs, at least 2 GiB).
    host_lock
        Lock file shared by the tuners of this machine (default ``$ANSOR_HOST_LOCK`` or
        ``/tmp/ansor-measure.lock``); ``None`` turns the coordination off. Used with an embedded Ray only:
        a joined cluster's nodes are other machines.
    callbacks
        Called with ``([input], [result])`` for every candidate as it finishes.
    builder, runner
        Replace the Ray builder (``build_timeout``, ``build_memory_gib``) or the runner pool (the timing
        parameters) by others; the measurer closes the runner.
    """

    def __init__(self, ray_address: Optional[str] = None, *, build_timeout: float = DEFAULT_BUILD_TIMEOUT,
                 run_timeout: float = DEFAULT_RUN_TIMEOUT, number: int = RunConfig.number,
                 repeat: int = RunConfig.repeat, min_repeat_ms: int = RunConfig.min_repeat_ms,
                 enable_cpu_cache_flush: bool = RunConfig.enable_cpu_cache_flush,
                 slow_factor: float = RunConfig.slow_factor, check_correctness: bool = True,
                 reference_timeout: float = DEFAULT_REFERENCE_TIMEOUT,
                 build_memory_gib: Optional[float] = None,
                 host_lock: Optional[str] = _DEFAULT_LOCK,
                 callbacks: Sequence[MeasureCallback] = (),
                 builder: Optional[ProgramBuilder] = None, runner: Optional[ProgramRunner] = None):
        self.run_timeout = run_timeout
        self.reference_timeout = reference_timeout
        self.check_correctness = check_correctness
        self.slow_factor = slow_factor
        self.callbacks = list(callbacks)
        #: Where and when each build and run of the last batch happened (worker clocks where known).
        self.spans: list[Span] = []
        self.totals = MeasureTotals()
        # Reference outputs by task key: (ObjectRef,) once computed, None if the reference failed twice.
        self._references: dict[str, Optional[tuple]] = {}
        #: Fastest cost timed so far by task key: what a candidate must come close to to be timed in full.
        self.best_costs: dict[str, float] = {}
        self._session = RaySession.open(ray_address)
        self._builder = builder or RayBuilder(build_timeout, build_memory_gib)
        self._run_config = RunConfig(number, repeat, min_repeat_ms, enable_cpu_cache_flush, slow_factor)
        self._pool = runner or RunnerPool(self._run_config)
        if host_lock is _DEFAULT_LOCK:
            host_lock = host_lock_path()
        self._lock = HostLock(host_lock) if host_lock and self._session.owns_cluster else None

    def measure(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        """Build and time ``inputs``; one result per input, in input order (failures cost ``MAX_COST``).

        Raises
        ------
        AnsorError
            If no node of the cluster has the device a candidate's target needs (e.g. no GPU for CUDA).
        """
        batch = _Batch(list(inputs), self.callbacks)
        self.spans = batch.spans
        if not batch.inputs:
            return []
        self._session.check_alive()
        tasks = [inp.task for inp in batch.inputs]
        references = self._missing_references(tasks)  # task key -> task whose unscheduled program is the reference
        self._pool.prepare({_runner_spec(t) for t in tasks + list(references.values())})
        for device in {_runner_spec(t)[0] for t in tasks} - self._pool.devices():
            raise AnsorError(f"the Ray cluster has no {device.upper()} to time {device} candidates on "
                             f"(resources: {ray.cluster_resources()})")
        handles = ship(tasks + list(references.values()))

        # Build phase: the candidates and the missing references, all at once.
        n = len(tasks)
        t0 = time.perf_counter()
        with self._lock.shared() if self._lock else nullcontext():
            builds = self._builder.build([(inp.task, inp.state) for inp in batch.inputs]
                                         + [(t, None) for t in references.values()],
                                         lambda i, res: batch.built(i, res) if i < n else None, handles)
        t1 = time.perf_counter()

        # Run phase, on reserved CPUs: the references first, then every built candidate.
        needs_cpu = bool(references) or any(_runner_spec(t)[0] == "cpu" for t in tasks)
        with self._lock.exclusive() if self._lock else nullcontext(), \
                self._pool.reserve() if needs_cpu else nullcontext():
            built_keys = {task_key(t) for t, b in zip(tasks, builds) if b.lib is not None}
            self._compute_references({key: (task, build) for (key, task), build in zip(references.items(), builds[n:])
                                      if key in built_keys}, handles, batch)  # nothing built: none needed yet
            batch.checked = {key for key, ref in self._references.items() if ref is not None}
            jobs = []
            for i, (task, build) in enumerate(zip(tasks, builds)):
                if build.lib is not None:
                    device, threads = _runner_spec(task)
                    reference = self._references.get(task_key(task)) if self.check_correctness else None
                    jobs.append(RunJob(i, handles[task_key(task)], build.lib, device, threads, self.run_timeout,
                                       reference, packed=build.packed))

            def done(job: RunJob, reply: RunReply) -> None:
                self._note_best(job, reply)
                batch.ran(job.index, builds[job.index], reply)

            self._pool.run(self._probe_first_batch(jobs, done), done, self._bar)
        totals = self.totals
        totals.build_s += t1 - t0
        totals.build_cpu_s += sum(b.time_cost for b in builds)
        totals.builds += len(builds)
        totals.run_s += time.perf_counter() - t1
        return batch.results  # type: ignore[return-value]

    def _bar(self, job: RunJob) -> float:
        return self.best_costs.get(job.handle.key, math.inf)

    def _note_best(self, job: RunJob, reply: RunReply) -> None:
        if reply.error_no == ErrorNo.NO_ERROR and reply.costs:
            key = job.handle.key
            self.best_costs[key] = min(self.best_costs.get(key, math.inf), min(reply.costs))

    def _probe_first_batch(self, jobs: list[RunJob], done: Callable[[RunJob, RunReply], None]) -> list[RunJob]:
        """Run once (and check) every candidate of a task not timed yet; returns what still needs timing.

        ``slow_factor`` spares a slow candidate its full timing only once the task has a best time, so in a
        task's first batch every slow random program timed before the first fast one cost ~5 runs (up to
        1-2 s each). Probing them all first gives the batch its best before anything is timed in full; a
        candidate within ``slow_factor`` of it is then timed (unchecked: the probe checked it), the rest
        keep their probe.
        """
        fresh = [j for j in jobs if j.handle.key not in self.best_costs]
        if len(fresh) < 2 or not math.isfinite(self.slow_factor):
            return jobs
        probes: dict[int, RunReply] = {}

        def probed(job: RunJob, reply: RunReply) -> None:
            self._note_best(job, reply)
            probes[job.index] = reply

        self._pool.run([replace(j) for j in fresh], probed, bar=lambda job: 0.0)  # copies: own crash counts
        # A probe far slower than the batch's best may have met a stall: run it once more, unchecked.
        again = [replace(j, reference=None) for j in fresh if probes[j.index].error_no == ErrorNo.NO_ERROR
                 and doubtful(probes[j.index].costs[0], self.best_costs.get(j.handle.key, math.inf), self._run_config)]
        if again:
            def reprobed(job: RunJob, reply: RunReply) -> None:
                if reply.error_no == ErrorNo.NO_ERROR and reply.costs[0] < probes[job.index].costs[0]:
                    self._note_best(job, reply)
                    probes[job.index] = replace(probes[job.index], costs=reply.costs)

            self._pool.run(again, reprobed, bar=lambda job: 0.0)
        fresh_ids = {id(j) for j in fresh}
        todo = [j for j in jobs if id(j) not in fresh_ids]
        close = []
        for job in fresh:
            reply, best = probes[job.index], self.best_costs.get(job.handle.key)
            if reply.error_no == ErrorNo.NO_ERROR and best is not None \
                    and reply.costs[0] <= self.slow_factor * best:
                close.append((reply.costs[0], replace(job, reference=None)))
            else:
                done(job, reply)
        # Fastest first: once the fast one is timed in full, the bar asked as a slower one starts can spare it
        # (a probe can still be a few times slow, letting a 20x slower candidate through the first bar).
        return todo + [job for _, job in sorted(close, key=lambda c: c[0])]

    def _missing_references(self, tasks: list[SearchTask]) -> dict[str, SearchTask]:
        missing: dict[str, SearchTask] = {}
        if self.check_correctness:
            for task in tasks:
                key = task_key(task)
                if key not in self._references and key not in missing:
                    missing[key] = _reference_task(task)
        return missing

    def _compute_references(self, needed: dict[str, tuple[SearchTask, BuildResult]],
                            handles: dict[str, TaskHandle], batch: "_Batch") -> None:
        """Run each task's unscheduled program; keep its outputs in the object store for the checks.

        A failed run is tried once more on a fresh runner (one the pool did not already retry after a
        crash). A reference lost to the infrastructure is left missing, to be tried again next batch.
        """
        keys = list(needed)
        retry: list[RunJob] = []

        def done(job: RunJob, reply: RunReply, fresh: bool) -> None:
            batch.spans.append(Span("reference", -1, reply.node, reply.start, reply.end))
            key = keys[job.index]
            if reply.outputs is not None:
                self._references[key] = (ray.put(reply.outputs),)
            elif reply.error_no == ErrorNo.INFRA_ERROR:
                logger.warning("reference run of %s lost to the infrastructure (%s); this batch is unchecked",
                               key.split("|")[0], short_message(reply.error_msg, 200))
            elif not fresh and job.crashes < MAX_CRASHES:
                logger.info("reference run of %s failed (%s); trying once more on a fresh runner",
                            key.split("|")[0], short_message(reply.error_msg, 200))
                retry.append(replace(job, node_losses=0, crashes=0))
            else:
                self._disable_check(key, reply.error_msg)

        jobs = []
        for j, (key, (task, build)) in enumerate(needed.items()):
            if build.lib is None and build.error_no == ErrorNo.INFRA_ERROR:
                continue  # no fault of the program: built again next batch
            if build.lib is None:
                self._disable_check(key, f"the unscheduled program did not build: {build.error_msg}")
            else:
                jobs.append(RunJob(j, handles[task_key(task)], build.lib, "cpu", _runner_spec(task)[1],
                                   self.reference_timeout))
        self._pool.run_references(jobs, lambda job, reply: done(job, reply, False))
        if retry:
            self._pool.run_references(retry, lambda job, reply: done(job, reply, True), fresh=True)

    def _disable_check(self, key: str, why: str) -> None:
        self._references[key] = None
        logger.warning("no correctness check for %s (its results are marked unchecked): %s", key.split("|")[0],
                       short_message(why) if why.strip() else "no reason given")

    def close(self) -> None:
        """Stop the runners, close the callbacks, and leave (or stop) Ray."""
        try:
            if self._lock is not None:
                self._lock.close()
            if ray.is_initialized():
                self._pool.close()
        finally:
            try:
                for callback in self.callbacks:
                    close = getattr(callback, "close", None)
                    if close is not None:
                        close()
            finally:
                self._session.close()

    def __enter__(self) -> "ProgramMeasurer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Batch:
    """One ``measure`` call: its results in input order, its timeline, and the callbacks to feed."""

    def __init__(self, inputs: list[MeasureInput], callbacks: list[MeasureCallback]):
        self.inputs = inputs
        self.callbacks = callbacks
        self.results: list[Optional[MeasureResult]] = [None] * len(inputs)
        self.spans: list[Span] = []
        self.checked: set[str] = set()  # keys of the tasks whose outputs are compared with a reference

    def built(self, i: int, build: BuildResult) -> None:
        self.spans.append(Span("build", i, build.node, build.start, build.start + build.time_cost))
        if build.lib is None:
            self._finish(i, MeasureResult((MAX_COST,), build.error_no, build.error_msg, build.time_cost,
                                          node=build.node))

    def ran(self, i: int, build: BuildResult, reply: RunReply) -> None:
        self.spans.append(Span("run", i, reply.node, reply.start, reply.end))
        self._finish(i, MeasureResult(reply.costs, reply.error_no, reply.error_msg,
                                      build.time_cost + reply.end - reply.start, node=reply.node,
                                      checked=task_key(self.inputs[i].task) in self.checked))

    def _finish(self, i: int, result: MeasureResult) -> None:
        self.results[i] = result
        for callback in self.callbacks:
            callback([self.inputs[i]], [result])


def _runner_spec(task: SearchTask) -> tuple[str, int]:
    """(device, TVM_NUM_THREADS) of the runner for ``task``: as many threads as the target has cores."""
    kind = device_kind(task.target)
    return kind.ray_resource, (task.hardware_params.num_cores if kind.thread_pool else 0)


def _reference_task(task: SearchTask) -> SearchTask:
    """The task whose unscheduled program gives the reference.

    A GPU task's reference is computed on the host CPU: every node has one, and the reference then does not
    depend on the GPU code generator whose output it is meant to check.
    """
    if not device_kind(task.target).host_reference:
        return task
    return SearchTask(task.func, None, workload_key=task.workload_key, desc=task.desc)
