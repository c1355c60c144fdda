"""A network built with its default schedules and with a log's best ones, compared and timed; the thread-pool
setting the tuned build runs fastest with, for its export."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Sequence

from ..task.timing import REPORT


@dataclass
class BuildCheck:
    """A tuned build's output against the default build's; for a bf16 network whose two builds differ by more
    than :data:`~ansor.networks.bf16.BF16_BUILD_RTOL`, also both against the fp32 build's.

    A network that amplifies bf16 rounding moves both builds about as far from fp32 (LR-ASPP: 30 % of the
    output's scale, OpenVINO's bf16 26 %); a wrong schedule moves the tuned one further.
    """

    against_default: "object"  # OutputComparison
    tuned_vs_fp32: "object" = None  # OutputComparison, when the first differs in bf16
    default_vs_fp32: "object" = None

    @property
    def within_rounding(self) -> bool:
        """The builds differ beyond the bf16 tolerance, but the tuned one is no further from fp32 than the
        default one is (times :data:`~ansor.networks.bf16.BF16_NOISE_SLACK`)."""
        from ..networks.bf16 import BF16_NOISE_SLACK
        if self.tuned_vs_fp32 is None:
            return False
        d = self.default_vs_fp32
        return self.tuned_vs_fp32.max_abs_error <= d.atol + BF16_NOISE_SLACK * d.max_abs_error

    @property
    def ok(self) -> bool:
        return self.against_default.ok or self.within_rounding

    def summary(self) -> str:
        """How far the builds are apart and, when they pass, why: ``tuned == default build (...)``."""
        c = self.against_default
        apart = (f"max |tuned - default build| {c.max_abs_error:.3g}, allowed {c.allowed:.3g}, output scale "
                 f"{c.scale:.3g}")
        if self.tuned_vs_fp32 is None:
            return f"tuned == default build ({apart})" if c.ok else apart
        fp32 = (f"from the fp32 build: tuned {self.tuned_vs_fp32.max_abs_error:.3g}, default bf16 build "
                f"{self.default_vs_fp32.max_abs_error:.3g}")
        if self.within_rounding:
            return f"tuned as close to fp32 as the default bf16 build ({apart}; {fp32}: the network amplifies rounding)"
        return f"{apart}; {fp32}"


@dataclass
class NetworkEvaluation:
    """A network's default build vs its build with the best schedules of a log, on the same inputs."""

    default: "object"  # Timing
    tuned: "object"  # Timing
    check: BuildCheck
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


def evaluate_network(net, extraction, log: os.PathLike | Sequence[os.PathLike], target, repeat: int = REPORT.repeat,
                     min_repeat_ms: int = REPORT.min_repeat_ms) -> NetworkEvaluation:
    """Build the default and the tuned network, compare their outputs, and time both.

    The default build gives every task the parallel + vectorized default schedule; the tuned build
    replaces each task that has a valid record in ``log`` (a log or a list of logs) by its best schedule.
    Timing runs in this process (``TVM_NUM_THREADS`` must already be set), the two builds in turn. ``net``:
    the network ``extraction`` was extracted from (the fp32 reference of a bf16 check is built from it).
    """
    from ..networks import apply_schedules, apply_history_best, build, time_networks
    tuned_mod = apply_history_best(extraction.mod, extraction.tasks, log, target=target)
    default_mod = apply_schedules(extraction.mod, extraction.tasks, {}, target=target)
    tuned_exe, default_exe = build(tuned_mod, target), build(default_mod, target)
    check = check_tuned(net, extraction, tuned_exe, default_exe, target)
    default, tuned = time_networks([default_exe, tuned_exe], extraction.network, target=target, repeat=repeat,
                                   min_repeat_ms=min_repeat_ms)
    return NetworkEvaluation(default, tuned, check, tuned_task_count(extraction.tasks, log, target),
                             len(extraction.tasks), tuned_exe)


def check_tuned(net, extraction, tuned_exe, default_exe, target) -> BuildCheck:
    """Compare a tuned build of ``extraction`` (of ``net``) with its default build, and both with the fp32 build
    where a bf16 network's two builds differ beyond its tolerance (see :class:`BuildCheck`)."""
    from ..networks import compare_outputs
    from ..networks.extract import Precision
    check = BuildCheck(compare_outputs(extraction.network, tuned_exe, default_exe, target,
                                       rtol=extraction.output_rtol))
    if not check.against_default.ok and extraction.precision is not Precision.FP32:
        print("the tuned and default bf16 builds differ beyond bf16's tolerance: comparing both with the fp32 "
              "build ...", file=sys.stderr, flush=True)
        reference = fp32_reference(net, target)
        check.tuned_vs_fp32 = error_against_fp32(extraction, tuned_exe, reference, target)
        check.default_vs_fp32 = error_against_fp32(extraction, default_exe, reference, target)
    return check


def fp32_reference(net, target) -> tuple:
    """The fp32 default build of ``net`` with the prepared network it was built from."""
    from ..networks import apply_schedules, build, extract
    fp32 = extract(net, target)
    return fp32.network, build(apply_schedules(fp32.mod, fp32.tasks, {}, target=target), target)


def error_against_fp32(extraction, executable, reference: tuple, target):
    """How far ``executable`` (a build of ``extraction``, e.g. in bf16) is from ``reference`` (from
    :func:`fp32_reference`) on the same inputs: an :class:`~ansor.networks.OutputComparison`."""
    from ..networks import compare_outputs
    network, built = reference
    return compare_outputs(extraction.network, executable, built, target, reference_network=network)


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
