"""Network-level selection: each heavy task's few best measured states, re-timed inside the built network,
and the combination that runs fastest there written to the log.

Tuning ranks a task's candidates by their time alone. In the network a kernel's input was just written
by another kernel and its weights were evicted by the rest of the model, and the ranking can differ (see
docs/networks.md, "Alone and in the network"). Variant build ``i`` runs every heavy task's ``i``-th best
state; profiling the variants in turn gives each candidate's per-call time in place, and each task keeps
its fastest there. The combination is then timed end to end against the build of the fastest measured
states, in turn, and kept only if it wins: the selection never makes the network slower than the
measurements' choice. Its verdict goes to the log as one selection record per heavy task
(``"net": 1``, see docs/log_format.md), which :func:`~ansor.log.records.best_records` follows.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import tvm

from ..errors import AnsorError
from ..log.measurement import ErrorNo, MeasureResult
from ..log.records import Record, RecordWriter, distinct_records, load_records
from ..state.loop_state import State
from ..target import device_kind, parse_target
from ..task.timing import SELECTION
from .evaluate import CallProfiler, build, time_network
from .extract import Extraction, NetworkTask
from .schedules import apply_schedules, replayed_state

logger = logging.getLogger("ansor")

#: Tasks re-timed: the heaviest by weight x best measured time, until they cover this share of the
#: estimated latency (on ResNet-50 90 % is 14 of 23 tasks; the rest cannot move the total by much).
HEAVY_SHARE = 0.9

#: Each profile of a variant runs the network for about this long: a ResNet-50 inference on 2 cores
#: (17 ms) is profiled 6 times, a tiny network often enough that the probe's clock reads average out.
PROFILE_MS = 100.0


@dataclass(frozen=True)
class Selection:
    """What :func:`select_in_network` did.

    ``best_ms`` is the end-to-end latency with every task's fastest measured state, ``selected_ms`` with the
    selection (both medians of the same in-turn timings; equal when no task changed), ``kept`` whether
    the log now runs the selection, ``seconds`` what the whole selection cost (builds and timings).
    """

    tasks: int
    variants: int
    changed: tuple[str, ...]
    best_ms: float
    selected_ms: float
    kept: bool
    seconds: float

    def __str__(self) -> str:
        if not self.tasks:
            return f"network-level selection: no task has two measured states to compare ({self.seconds:.1f} s)"
        if self.variants < 2:
            return (f"network-level selection: skipped, a second build would not fit in the time left "
                    f"({self.seconds:.1f} s)")
        head = (f"network-level selection: {self.tasks} heaviest tasks, their {self.variants} best states re-timed "
                f"in the network in {self.seconds:.1f} s")
        if not self.changed:
            return f"{head}; every task's fastest measured state is also its fastest there"
        verdict = "kept" if self.kept else "not kept (not faster end to end)"
        return (f"{head}; {len(self.changed)} tasks run faster with another state: {self.best_ms:.3f} -> "
                f"{self.selected_ms:.3f} ms end to end, {verdict}")


def select_in_network(extraction: Extraction, logs: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
                      log_file: Union[str, os.PathLike], target: Union[str, dict, tvm.target.Target, None] = None,
                      candidates: int = 3, rounds: int = 5, deadline: Optional[float] = None) -> Selection:
    """Re-time the ``candidates`` best measured states of each heavy task inside the network; keep the
    combination that is fastest there, and append the verdict to ``log_file``.

    Parameters
    ----------
    extraction
        The network's extraction (its module, tasks and inputs).
    logs
        The logs whose measurements give the candidates (the run's own log and its database's).
    log_file
        Where the selection records go (the run's own log).
    candidates
        States per task, and so variant builds (at least 2).
    rounds
        Profiles of every variant, and end-to-end timings of the two finalists, in turn.
    deadline
        Unix time by which to finish: fewer variants are built when the first shows they would not fit
        (the comparison of the finalists always runs).

    Raises
    ------
    AnsorError
        If the target's kernels cannot be timed by the host (a GPU) or ``candidates`` < 2.
    """
    start = time.time()
    target = parse_target(target if target is not None else extraction.tasks[0].task.target)
    if not device_kind(target).profile_calls:
        raise AnsorError(f"network-level selection times kernels on the host; a {target.kind.name} target's "
                         "kernels run asynchronously (valid: a CPU target)")
    if candidates < 2:
        raise AnsorError(f"candidates must be at least 2 (the best state and one other), got {candidates}")
    ranked = _ranked_states(extraction.tasks, load_records(logs, target=target), candidates)
    heavy = _heavy_tasks(extraction.tasks, ranked)
    if not heavy:
        return Selection(0, 0, (), math.nan, math.nan, False, time.time() - start)

    def build_with(pick: dict[str, int]) -> tvm.runtime.Executable:
        states = {key: recs[pick.get(key, 0)].state for key, recs in ranked.items()}
        return build(apply_schedules(extraction.mod, extraction.tasks, states, target=target), target)

    net = extraction.network
    n_variants = max(len(ranked[t.workload_key]) for t in heavy)
    variants: list[tuple[dict[str, int], tvm.runtime.Executable, CallProfiler]] = []
    for i in range(n_variants):
        pick = {t.workload_key: min(i, len(ranked[t.workload_key]) - 1) for t in heavy}
        exe = build_with(pick)
        variants.append((pick, exe, CallProfiler(exe, net, target=target)))
        spent = time.time() - start
        if deadline is not None and i + 1 < n_variants and time.time() + 2 * spent / (i + 1) > deadline:
            logger.info("network-level selection: %d of %d variants fit before the deadline", i + 1, n_variants)
            break
    if len(variants) < 2:
        return Selection(len(heavy), 1, (), math.nan, math.nan, False, time.time() - start)
    repeat = max(1, min(50, math.ceil(PROFILE_MS / max(variants[0][2].profile(1).latency_ms, 1e-3))))
    samples: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for pick, _exe, profiler in variants:
            profile = profiler.profile(repeat)
            for t in heavy:
                calls = sum(profile.calls.get(name, 0) for name in t.global_vars)
                if calls:
                    ms = sum(profile.ms.get(name, 0.0) for name in t.global_vars)
                    samples.setdefault((t.workload_key, pick[t.workload_key]), []).append(ms / calls)
    built = {i for pick, _, _ in variants for i in pick.values()}
    chosen = {t.workload_key: min((i for i in built if (t.workload_key, i) in samples),
                                  key=lambda i: statistics.median(samples[t.workload_key, i]), default=0)
              for t in heavy}
    changed = tuple(t.name for t in heavy if chosen[t.workload_key] != 0)
    best_ms = selected_ms = math.nan
    kept = False
    if changed:
        best_ms, selected_ms, kept = compare_builds(variants[0][1], build_with(chosen), net, target, rounds)
    final = chosen if kept else {key: 0 for key in chosen}
    with RecordWriter(log_file) as writer:
        for t in heavy:
            i = final[t.workload_key]
            per_call = tuple(max(ms, 1e-6) / 1e3 for ms in samples.get((t.workload_key, i), [])) or \
                ranked[t.workload_key][i].record.result.costs
            writer.write_record(t.task, ranked[t.workload_key][i].state.steps,
                                MeasureResult(per_call, ErrorNo.NO_ERROR, all_cost=time.time() - start,
                                              in_network=True))
    selection = Selection(len(heavy), len(variants), changed, best_ms, selected_ms, kept, time.time() - start)
    logger.info("%s", selection)
    return selection


@dataclass(frozen=True)
class _Candidate:
    """A measured state of a task, replayed on the network task's own program."""

    record: Record
    state: State


def _ranked_states(tasks: Sequence[NetworkTask], records: Sequence[Record], candidates: int) -> dict[str, list[_Candidate]]:
    """Per task, its ``candidates`` fastest distinct valid measurements whose steps replay on its program."""
    by_key: dict[str, list[Record]] = {}
    for rec in distinct_records(records):
        if rec.result.ok:
            by_key.setdefault(rec.workload_key, []).append(rec)
    ranked: dict[str, list[_Candidate]] = {}
    for t in tasks:
        kept: list[_Candidate] = []
        for rec in sorted(by_key.get(t.workload_key, []), key=lambda r: r.result.mean_cost):
            if len(kept) == candidates:
                break
            try:
                kept.append(_Candidate(rec, replayed_state(t.task, rec.steps)))
            except AnsorError as err:  # replay reports TVM's refusals as StepError, an AnsorError
                logger.warning("%s: a measured state does not replay (%s); not a candidate", t.name, err)
        if kept:
            ranked[t.workload_key] = kept
    return ranked


def _heavy_tasks(tasks: Sequence[NetworkTask], ranked: dict[str, list[_Candidate]]) -> list[NetworkTask]:
    """The tasks that carry :data:`HEAVY_SHARE` of the estimated latency and have a second state to try."""
    estimate = {t.workload_key: t.weight * ranked[t.workload_key][0].record.result.mean_cost
                for t in tasks if t.workload_key in ranked}
    total = sum(estimate.values())
    heavy, covered = [], 0.0
    for t in sorted((t for t in tasks if t.workload_key in estimate), key=lambda t: -estimate[t.workload_key]):
        if covered >= HEAVY_SHARE * total:
            break
        covered += estimate[t.workload_key]
        if len(ranked[t.workload_key]) > 1:
            heavy.append(t)
    return heavy


def compare_builds(best: tvm.runtime.Executable, selected: tvm.runtime.Executable, network, target,
                   rounds: int) -> tuple[float, float, bool]:
    """Both builds timed end to end in turn; the selection is kept if it is faster in the median and in
    most rounds (so a tie on a noisy machine keeps the measurements' choice)."""
    pairs = []
    for _ in range(rounds):
        pairs.append((time_network(best, network, target=target, repeat=SELECTION.repeat,
                                   min_repeat_ms=SELECTION.min_repeat_ms).median_ms,
                      time_network(selected, network, target=target, repeat=SELECTION.repeat,
                                   min_repeat_ms=SELECTION.min_repeat_ms).median_ms))
    best_ms = statistics.median(p[0] for p in pairs)
    selected_ms = statistics.median(p[1] for p in pairs)
    wins = sum(1 for b, s in pairs if s < b)
    return best_ms, selected_ms, selected_ms < best_ms and 2 * wins > rounds
