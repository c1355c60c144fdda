"""A network built with its default schedules and with a log's best ones, compared and timed; the thread-pool
setting the tuned build runs fastest with, for its export."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Sequence

from ..task.timing import REPORT


@dataclass
class NetworkEvaluation:
    """A network's default build vs its build with the best schedules of a log, on the same inputs."""

    default: "object"  # Timing
    tuned: "object"  # Timing
    comparison: "object"  # OutputComparison
    tuned_tasks: int
    n_tasks: int
    tuned_executable: "object" = None  # the tuned build, for --export

    @property
    def speedup(self) -> float:
        return self.default.mean_ms / self.tuned.mean_ms


def tuned_task_count(tasks, log: os.PathLike | Sequence[os.PathLike], target) -> int:
    """How many of ``tasks`` have a valid record in the log or logs (for ``target``)."""
    from ..log.records import best_records, load_records
    best = best_records(load_records(log, target=target))
    return sum(1 for t in tasks if t.workload_key in best)


def evaluate_network(extraction, log: os.PathLike | Sequence[os.PathLike], target, repeat: int = REPORT.repeat,
                     min_repeat_ms: int = REPORT.min_repeat_ms) -> NetworkEvaluation:
    """Build the default and the tuned network, compare their outputs, and time both.

    The default build gives every task the parallel + vectorized default schedule; the tuned build
    replaces each task that has a valid record in ``log`` (a log or a list of logs) by its best schedule.
    Timing runs in this process (``TVM_NUM_THREADS`` must already be set), the two builds in turn.
    """
    from ..networks import apply_schedules, apply_history_best, build, compare_outputs, time_networks
    tuned_mod = apply_history_best(extraction.mod, extraction.tasks, log, target=target)
    default_mod = apply_schedules(extraction.mod, extraction.tasks, {}, target=target)
    tuned_exe, default_exe = build(tuned_mod, target), build(default_mod, target)
    net = extraction.network
    comparison = compare_outputs(net, tuned_exe, default_exe, target, rtol=extraction.output_rtol)
    default, tuned = time_networks([default_exe, tuned_exe], net, target=target, repeat=repeat,
                                   min_repeat_ms=min_repeat_ms)
    return NetworkEvaluation(default, tuned, comparison, tuned_task_count(extraction.tasks, log, target),
                             len(extraction.tasks), tuned_exe)


def error_against_fp32(net, extraction, executable, target):
    """How far ``executable`` (a build of ``extraction``, e.g. in bf16) is from the fp32 default build of
    ``net`` on the same inputs: an :class:`~ansor.networks.OutputComparison`."""
    from ..networks import apply_schedules, build, compare_outputs, extract
    fp32 = extract(net, target)
    reference = build(apply_schedules(fp32.mod, fp32.tasks, {}, target=target), target)
    return compare_outputs(extraction.network, executable, reference, target, reference_network=fp32.network)


def pool_setting(executable, network, target, processes: int) -> dict:
    """The TVM thread-pool setting that runs the tuned build fastest here (CPU targets), for the export."""
    from ..relax.thread_pool import choose_pool_setting
    from ..target import device_kind

    if not device_kind(target).thread_pool:
        return {}
    print("timing the tuned build with each thread-pool setting in fresh processes ...", file=sys.stderr, flush=True)
    choice = choose_pool_setting(executable, network, target, processes=processes)
    print(choice, file=sys.stderr)
    return dict(choice.best.env)
