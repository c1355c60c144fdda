"""Apply-best: swap tuned (or default-scheduled) PrimFuncs into a fused network module.

:func:`apply_best` takes the fused module from :func:`~ansor.networks.extract.extract`, the tasks, and a
schedule per workload key (a State, its steps, or an already scheduled PrimFunc), and returns a new module
where every PrimFunc of every task is the scheduled one. Everything else gets a default schedule
(:mod:`.default_schedule`) on CPU, or TVM's dlight GPU rules on a GPU, so no kernel is left as TVM's naive
single-threaded code; pure reshapes stay as they are, because the Relax VM turns them into free views.
:func:`apply_history_best` does the same from a tuning log.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Sequence, Union

import tvm
import tvm_ffi

from ..errors import AnsorError, StepError
from ..loop_state import State
from ..records import best_records, load_records
from ..search_task import SearchTask
from ..target import is_gpu, parse_target
from ..transform_steps import Step
from .default_schedule import default_state, default_tir_schedule
from .extract import NetworkTask, is_reshape, standalone
from .network import NetworkError, short_reason

logger = logging.getLogger("ansor")

#: What a task's schedule may be given as.
Schedule = Union[tvm.tirx.PrimFunc, State, Sequence[Step]]

#: Set on every PrimFunc we schedule, as MetaSchedule and dlight do, so later default-schedule passes
#: (e.g. TVM's GPU dlight rules) leave it alone.
SCHEDULED_ATTR = "tirx.is_scheduled"


def scheduled_func(task: SearchTask, schedule: Schedule) -> tvm.tirx.PrimFunc:
    """The PrimFunc ``schedule`` makes of ``task`` (a PrimFunc is taken as already scheduled)."""
    if isinstance(schedule, tvm.tirx.PrimFunc):
        return schedule
    return task.compute_dag.replay(schedule).mod["main"]


def default_func(task: SearchTask) -> tvm.tirx.PrimFunc:
    """The default-scheduled PrimFunc of ``task`` (see :mod:`.default_schedule`).

    A program ComputeDAG cannot analyse, or whose State schedule TVM refuses, is scheduled on its
    TensorIR directly, so it still runs in parallel.
    """
    try:
        return task.compute_dag.replay(default_state(task)).mod["main"]
    except (AnsorError, tvm.s_tir.ScheduleError) as err:
        logger.info("%s: %s; scheduling its TensorIR directly", task.desc, short_reason(err))
        return default_tir_schedule(task.func, task.hardware_params.num_cores)


def _with_attrs_of(original: tvm.tirx.PrimFunc, func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` carrying ``original``'s attributes (noalias, global symbol or its absence) + scheduled mark.

    Replay builds its module as ``{"main": func}``; the Relax build must see the PrimFunc as it was in the
    network module (private, ``tirx.noalias``), or symbols could clash and aliasing analysis would be lost.
    """
    attrs = dict(original.attrs) if original.attrs is not None else {}
    attrs[SCHEDULED_ATTR] = True
    if func.attrs is not None and "global_symbol" in func.attrs and "global_symbol" not in attrs:
        func = func.without_attr("global_symbol")
    return func.with_attrs(attrs)


def apply_best(mod: tvm.IRModule, tasks: Sequence[NetworkTask], schedules: Mapping[str, Schedule],
               target: Union[str, dict, tvm.target.Target, None] = None,
               default: bool = True) -> tvm.IRModule:
    """A copy of the fused module ``mod`` with each task's PrimFuncs replaced by its schedule.

    Parameters
    ----------
    mod
        The fused, unscheduled module the tasks were extracted from (``Extraction.mod``).
    tasks
        The network's tasks.
    schedules
        Workload key -> State, step list, or scheduled PrimFunc (e.g.
        ``task.compute_dag.replay(state).mod["main"]``). Keys of other workloads are ignored.
    target
        Decides the default schedule (CPU or GPU); default: the first task's target, else this host.
    default
        Give every other PrimFunc (untuned tasks, skipped PrimFuncs) the default schedule.

    Raises
    ------
    NetworkError
        If a task names a PrimFunc that ``mod`` lacks or holds in another form (tasks of another module).
    """
    target = parse_target(target if target is not None else (tasks[0].task.target if tasks else None))
    out = mod.clone()
    n_tuned = 0
    for t in tasks:
        for name in t.global_vars:
            _check_member(mod, name, t)
        schedule = schedules.get(t.workload_key)
        if schedule is not None:
            func = scheduled_func(t.task, schedule)
            n_tuned += 1
        elif default and not is_gpu(target):
            func = default_func(t.task)
        else:
            continue
        for name in t.global_vars:
            gv = out.get_global_var(name)
            out[gv] = _with_attrs_of(mod[gv], func)
    if default:
        out = _default_rest(out, target)
    logger.info("apply_best: %d of %d tasks tuned, the rest %s", n_tuned, len(tasks),
                "default-scheduled" if default else "unscheduled")
    return out


def _check_member(mod: tvm.IRModule, name: str, t: NetworkTask) -> None:
    if name not in {gv.name_hint for gv in mod.get_global_vars()}:
        raise NetworkError(f"task {t.name} replaces PrimFunc {name!r}, which the module does not have; "
                           "extract the tasks from this module")
    if not tvm_ffi.structural_equal(standalone(mod[name]), t.task.func):
        raise NetworkError(f"PrimFunc {name!r} of the module differs from task {t.name}'s program; "
                           "extract the tasks from this (unscheduled) module")


def _default_rest(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Default-schedule every PrimFunc not yet scheduled, except pure reshapes."""
    if is_gpu(target):
        from tvm.s_tir import dlight

        rules = (dlight.gpu.Matmul(), dlight.gpu.GEMV(), dlight.gpu.Reduction(), dlight.gpu.GeneralReduction(),
                 dlight.gpu.Fallback())
        with target:
            return dlight.ApplyDefaultSchedule(*rules)(mod)
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, tvm.tirx.PrimFunc) or is_reshape(func):
            continue
        if func.attrs is not None and func.attrs.get(SCHEDULED_ATTR, False):  # tuned or a task's default
            continue
        mod[gv] = _with_attrs_of(func, default_func(SearchTask(standalone(func), target, desc=gv.name_hint)))
    return mod


def apply_history_best(mod: tvm.IRModule, tasks: Sequence[NetworkTask], log_path: Union[str, os.PathLike],
                       target: Union[str, dict, tvm.target.Target, None] = None,
                       default: bool = True) -> tvm.IRModule:
    """:func:`apply_best` with the best valid record of each task in the log at ``log_path``.

    Records of other targets are ignored when ``target`` is given; a record whose steps no longer fit
    the task (a changed program with the same key cannot happen, but a hand-edited log can) is skipped
    with a warning and the task keeps its default schedule.

    Raises
    ------
    RecordError
        If the log is missing or unreadable.
    """
    best = best_records(load_records(log_path, target=target))
    schedules: dict[str, Schedule] = {}
    for t in tasks:
        rec = best.get(t.workload_key)
        if rec is None:
            continue
        try:
            schedules[t.workload_key] = scheduled_func(t.task, rec.steps)
        except StepError as err:
            logger.warning("%s: the best record in %s does not replay (%s); using the default schedule",
                           t.name, log_path, err)
    logger.info("apply_history_best: %s has schedules for %d of %d tasks", log_path, len(schedules), len(tasks))
    return apply_best(mod, tasks, schedules, target=target, default=default)
