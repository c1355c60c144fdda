"""TVM's per-store features of loop states: C++ ``PerStoreFeature`` on the replayed program, batched and cached.

The alternative to :mod:`.state_features` (the default), kept for comparison and for models saved with it
(``XGBModel(features="tvm")``, ``train_cost_model.py --features tvm``). It describes a program by one
feature vector per buffer store of the *real* (replayed) TensorIR program: loop structure around the
store, its arithmetic, vectorization/unroll/parallel context (the auto-unroll pragma included), buffer
access patterns, arithmetic intensity. TVM 0.27 computes these in C++ (164 values per store) from any
``s_tir.Schedule``; we only replay our steps and batch the call.

Two costs dominate (matmul-512, this 2-core machine): replaying a state onto ``s_tir.Schedule`` (Python,
~1.75 ms) and the C++ extraction (~1.6 ms per state per thread; it releases the GIL). A batch is therefore
cut into chunks and pipelined: while a helper thread extracts chunk *k*, the calling thread replays chunk
*k + 1*, so both cores work (see ``scripts/bench/bench_cost_model.py``). Every state's features are cached
by (workload, target, step list): evolution scores the same parents many times and ``update`` sees the
programs ``predict`` already scored.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Hashable, Optional, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm.s_tir.meta_schedule import TuneContext
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature
from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

from ..errors import StepError, short_message
from ..state.loop_state import State
from ..task.search_task import SearchTask
from ..target import physical_cores

logger = logging.getLogger("ansor")

#: Values per store row (TVM's PerStoreFeature with its default of 5 buffers per store, no workload part).
NUM_FEATURES = 164

#: States replayed per pipeline chunk: large enough to amortise a C++ call, small enough to overlap well.
CHUNK = 32


@dataclass
class ExtractStats:
    """Where extraction time went since the extractor was made (for benchmarks and search-overhead logs)."""

    states: int = 0
    cache_hits: int = 0
    replay_failures: int = 0
    replay_s: float = 0.0  # Python replay onto s_tir.Schedule
    extract_s: float = 0.0  # C++ extraction, in whichever thread ran it
    wall_s: float = 0.0  # wall-clock time of uncached batches (replay and extraction overlap)


@dataclass
class _TaskContext:
    """What TVM's extractor needs for one task, built once."""

    ctx: TuneContext
    args: list


def make_tune_context(mod: tvm.IRModule, target: tvm.target.Target, threads: int) -> TuneContext:
    """A TuneContext made by its registered constructor.

    ``TuneContext.__init__`` in Python first imports ``tvm.s_tir.tensor_intrin`` (20-40 s, for tensorize
    rules the feature extractor never uses); the C++ constructor it then calls needs none of it. The
    extractor reads only the target and the thread count from the context.
    """
    ctx = tvm_ffi.get_global_func("s_tir.meta_schedule.TuneContext")(mod, target, None, None, "main", threads,
                                                                       -1, None)
    tvm_ffi.get_global_func("s_tir.meta_schedule.TuneContextInitialize")(ctx)
    return ctx


