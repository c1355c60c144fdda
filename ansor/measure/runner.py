"""The runner actor: loads a built candidate and times it on the device it owns, one candidate at a time.

This is the code that runs inside the actor process; :mod:`ansor.measure.runner_pool` places the actors
(one per device), reserves the node's CPUs while they time, enforces timeouts and replaces an actor that
crashed or hung. Keeping the timing in a separate process is what lets a segfaulting or endless kernel
cost one candidate instead of the tuning run.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import ray
import tvm

from ..host_cpu import allow_amx_or_warn
from ..task import program
from ..task.timing import CANDIDATE
from ..state.layout_rewrite import PackedLayout, pack_arguments
from ..log.measurement import ErrorNo, MAX_COST, error_text
from .check import output_mismatch
from .ray_session import current_node
from .shipping import TaskHandle


@dataclass(frozen=True)
class RunConfig:
    """How a candidate is timed: the one definition of the timing defaults (``ProgramMeasurer``'s and
    ``ansor.RunnerOptions``' defaults are these fields).

    The defaults time each candidate over ``repeat`` = 3 repeats of about ``min_repeat_ms`` = 15 ms of wall
    time each, the flushes below included: enough to rank candidates on a noisy machine while keeping a short
    run short (cv ~3 % on the best matmul-512 candidates, 48 ms per candidate instead of ~210 ms with 3 x 40 ms
    and TVM's own loop; see docs/design.md). Final numbers are re-timed for longer by the scripts. A first
    single run (the probe), timed with its flush, gives the count of runs per repeat, so a 10 µs kernel runs
    1,500 times per repeat while a 50 ms one runs once, and a kernel whose operands take longer to flush than
    to run runs fewer times (on a 2-core Xeon a flush of 8 MB took 5.4 ms: counting the kernel's time alone,
    ResNet-50's candidates took 0.36 s each to time, two thirds of a tuning run); ``number`` is the least
    count. With ``enable_cpu_cache_flush`` the CPU caches are flushed of every argument but the first before
    *each run* (so each repeat is the mean of that many single runs, at most ``program.MAX_COLD_RUNS``): in a
    network the input was just written by the previous call while the weights and other operands come cold
    from memory. Ansor flushed once per repeat of ``number`` runs, which times all but the first run with hot
    weights: BERT-base's dense layers ran 10 % slower in the network than their logged times, while flushed
    single runs were within 1-5 % of their in-network times (docs/design.md). Reported costs are the
    per-repeat means, in seconds.

    Most of a search's candidates are far from the best, and a slow one would take the longest to time.
    So each candidate is first run once; if that run is ``slow_factor`` times slower than the fastest
    candidate of its task timed so far, that single run is its cost. Such a cost only has to rank it below
    the good ones, and the batch's run phase no longer grows with its worst members. When the candidate is
    checked for correctness, the check run is that first run if it took at least ``min_repeat_ms`` (caches
    not flushed: a slightly pessimistic cost for a program that is slow anyway); a shorter one is confirmed
    by a probe run with flushed caches, as is every unchecked candidate. A program's first call is cold
    (its library's pages, the thread pool waking): on a busy machine a 50 µs matmul's first call took over
    1 ms, longer than a 20x slower one's, which then ran ahead of it and was timed in full.
    """

    number: int = 1
    repeat: int = CANDIDATE.repeat
    min_repeat_ms: int = CANDIDATE.min_repeat_ms
    enable_cpu_cache_flush: bool = True
    slow_factor: float = 5.0


def doubtful(probe_s: float, best_s: float, config: RunConfig) -> bool:
    """Whether a probe that judged its program far slower than the best (``slow_factor``) gets a second run, the
    faster of the two deciding: one stall of a shared machine read a 0.11 ms matmul's single run at 4-34 ms
    (2-core Zen 3), which would mark a fast program slow for good. A probe shorter than a full timing
    (``repeat`` x ``min_repeat_ms``) costs less than that timing again; a longer one is too slow for a stall
    to matter. No best yet (``inf``): nothing to be far slower than."""
    return probe_s > config.slow_factor * best_s and probe_s * 1e3 < config.repeat * config.min_repeat_ms


@dataclass
class RunReply:
    """What a runner call returns: timings or an error, plus when and where it ran."""

    costs: tuple[float, ...]
    error_no: int
    error_msg: str
    start: float
    end: float
    node: str
    outputs: Optional[list[np.ndarray]] = None  # every argument after one call (reference runs only)


class Runner:
    """Actor body: owns one device of one node; caches inputs and reference outputs per workload.

    Parameters
    ----------
    device
        TVM device type to run on (``"cpu"`` or ``"cuda"``); a GPU actor sees its one GPU as index 0.
    """

    def __init__(self, device: str):
        if device == "cpu":  # candidates built around AMX tiles run here; without the state they die of SIGILL
            allow_amx_or_warn("AMX candidates will fail in this runner")
        self._device = tvm.device(device, 0)
        self._flush = program.CACHE_FLUSH if device == "cpu" else ""
        self._node = current_node()
        self._inputs: dict[str, list[np.ndarray]] = {}
        self._references: dict[str, list[np.ndarray]] = {}

    def ready(self) -> int:
        """Returns once the actor is up; the number of threads TVM's runtime will use."""
        return tvm.runtime.num_threads()

    def reference(self, handle: TaskHandle, lib: bytes) -> RunReply:
        """Run the unscheduled program once on the task's inputs; the outputs are the reference."""
        start = time.time()
        try:
            module = load_library(lib)
            args = self._args(handle)
            module["main"](*args)
            self._device.sync()
            outputs = [a.numpy() for a in args]
        except Exception as err:
            return self._error(ErrorNo.RUNTIME_DEVICE, f"reference run failed: {error_text(err)}", start)
        self._references[handle.key] = outputs
        return RunReply((), int(ErrorNo.NO_ERROR), "", start, time.time(), self._node, outputs)

    def run(self, handle: TaskHandle, lib: bytes, reference: Optional[tuple], config: RunConfig,
            best_cost: float = float("inf"), packed: tuple[PackedLayout, ...] = ()) -> RunReply:
        """Check (if ``reference`` holds the reference outputs' ObjectRef) and time one candidate.

        ``best_cost``: seconds of the fastest candidate of this task timed so far (see ``slow_factor``);
        ``packed``: arguments the library takes pre-packed (constant weights in the schedule's layout).
        """
        start = time.time()
        try:
            module = load_library(lib)
        except Exception as err:
            return self._error(ErrorNo.RUNTIME_DEVICE, f"cannot load the library: {error_text(err)}", start)
        try:
            args = self._args(handle, packed)
            if reference is not None:
                t0 = time.perf_counter()
                module["main"](*args)
                self._device.sync()
                checked = time.perf_counter() - t0
                mismatch = output_mismatch([a.numpy() for a in args], self._reference(handle.key, reference),
                                           skip={layout.index for layout in packed})
                if mismatch:
                    return self._error(ErrorNo.WRONG_ANSWER, mismatch, start)
                if checked > config.slow_factor * best_cost and checked * 1e3 >= config.min_repeat_ms:
                    # Slow even counting a cold start, and a confirming run would cost more than a repeat.
                    return RunReply((checked,), int(ErrorNo.NO_ERROR), "", start, time.time(), self._node)
            flush = self._flush if config.enable_cpu_cache_flush else ""
            probe = module.time_evaluator("main", self._device, number=1, repeat=1, f_preproc=flush)
            t0 = time.perf_counter()
            costs = tuple(float(c) for c in probe(*args).results)
            per_run = time.perf_counter() - t0 if flush else costs[0]  # what each timed run costs, its flush too
            if best_cost > 0 and doubtful(costs[0], best_cost, config):  # 0: a first batch's probe, kept
                costs = (min(costs[0], float(probe(*args).results[0])),)
            if costs[0] <= config.slow_factor * best_cost:
                # The count comes from the probe: TVM's own min_repeat_ms loop would re-run a whole repeat
                # whenever it falls just short of the minimum, doubling the time spent on most candidates.
                number = program.runs_per_repeat(max(costs[0], per_run), config.min_repeat_ms, least=config.number)
                costs = program.time_runs(module, self._device, args, number, config.repeat, flush)
        except Exception as err:
            return self._error(ErrorNo.RUNTIME_DEVICE, error_text(err), start)
        return RunReply(costs, int(ErrorNo.NO_ERROR), "", start, time.time(), self._node)

    # ------------------------------------------------------------------ helpers
    def _args(self, handle: TaskHandle, packed: tuple[PackedLayout, ...] = ()) -> list[tvm.runtime.Tensor]:
        inputs = self._inputs.get(handle.key)
        if inputs is None:
            inputs = self._inputs[handle.key] = program.random_inputs(handle.get())
        return [tvm.runtime.tensor(a, self._device) for a in pack_arguments(packed, inputs)]

    def _reference(self, key: str, holder: tuple) -> list[np.ndarray]:
        outputs = self._references.get(key)
        if outputs is None:
            outputs = self._references[key] = ray.get(holder[0])
        return outputs

    def _error(self, code: ErrorNo, msg: str, start: float) -> RunReply:
        return RunReply((MAX_COST,), int(code), msg, start, time.time(), self._node)


def load_library(lib: bytes) -> tvm.runtime.Module:
    """Load an exported library from its bytes.

    ``dlopen`` needs a file. Each load gets a fresh name (``dlopen`` hands back the old handle for a path
    it already has open, and overwriting a mapped library crashes its users); the file is deleted as soon
    as it is mapped.
    """
    fd, path = tempfile.mkstemp(prefix="ansor-run-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(lib)
        return tvm.runtime.load_module(path)
    finally:
        os.unlink(path)
