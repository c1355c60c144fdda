"""Apply schedules: swap tuned (or default-scheduled) PrimFuncs into a fused network module.

:func:`apply_schedules` takes the fused module from :func:`~ansor.networks.extract.extract`, the tasks, and a
schedule per workload key (a State, its steps, or an already scheduled PrimFunc), and returns a new module
where every PrimFunc of every task is the scheduled one. Everything else gets a default schedule
(:mod:`.default_schedule`) on CPU, or TVM's dlight GPU rules on a GPU, so no kernel is left as TVM's naive
single-threaded code; pure reshapes stay as they are, because the Relax VM turns them into free views.
:func:`apply_history_best` does the same from a tuning log.

A schedule that reads a constant weight packed (:mod:`ansor.state.layout_rewrite`) gets the weight packed here,
once, with numpy: the call passes the packed constant to the kernel, and no packing runs at inference.
Where a call passes that weight as an argument instead (weights not bound), the PrimFunc keeps its
packing block and packs at every call.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

import tvm
import tvm_ffi
from tvm import relax

from ..task import program
from ..errors import AnsorError, StepError, short_message
from ..state.layout_rewrite import PackedLayout
from ..state.loop_state import State
from ..log.records import best_records, load_records
from ..task.search_task import SearchTask
from ..target import device_kind, parse_target
from ..state.transform_steps import Step
from .default_schedule import copy_schedule, default_state, default_tir_schedule
from .calls import called_prim_func, replace_prim_funcs
from .extract import NetworkTask, standalone
from .flatten import is_reshape
from .network import NetworkError

logger = logging.getLogger("ansor")

#: What a task's schedule may be given as.
Schedule = Union[tvm.tirx.PrimFunc, State, Sequence[Step]]

#: Set on every PrimFunc we schedule, as MetaSchedule and dlight do, so later default-schedule passes
#: (e.g. TVM's GPU dlight rules) leave it alone.
SCHEDULED_ATTR = "tirx.is_scheduled"


@dataclass(frozen=True)
class ScheduledFunc:
    """A task's scheduled PrimFunc in its two forms.

    ``func`` takes the arguments as the network passes them (it packs the constant weights it reads packed
    itself); ``kernel`` takes the arguments of ``layouts`` already packed (it is ``func`` when nothing is).
    """

    func: tvm.tirx.PrimFunc
    kernel: tvm.tirx.PrimFunc
    layouts: tuple[PackedLayout, ...] = ()


def schedule_task(task: SearchTask, schedule: Schedule) -> ScheduledFunc:
    """What ``schedule`` makes of ``task`` (a PrimFunc is taken as already scheduled, packing nothing)."""
    if isinstance(schedule, tvm.tirx.PrimFunc):
        return ScheduledFunc(schedule, schedule)
    state = schedule if isinstance(schedule, State) else task.compute_dag.state_from_steps(schedule)
    full = program.schedule(task, state)
    kernel, layouts = program.kernel(task, state, full)
    return ScheduledFunc(full["main"], kernel["main"], tuple(layouts))


def scheduled_func(task: SearchTask, schedule: Schedule) -> tvm.tirx.PrimFunc:
    """The PrimFunc ``schedule`` makes of ``task``, taking the network's arguments as they are."""
    return schedule_task(task, schedule).func


def default_scheduled(task: SearchTask) -> ScheduledFunc:
    """The default-scheduled PrimFunc of ``task`` (see :mod:`.default_schedule`).

    A program that only moves data gets :func:`copy_schedule` where it applies. A program ComputeDAG
    cannot analyse, or whose State schedule TVM refuses, is scheduled on its TensorIR directly, so it still
    runs in parallel.
    """
    hw = task.hardware_params
    copied = copy_schedule(task.func, hw.num_cores, hw.vector_unit_bytes)
    if copied is not None:
        return ScheduledFunc(copied, copied)
    try:
        return schedule_task(task, default_state(task))
    except (AnsorError, tvm.s_tir.ScheduleError) as err:
        logger.info("%s: %s; scheduling its TensorIR directly", task.desc, short_message(err, None, pick="last"))
        func = default_tir_schedule(task.func, task.hardware_params.num_cores)
        return ScheduledFunc(func, func)


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


