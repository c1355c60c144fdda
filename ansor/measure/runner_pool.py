"""Runner actors on every device of the cluster: placement, CPU reservation, timeouts, crashes, node loss.

One *lane* per device: the CPUs of a node form one lane, each GPU another. A lane times one candidate at a
time through its :class:`~ansor.measure.runner.Runner` actor, pinned to the lane's node, and pulls the next
job from a shared queue when done, so a fast node takes more work and a lost node's work moves elsewhere.

Why the CPU reservation is a lease and not the actor's own ``num_cpus``: Ray holds an actor's resources for
its whole life, so an actor owning all CPUs of a node would starve the builds of the next batch forever
(on a one-node cluster, every build). Instead the actors take no CPU and live across batches (TVM
imported, inputs and references cached), and for the run phase :meth:`RunnerPool.reserve` starts on each
node a tiny task holding ``num_cpus`` = all of that node's CPUs until cancelled. While it runs Ray places
no build, ours or anyone's, on that node; builds and runs alternate per batch.

A run that outlives its timeout gets its actor killed (the hung kernel dies with the process) and
``RUN_TIMEOUT``. An actor that dies mid-run (segfault, ``abort``, or killed for memory) is replaced and the
candidate runs once more on the fresh actor: dying twice costs it ``RUNTIME_DEVICE``, with the cause the dead
worker's log gives when it is on this machine (``SIGSEGV``, ``SIGABRT``: :func:`ray_session.death_cause`;
Ray's own message only lists possible causes). When the node itself
is gone, or its runner does not start, the job is queued again for another lane (at most
:data:`MAX_NODE_LOSSES` times), never dropped; a job that keeps losing its lanes, and one left with no
live lane, fails with ``INFRA_ERROR``, which says nothing about the candidate. So does a candidate whose
runner Ray killed twice because the node ran low on memory.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..state.layout_rewrite import PackedLayout
from ..log.measurement import ErrorNo, MAX_COST, error_text
from .ray_session import alive_nodes, current_node, death_cause, node_alive
from .runner import RunConfig, Runner, RunReply
from .shipping import TaskHandle

logger = logging.getLogger("ansor")

#: Seconds a new runner may take to start (a fresh worker process importing TVM: ~2 s when idle).
ACTOR_START_TIMEOUT = 120.0
#: Seconds to wait for a node's CPUs to become free for the run phase (someone else's builds may hold them).
LEASE_TIMEOUT = 120.0
#: Seconds a cancelled CPU reservation may take to end before its worker is killed.
RELEASE_TIMEOUT = 2.0
#: How many times a job may lose its node before it is recorded as an error.
MAX_NODE_LOSSES = 2
#: Runs of one candidate that may kill their runner (the last one decides).
MAX_CRASHES = 2

_RunnerActor = ray.remote(Runner)


def _release(leases: list[ray.ObjectRefGenerator]) -> None:
    """End the CPU reservations and wait until they are gone, so the next batch's builds can start.

    A cancel normally ends a hold within milliseconds, but one that reaches the task while Ray is still
    handing over its first item can be lost; the hold would then keep the node's CPUs, and every later
    build would wait for a worker until it timed out. A hold that outlives the polite cancel is killed.
    """
    for gen in leases:
        ray.cancel(gen)
    ends = {gen.completed(): gen for gen in leases}
    _, stuck = ray.wait(list(ends), num_returns=len(ends), timeout=RELEASE_TIMEOUT)
    for ref in stuck:
        logger.debug("a CPU reservation ignored its cancel; killing it")
        ray.cancel(ends[ref], force=True)


@ray.remote(num_returns="streaming", max_retries=0)
def _hold_cpus():
    """Hold the CPUs this task was given until cancelled; the first item says the lease is granted."""
    _interruptible()
    yield current_node()
    while True:  # a cancel arrives as KeyboardInterrupt between bytecodes: sleep in short steps
        time.sleep(0.1)


def _interruptible() -> None:
    """Let Ray's cancel reach this worker. It raises KeyboardInterrupt as a SIGINT would, which does nothing
    where SIGINT is ignored, and a tuner started so (under ``nohup``, or with ``&`` in a script) passes that
    on to Ray's workers: every hold then ran out :data:`RELEASE_TIMEOUT`, was killed, and the next batch
    waited for a new worker to start, 4.2 s a batch against 0.3 (a 10-minute Swin-T run measured 943
    trials instead of about 3000)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        except ValueError:  # not the worker's main thread: the cancel ends in the kill, as before
            logger.debug("SIGINT is ignored in this worker: a cancelled CPU hold will be killed")