class FeatureExtractor:
    """Per-store features of states, one ``(n_stores, NUM_FEATURES)`` float32 array per state.

    Parameters
    ----------
    cache_size
        Most states whose features are kept (least recently used are dropped first; ~1-2 kB each). The
        cost model keeps the features of measured states itself, so this only bounds the memory used by
        the search's scoring: 20,000 is about 20 rounds of a 256 x 4 evolution.
    pipeline
        Overlap replay (this thread) with C++ extraction (a helper thread). Off: one serial call per batch,
        with ``num_threads`` C++ threads.
    num_threads
        C++ threads for a non-pipelined batch (default: this machine's physical cores).
    """

    name = "tvm"
    num_features = NUM_FEATURES

    def __init__(self, cache_size: int = 20_000, pipeline: bool = True, num_threads: Optional[int] = None):
        self.cache_size = cache_size
        self.pipeline = pipeline
        self.num_threads = num_threads
        self.stats = ExtractStats()
        self._extractor = PerStoreFeature()
        self._contexts: dict[tuple[str, str, int], _TaskContext] = {}
        self._cache: OrderedDict[Hashable, Optional[np.ndarray]] = OrderedDict()
        self._pool: Optional[ThreadPoolExecutor] = None

    def extract(self, task: SearchTask, states: Sequence[State]) -> list[Optional[np.ndarray]]:
        """Features of each state, or ``None`` for a state TVM refuses to replay (it can never be built)."""
        out: list[Optional[np.ndarray]] = [None] * len(states)
        missing: dict[Hashable, list[int]] = {}
        task_key = (task.workload_key, task.target_str)
        for i, state in enumerate(states):
            key = (task_key, state.key())
            if key in self._cache:
                self._cache.move_to_end(key)
                out[i] = self._cache[key]
                self.stats.cache_hits += 1
            else:
                missing.setdefault(key, []).append(i)
        self.stats.states += len(states)
        if missing:
            keys = list(missing)
            feats = self._extract_uncached(task, [states[missing[k][0]] for k in keys])
            for key, feat in zip(keys, feats):
                self._remember(key, feat)
                for i in missing[key]:
                    out[i] = feat
        return out

    # ------------------------------------------------------------------ internals
    def _remember(self, key: Hashable, feat: Optional[np.ndarray]) -> None:
        self._cache[key] = feat
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _context(self, task: SearchTask, threads: int) -> _TaskContext:
        key = (task.workload_key, task.target_str, threads)
        ctx = self._contexts.get(key)
        if ctx is None:
            dag = task.compute_dag
            ctx = self._contexts[key] = _TaskContext(make_tune_context(dag.mod, task.target, threads),
                                                     ArgInfo.from_prim_func(dag.func))
        return ctx

    def _replay(self, task: SearchTask, states: Sequence[State]) -> list[Optional[tvm.s_tir.Schedule]]:
        t0 = time.perf_counter()
        schedules: list[Optional[tvm.s_tir.Schedule]] = []
        for state in states:
            try:
                schedules.append(task.compute_dag.replay(state))
            except StepError as err:
                logger.debug("features: %s cannot be replayed (%s); scored -inf", task.workload_key, err)
                self.stats.replay_failures += 1
                schedules.append(None)
        self.stats.replay_s += time.perf_counter() - t0
        return schedules

    def _extract_uncached(self, task: SearchTask, states: Sequence[State]) -> list[Optional[np.ndarray]]:
        t0 = time.perf_counter()
        try:
            return self._replay_and_extract(task, states)
        finally:
            self.stats.wall_s += time.perf_counter() - t0

    def _replay_and_extract(self, task: SearchTask, states: Sequence[State]) -> list[Optional[np.ndarray]]:
        cores = max(1, self.num_threads or physical_cores())  # extraction runs here, not on the target
        if not self.pipeline or len(states) <= CHUNK:
            return self._run_cpp(self._context(task, cores), self._replay(task, states))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ansor-features")
        # One C++ thread in the helper: the other core is busy replaying the next chunk in Python.
        ctx = self._context(task, 1)
        futures: list[Future] = []
        for start in range(0, len(states), CHUNK):
            schedules = self._replay(task, states[start:start + CHUNK])
            futures.append(self._pool.submit(self._run_cpp, ctx, schedules))
        return [feat for fut in futures for feat in fut.result()]

    def _run_cpp(self, ctx: _TaskContext, schedules: Sequence[Optional[tvm.s_tir.Schedule]]
                 ) -> list[Optional[np.ndarray]]:
        """One C++ call for the replayable schedules; if it fails, each alone, so one bad program costs one."""
        live = [k for k, s in enumerate(schedules) if s is not None]
        out: list[Optional[np.ndarray]] = [None] * len(schedules)
        if not live:
            return out
        cands = [MeasureCandidate(schedules[k], ctx.args) for k in live]
        t0 = time.perf_counter()
        try:
            arrays = self._extractor.extract_from(ctx.ctx, cands)
        except Exception:  # TVM raises its own error types; isolate the offender below
            arrays = []
            for cand in cands:
                try:
                    arrays.append(self._extractor.extract_from(ctx.ctx, [cand])[0])
                except Exception as err:
                    logger.debug("features: extraction failed (%s)", short_message(err, None))
                    arrays.append(None)
        self.stats.extract_s += time.perf_counter() - t0
        for k, arr in zip(live, arrays):
            out[k] = None if arr is None else arr.numpy().astype(np.float32)
        return out
