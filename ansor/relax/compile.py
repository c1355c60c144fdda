"""From tuning logs to a runnable model: :func:`compile_relax` and the :class:`ApplyHistoryBest` pass.

Both replace each tuned PrimFunc by the best schedule its workload key has in the logs (measured for the
same target) and give every other PrimFunc the default schedule (``ansor.networks.apply_schedules``).
:func:`compile_relax` takes a raw module and does it all (bind, extract, apply, build);
:class:`PrepareAndFuse` and :class:`ApplyHistoryBest` are the extraction's module transform and the
apply step as passes, for a pipeline of one's own.
"""

from __future__ import annotations

import logging
from typing import Optional

import tvm
import tvm_ffi

from ..log.database import log_paths
from ..networks import NetworkTask, apply_schedules, apply_history_best, build, extract
from ..networks.extract import standalone
from ..networks.network import Network
from ..log.records import best_records, load_records
from ..task.precision import Precision
from ..task.search_task import LogSource, SearchTask, TargetLike, prim_func_key
from ..target import parse_target, target_to_str
from .export import Signature, attach_signature
from .model import Params, as_network

logger = logging.getLogger("ansor")


def compile_network(network: Network, log_file: Optional[LogSource], target: TargetLike = None,
                    precision: Precision = Precision.FP32) -> tvm.runtime.Executable:
    """Build ``network`` with the best schedules of ``log_file`` (a log, logs, a database or ``None``),
    in ``precision`` (the tuning's).

    The executable carries its call signature, so :func:`~ansor.relax.export` needs nothing else.
    """
    target = parse_target(target)
    extraction = extract(network, target, precision=precision)
    paths = log_paths(log_file) if log_file is not None else []
    if paths:
        mod = apply_history_best(extraction.mod, extraction.tasks, paths, target=target)
    else:
        mod = apply_schedules(extraction.mod, extraction.tasks, {}, target=target)
    executable = build(mod, target)
    attach_signature(executable, Signature.of(extraction.network, target))  # what the build takes
    return executable


def compile_relax(mod: tvm.IRModule, params: Params = None, log_file: Optional[LogSource] = None,
                  target: TargetLike = None, precision: Precision = Precision.FP32) -> tvm.runtime.Executable:
    """Compile a Relax module with the tuned schedules of ``log_file``; returns a Relax VM executable.

    ``params`` (weights by parameter name) are bound as constants, as in :func:`~ansor.relax.tune_relax`
    (give both the same ``params``, target and ``precision``, or the workload keys differ). ``log_file``: a log, a list
    of logs, a :class:`~ansor.log.database.Database`, or ``None`` for the default schedules only. Run it with
    ``relax.VirtualMachine(executable, tvm.cpu())[entry](*inputs)``; save it with
    :func:`~ansor.relax.export`.
    """
    return compile_network(as_network(mod, params), log_file, target, precision)


@tvm.transform.module_pass(opt_level=0, name="ansor.PrepareAndFuse")
class PrepareAndFuse:
    """A module pass: the fused module ansor's extraction tunes (prepared for a CPU target, then fused).

    Put it where a pipeline would legalize and fuse (instead of ``relax.get_pipeline("zero")``), followed
    by :class:`ApplyHistoryBest`: the PrimFuncs then are the tasks' programs, so their keys find the logs'
    records. Weights to bind go in first (``relax.transform.BindParams``); inputs need static shapes.
    """

    def __init__(self, target: TargetLike = None, entry: Optional[str] = None,
                 precision: Precision = Precision.FP32):
        self.target = target
        self.entry = entry
        self.precision = precision

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = parse_target(self.target if self.target is not None else tvm.target.Target.current(allow_none=True))
        return extract(as_network(mod, None, entry=self.entry), target, precision=self.precision).mod


@tvm.transform.module_pass(opt_level=0, name="ansor.ApplyHistoryBest")
class ApplyHistoryBest:
    """A module pass: tuned schedules from logs for the PrimFuncs of a fused Relax module.

    Put it after :class:`PrepareAndFuse` and before lowering (``ansor.networks.build`` of the result
    lowers without fusing again): each PrimFunc whose workload key (the structural hash ansor's
    extraction gives it) has a valid record for ``target`` in the logs gets its best schedule, its packed
    constant weights packed once; with ``default=True`` every other PrimFunc gets the default schedule.
    A module fused another way has other PrimFuncs, whose keys the logs do not know (the pass logs how many
    PrimFuncs it found records for).

    Parameters
    ----------
    log_file
        A log, a list of logs, or a :class:`~ansor.log.database.Database`.
    target
        The target the logs were tuned for; default: the current target context, else this host.
    default
        Default-schedule the PrimFuncs without a record (CPU: parallel + vectorized; GPU: dlight).
    """

    def __init__(self, log_file: LogSource, target: TargetLike = None, default: bool = True):
        self.paths = log_paths(log_file)
        self.target = target
        self.default = default

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = parse_target(self.target if self.target is not None else tvm.target.Target.current(allow_none=True))
        best = best_records(load_records(self.paths, target=target, selections=True)) if self.paths else {}
        tasks, schedules = [], {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            task_func = standalone(func)
            key = prim_func_key(task_func)
            rec = best.get(key)
            if rec is None or not tvm_ffi.structural_equal(rec.task.func, task_func):
                continue
            tasks.append(NetworkTask(SearchTask(task_func, target, workload_key=key, desc=gv.name_hint), 1,
                                     gv.name_hint, (gv.name_hint,)))
            schedules[key] = rec.steps
        logger.info("ApplyHistoryBest: %d PrimFuncs tuned for %s", len(tasks), target_to_str(target))
        return apply_schedules(mod, tasks, schedules, target=target, default=self.default)