@dataclass
class RunJob:
    """One call to a runner: time (or, for a reference, just run) one built program."""

    index: int  # the caller's id for this job
    handle: TaskHandle
    lib: bytes
    device: str  # "cpu" or "gpu": which lanes may take it
    threads: int  # TVM_NUM_THREADS of the runner; 0 leaves TVM's default
    timeout: float
    reference: Optional[tuple] = None  # (ObjectRef of the reference outputs,): check against them
    packed: tuple[PackedLayout, ...] = ()  # arguments the library takes pre-packed
    node_losses: int = 0
    crashes: int = 0  # runs that killed their runner


#: The time a candidate must beat to be timed in full (``RunConfig.slow_factor``): the task's best so far.
Bar = Callable[[RunJob], float]


@dataclass(frozen=True)
class _Call:
    """What one :meth:`RunnerPool.run` asks of its runners."""

    what: str  # "run" or "reference run", for messages
    start: Callable[[ray.actor.ActorHandle, RunJob], ray.ObjectRef]
    fresh: bool = False  # replace the lane's runner before each job (a retried reference)


@dataclass
class _Actor:
    handle: ray.actor.ActorHandle
    threads: int
    ready: Optional[ray.ObjectRef]  # pending until the actor is up, then None


@dataclass
class _Lane:
    node: str
    device: str
    actors: dict[int, _Actor] = field(default_factory=dict)  # by TVM_NUM_THREADS
    job: Optional[RunJob] = None
    actor: Optional[_Actor] = None  # the one running ``job``
    call: Optional[ray.ObjectRef] = None
    deadline: float = 0.0  # time.monotonic() by which the actor must be up, then the call done
    started: float = 0.0  # wall clock at the start of the call
    dead: bool = False  # unusable until the next batch (node gone, runner would not start)


Done = Callable[[RunJob, RunReply], None]