def apply_schedules(mod: tvm.IRModule, tasks: Sequence[NetworkTask], schedules: Mapping[str, Schedule],
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
    calls = _call_sites(mod)
    packing: dict[str, _Packed] = {}
    n_tuned = 0
    for t in tasks:
        for name in t.global_vars:
            _check_member(mod, name, t)
        schedule = schedules.get(t.workload_key)
        if schedule is not None:
            scheduled = schedule_task(t.task, schedule)
            n_tuned += 1
        elif default and device_kind(target).default_schedule == "ansor":
            scheduled = default_scheduled(t.task)
        else:
            continue
        for name in t.global_vars:
            _place(out, mod, name, scheduled, calls, packing)
    if default:
        out = _default_rest(out, target, calls, packing)
    out = replace_prim_funcs(out, {name: p.kernel for name, p in packing.items()},
                             lambda name: functools.partial(_packed_call, packing[name]))
    logger.info("apply_schedules: %d of %d tasks tuned, the rest %s; %d PrimFuncs read weights packed at build time",
                n_tuned, len(tasks), "default-scheduled" if default else "unscheduled", len(packing))
    return out


@dataclass(frozen=True)
class _Packed:
    """A PrimFunc whose calls pass constants: its kernel form, and how to pack those constants."""

    kernel: tvm.tirx.PrimFunc
    layouts: tuple[PackedLayout, ...]


def _place(out: tvm.IRModule, mod: tvm.IRModule, name: str, scheduled: ScheduledFunc,
           calls: dict[str, list[list]], packing: dict[str, _Packed]) -> None:
    """Put a scheduled PrimFunc in place of ``name``; when every call passes the arguments it reads packed
    as constants, also note its kernel form, which :func:`apply_schedules` swaps in with its constants packed."""
    gv = out.get_global_var(name)
    out[gv] = _with_attrs_of(mod[gv], scheduled.func)
    sites = calls.get(name, [])
    if scheduled.layouts and sites and all(isinstance(args[layout.index], tvm.ir.expr.Constant)
                                           for args in sites for layout in scheduled.layouts):
        packing[name] = _Packed(_with_attrs_of(mod[gv], scheduled.kernel), scheduled.layouts)


def _call_sites(mod: tvm.IRModule) -> dict[str, list[list]]:
    """The argument lists of every ``call_tir`` of each PrimFunc, by PrimFunc name."""
    sites: dict[str, list[list]] = {}

    def visit(expr) -> None:
        name = called_prim_func(expr) if isinstance(expr, relax.Call) else None
        if name is not None:
            sites.setdefault(name, []).append(list(expr.args[1].fields))

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return sites


def _packed_call(packed: _Packed, builder: relax.BlockBuilder, call: relax.Call, gv: tvm.ir.GlobalVar) -> relax.Expr:
    """The kernel form called on the constants packed with numpy, once, here."""
    args = list(call.args[1].fields)
    for layout in packed.layouts:
        value = layout.pack(args[layout.index].value.numpy())
        args[layout.index] = relax.const(value, str(value.dtype))
    return relax.Call(call.op, [gv, relax.Tuple(args)], call.attrs, call.ty_args)


def _check_member(mod: tvm.IRModule, name: str, t: NetworkTask) -> None:
    if name not in {gv.name_hint for gv in mod.get_global_vars()}:
        raise NetworkError(f"task {t.name} replaces PrimFunc {name!r}, which the module does not have; "
                           "extract the tasks from this module")
    if not tvm_ffi.structural_equal(standalone(mod[name]), t.task.func):
        raise NetworkError(f"PrimFunc {name!r} of the module differs from task {t.name}'s program; "
                           "extract the tasks from this (unscheduled) module")


def _default_rest(mod: tvm.IRModule, target: tvm.target.Target, calls: dict[str, list[list]],
                  packing: dict[str, _Packed]) -> tvm.IRModule:
    """Default-schedule every PrimFunc not yet scheduled, except pure reshapes."""
    if device_kind(target).default_schedule == "dlight":
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
        scheduled = default_scheduled(SearchTask(standalone(func), target, desc=gv.name_hint))
        _place(mod, mod, gv.name_hint, scheduled, calls, packing)
    return mod


def replayed_state(task: SearchTask, steps: Sequence[Step]) -> State:
    """The state ``steps`` make of ``task``'s own program, checked by a replay (a record's steps are
    checked lazily, and may come from a log of another program with the same key).

    Raises
    ------
    StepError
        If the steps do not fit the program, or TVM refuses one of them.
    """
    state = task.compute_dag.state_from_steps(steps)
    task.compute_dag.replay(state)
    return state


def apply_history_best(mod: tvm.IRModule, tasks: Sequence[NetworkTask], log_path: Union[str, os.PathLike],
                       target: Union[str, dict, tvm.target.Target, None] = None,
                       default: bool = True) -> tvm.IRModule:
    """:func:`apply_schedules` with the best valid record of each task in the log at ``log_path``.

    Records of other targets are ignored when ``target`` is given; a record whose steps no longer fit
    the task (a changed program with the same key cannot happen, but a hand-edited log can) is skipped
    with a warning and the task keeps its default schedule.

    Raises
    ------
    RecordError
        If the log is missing or unreadable.
    """
    best = best_records(load_records(log_path, target=target, selections=True))
    schedules: dict[str, Schedule] = {}
    for t in tasks:
        rec = best.get(t.workload_key)
        if rec is None:
            continue
        try:
            schedules[t.workload_key] = replayed_state(t.task, rec.steps)
        except StepError as err:
            logger.warning("%s: the best record in %s does not replay (%s); using the default schedule",
                           t.name, log_path, err)
    logger.info("apply_history_best: %s has schedules for %d of %d tasks", log_path, len(schedules), len(tasks))
    return apply_schedules(mod, tasks, schedules, target=target, default=default)