class RunnerPool:
    """Runner actors for every device of the cluster, reused across batches.

    Parameters
    ----------
    config
        How candidates are timed.
    """

    def __init__(self, config: RunConfig):
        self.config = config
        self._lanes: dict[tuple[str, str, int], _Lane] = {}

    def prepare(self, specs: Iterable[tuple[str, int]]) -> None:
        """Start the runners a batch will need ((device, threads) pairs) without waiting for them.

        Called before the builds, so the ~2 s start of a fresh actor overlaps compilation.
        """
        self._refresh_lanes()
        specs = set(specs)
        for lane in self._lanes.values():
            for device, threads in specs:
                if lane.device == device and threads not in lane.actors:
                    lane.actors[threads] = self._spawn(lane, threads)

    def devices(self) -> set[str]:
        """Device kinds ("cpu", "gpu") some live node offers."""
        return {lane.device for lane in self._lanes.values()}

    @contextmanager
    def reserve(self) -> Iterator[None]:
        """Hold every CPU of every node with a CPU lane for the duration of the block."""
        self._refresh_lanes()
        cpus = {n.node_id: n.cpus for n in alive_nodes()}
        leases = {}
        for lane in self._lanes.values():
            if lane.device == "cpu" and cpus.get(lane.node):
                strategy = NodeAffinitySchedulingStrategy(lane.node, soft=False)
                leases[_hold_cpus.options(num_cpus=cpus[lane.node], scheduling_strategy=strategy).remote()] = lane
        try:
            if leases:
                _, late = ray.wait(list(leases), num_returns=len(leases), timeout=LEASE_TIMEOUT)
                for gen in late:
                    logger.warning("node %s: its CPUs stayed busy for %g s; not timing on it this batch",
                                   leases[gen].node, LEASE_TIMEOUT)
                    leases[gen].dead = True
            yield
        finally:
            _release(list(leases))

    def run(self, jobs: Iterable[RunJob], on_done: Done, bar: Bar) -> None:
        """Time every job; ``on_done(job, reply)`` is called exactly once per job, as it finishes.

        ``bar(job)``, asked as the job starts: a candidate more than ``slow_factor`` times slower than it is
        timed by one run only (``inf``: time it in full; ``0``: run it once, checked).
        """
        config = self.config
        self._run(jobs, on_done, _Call("run", lambda actor, job: actor.run.remote(
            job.handle, job.lib, job.reference, config, bar(job), job.packed)))

    def run_references(self, jobs: Iterable[RunJob], on_done: Done, fresh: bool = False) -> None:
        """Run each job's program once and keep its outputs (the reference of its task's checks).

        ``fresh``: on a new runner each (a reference that failed is tried once more on a fresh runner).
        """
        self._run(jobs, on_done, _Call("reference run", lambda actor, job: actor.reference.remote(job.handle, job.lib),
                                       fresh))

    def _run(self, jobs: Iterable[RunJob], on_done: Done, call: _Call) -> None:
        queues: dict[str, deque[RunJob]] = {"cpu": deque(), "gpu": deque()}
        for job in sorted(jobs, key=lambda j: j.threads):  # fewer runner switches per lane
            queues[job.device].append(job)
        lanes = list(self._lanes.values())
        try:
            while True:
                for lane in lanes:
                    if lane.job is None and not lane.dead and queues[lane.device]:
                        self._start(lane, queues[lane.device].popleft(), call)
                for device, queue in queues.items():
                    if queue and not any(lane.device == device and not lane.dead for lane in lanes):
                        while queue:
                            job = queue.popleft()
                            on_done(job, _failure(ErrorNo.INFRA_ERROR, "", time.time(),
                                                  f"no live {device.upper()} runner in the Ray cluster"))
                busy = [lane for lane in lanes if lane.job is not None]
                if not busy:
                    return
                self._step(busy, queues, on_done, call)
        finally:  # Ctrl-C or a failing callback: stop what is still running
            for lane in lanes:
                if lane.job is not None:
                    self._end_call(lane, kill=True)

    def close(self) -> None:
        """Kill every runner actor."""
        for lane in self._lanes.values():
            for actor in list(lane.actors.values()):
                self._kill(lane, actor)
        self._lanes.clear()

    # ------------------------------------------------------------------ lanes and actors
    def _refresh_lanes(self) -> None:
        wanted = set()
        for node in alive_nodes():
            if node.cpus:
                wanted.add((node.node_id, "cpu", 0))
            wanted.update((node.node_id, "gpu", g) for g in range(node.gpus))
        for key in [k for k in self._lanes if k not in wanted]:
            lane = self._lanes.pop(key)
            for actor in list(lane.actors.values()):
                self._kill(lane, actor)
        for key in wanted:
            lane = self._lanes.setdefault(key, _Lane(node=key[0], device=key[1]))
            lane.dead = False

    def _spawn(self, lane: _Lane, threads: int) -> _Actor:
        options: dict = {"num_cpus": 0, "num_gpus": 1 if lane.device == "gpu" else 0, "max_restarts": 0,
                         "scheduling_strategy": NodeAffinitySchedulingStrategy(lane.node, soft=False)}
        if threads:  # TVM reads it when its thread pool starts: it must be in the process environment
            options["runtime_env"] = {"env_vars": {"TVM_NUM_THREADS": str(threads)}}
        handle = _RunnerActor.options(**options).remote("cuda" if lane.device == "gpu" else "cpu")
        return _Actor(handle, threads, handle.ready.remote())

    def _end_call(self, lane: _Lane, kill: bool) -> None:
        """Free the lane for its next job; ``kill``: the runner too (hung, crashed, or its node gone)."""
        if kill:
            self._kill(lane, lane.actor)
        lane.job = lane.actor = lane.call = None

    @staticmethod
    def _kill(lane: _Lane, actor: Optional[_Actor]) -> None:
        if actor is None:
            return
        if lane.actors.get(actor.threads) is actor:
            del lane.actors[actor.threads]
        ray.kill(actor.handle, no_restart=True)

    # ------------------------------------------------------------------ the event loop
    def _start(self, lane: _Lane, job: RunJob, call: _Call) -> None:
        actor = lane.actors.get(job.threads)
        if actor is not None and call.fresh:
            self._kill(lane, actor)
            actor = None
        if actor is None:
            actor = lane.actors[job.threads] = self._spawn(lane, job.threads)
        lane.call = call.start(actor.handle, job)
        lane.job, lane.actor, lane.started = job, actor, time.time()
        lane.deadline = time.monotonic() + (ACTOR_START_TIMEOUT if actor.ready is not None else job.timeout)

    def _step(self, busy: list[_Lane], queues: dict[str, deque[RunJob]], on_done: Done, call: _Call) -> None:
        """Wait for the first event among the busy lanes (an actor up, a reply, a deadline) and handle it."""
        waiting = {}  # ref -> (lane, whether it is the actor's start rather than the call)
        for lane in busy:
            starting = lane.actor.ready is not None
            waiting[lane.actor.ready if starting else lane.call] = (lane, starting)
        timeout = max(0.0, min(lane.deadline for lane in busy) - time.monotonic())
        ready, _ = ray.wait(list(waiting), num_returns=1, timeout=timeout)
        for ref in ready:
            lane, starting = waiting[ref]
            if starting:
                self._on_actor_ready(lane, queues, on_done)
            else:
                self._on_reply(lane, queues, on_done)
        now = time.monotonic()
        for lane in busy:
            if lane.job is not None and lane.deadline <= now:
                self._on_deadline(lane, queues, on_done, call)

    def _on_actor_ready(self, lane: _Lane, queues: dict[str, deque[RunJob]], on_done: Done) -> None:
        actor = lane.actor
        try:
            threads = ray.get(actor.ready)
        except ray.exceptions.RayError as err:
            self._lose_lane(lane, f"its runner did not start ({error_text(err)})", queues, on_done)
            return
        if actor.threads and threads != actor.threads:
            logger.warning("runner on node %s uses %d threads, not TVM_NUM_THREADS=%d", lane.node, threads,
                           actor.threads)
        actor.ready = None
        lane.deadline, lane.started = time.monotonic() + lane.job.timeout, time.time()

    def _on_reply(self, lane: _Lane, queues: dict[str, deque[RunJob]], on_done: Done) -> None:
        job, call = lane.job, lane.call
        try:
            reply = ray.get(call)
        except ray.exceptions.RayActorError as err:
            if not node_alive(lane.node):
                self._lose_lane(lane, "the node left the cluster", queues, on_done)
                return
            self._end_call(lane, kill=True)
            job.crashes += 1
            killed_for_memory = _killed_for_memory(err)
            cause = "killed for the node's memory" if killed_for_memory else death_cause(err) or "crash"
            if job.crashes < MAX_CRASHES:
                logger.info("a runner on node %s died (%s); running its candidate again on a fresh one",
                            lane.node, cause)
                queues[job.device].appendleft(job)
                return
            code = ErrorNo.INFRA_ERROR if killed_for_memory else ErrorNo.RUNTIME_DEVICE
            reply = _failure(code, lane.node, lane.started, f"the runner process died running this candidate "
                             f"{job.crashes} times ({cause}): {error_text(err)}")
        except ray.exceptions.RayError as err:  # an exception inside the runner: a bug, not the candidate
            reply = _failure(ErrorNo.UNKNOWN_ERROR, lane.node, lane.started, error_text(err))
        self._end_call(lane, kill=False)
        on_done(job, reply)

    def _on_deadline(self, lane: _Lane, queues: dict[str, deque[RunJob]], on_done: Done, call: _Call) -> None:
        job = lane.job
        if lane.actor.ready is not None:
            self._lose_lane(lane, f"its runner did not start within {ACTOR_START_TIMEOUT:g} s", queues, on_done)
            return
        self._end_call(lane, kill=True)
        on_done(job, _failure(ErrorNo.RUN_TIMEOUT, lane.node, lane.started,
                              f"{call.what} did not finish within {job.timeout:g} s; the runner was killed"))

    def _lose_lane(self, lane: _Lane, why: str, queues: dict[str, deque[RunJob]], on_done: Done) -> None:
        """Take the lane out of this batch and give its job to another lane (or record the loss)."""
        job = lane.job
        self._end_call(lane, kill=True)
        lane.dead = True
        job.node_losses += 1
        if job.node_losses > MAX_NODE_LOSSES:
            on_done(job, _failure(ErrorNo.INFRA_ERROR, lane.node, lane.started,
                                  f"gave up after losing {job.node_losses} runner nodes; last: {why}"))
        else:
            logger.warning("node %s: %s; its candidates move to other nodes", lane.node, why)
            queues[job.device].appendleft(job)


def _killed_for_memory(err: BaseException) -> bool:
    """Ray's memory monitor killed the actor because its node ran low on memory (not the kernel's OOM killer,
    which Ray cannot tell from a crash: its generic "worker died" text only lists that as a possible cause)."""
    text = str(err).lower()
    return isinstance(err, ray.exceptions.OutOfMemoryError) or "low on memory" in text \
        or "memory pressure" in text


def _failure(code: ErrorNo, node: str, start: float, msg: str) -> RunReply:
    return RunReply((MAX_COST,), int(code), msg, start, time.time(), node)
