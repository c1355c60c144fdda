"""Task extraction: a Relax network -> fused PrimFuncs -> weighted search tasks.

Legalization turns every Relax operator into a PrimFunc and fusion merges each anchor (convolution,
matmul, ...) with its element-wise neighbours, as Relay's fusion did for Ansor. Structurally equal
PrimFuncs (the same subgraph at the same shapes) are one task; its weight is how often the Relax code calls
it, because the task scheduler minimises the weighted sum of task latencies. PrimFuncs that
:class:`~ansor.state.compute_dag.ComputeDAG` cannot analyse, or that compute nothing (copies, reshapes), are not
worth a search: they are reported and left to the default schedule (see :mod:`.schedules`).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Optional, Union

import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir.meta_schedule.arg_info import ArgInfo

from ..errors import AnsorError, short_message
from ..task.precision import Precision
from ..task.search_task import SearchTask
from ..sketch.tensor_rules import has_amx
from ..target import device_kind, hardware_params, parse_target
from .bf16 import BF16_BUILD_RTOL
from .calls import CALL_TIR_OPS
from .flatten import flatten_rows, is_reshape
from .network import Network, NetworkError
from .prepare import prepare

logger = logging.getLogger("ansor")

_SUFFIX = re.compile(r"(?<=[a-z])\d+$")  # the uniquifying number LegalizeOps/FuseOps append to op names


@dataclass
class NetworkTask:
    """One tuning task of a network.

    Attributes
    ----------
    task
        The search task (its workload key is the PrimFunc's structural hash).
    weight
        How many times the network calls this PrimFunc (over every global var in ``global_vars``).
    name
        Op names and input shapes, e.g. ``fused_conv2d_add_relu [1,56,56,64]x[3,3,64,64]``.
    global_vars
        Names of the PrimFuncs in the fused module this task's schedule replaces.
    """

    task: SearchTask
    weight: int
    name: str
    global_vars: tuple[str, ...]

    @property
    def workload_key(self) -> str:
        return self.task.workload_key


@dataclass(frozen=True)
class SkippedFunc:
    """A fused PrimFunc that is not a task, and why (it still gets the default schedule)."""

    name: str
    global_vars: tuple[str, ...]
    weight: int
    reason: str


#: How far two fp32 builds of one network may differ, as a share of the output's scale (sums reordered).
FP32_BUILD_RTOL = 1e-4


@dataclass
class Extraction:
    """The fused module with its tasks and the PrimFuncs left out of the search.

    ``network`` is the network the module computes, as :func:`~.prepare.prepare` made it (weights bound as
    constants, convolutions in NHWC): run and time builds of ``mod`` with it, not with the original.
    """

    mod: tvm.IRModule
    tasks: list[NetworkTask]
    skipped: list[SkippedFunc]
    network: Network
    precision: Precision = Precision.FP32

    @property
    def output_rtol(self) -> float:
        """How far two builds of ``mod`` may differ, as a share of the output's scale (any float rounding)."""
        return BF16_BUILD_RTOL if self.precision.bf16 else FP32_BUILD_RTOL

    @property
    def total_weight(self) -> int:
        """Weighted number of task occurrences (one per call of a tuned PrimFunc)."""
        return sum(t.weight for t in self.tasks)

    def summary(self) -> str:
        """A table of the tasks and the skipped PrimFuncs."""
        lines = [f"{len(self.tasks)} tasks, {self.total_weight} weighted occurrences"]
        for i, t in enumerate(self.tasks):
            lines.append(f"  task {i:3d}  x{t.weight:<3d} {t.task.flop_ct / 1e6:10.1f} MFLOP  {t.name}")
        for s in self.skipped:
            lines.append(f"  skipped   x{s.weight:<3d} {s.name}: {s.reason}")
        return "\n".join(lines)


def fuse(mod: tvm.IRModule, target: Union[str, dict, tvm.target.Target, None] = None) -> tvm.IRModule:
    """Legalize and fuse a Relax module into calls of fused PrimFuncs (TVM's ``zero`` pipeline).

    Each PrimFunc's arguments that are constants or weights are marked (``layout_free_buffers``), so its
    schedule may pack them (:mod:`ansor.state.layout_rewrite`).
    """
    target = parse_target(target)
    try:
        with target:
            # sort, argsort and topk have no legalization: TVM's build dispatches them to TOPI first
            mod = relax.backend.DispatchSortScan()(mod)
            fused = relax.get_pipeline("zero")(mod)
        return flatten_rows(relax.transform.AttachAttrLayoutFreeBuffers()(fused))
    except Exception as err:  # TVM reports unsupported operators with a long trace
        raise NetworkError(f"cannot legalize and fuse the network: {short_message(err, None, pick='last')}") from None


def call_counts(mod: tvm.IRModule) -> tuple[Counter, dict[str, int]]:
    """How many times the Relax functions of ``mod`` call each PrimFunc, and each one's output count."""
    counts: Counter = Counter()
    n_outputs: dict[str, int] = {}

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") in CALL_TIR_OPS:
            gv = expr.args[0]
            if isinstance(gv, tvm.ir.GlobalVar):
                counts[gv.name_hint] += 1
                out = expr.ty_args[0] if expr.ty_args else None  # the call's output type(s)
                n_outputs[gv.name_hint] = len(out.fields) if isinstance(out, tvm.ir.TupleType) else 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts, n_outputs


def standalone(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with an exported symbol, so a task's program compiles and runs on its own.

    Fused PrimFuncs are private to the network module (no ``global_symbol``); built alone they would
    export nothing. :func:`~ansor.networks.schedules.apply_schedules` drops the symbol again on the way back.
    """
    return func.with_attr("global_symbol", "main")


def task_name(gv_name: str, func: tvm.tirx.PrimFunc, n_outputs: int, with_output: bool = False) -> str:
    """``op_names [shape]x[shape]``: the fused op names without TVM's numbering, and the first two inputs.

    ``with_output`` appends ``->[shape]`` of the outputs, which tells apart e.g. the stride-1 and stride-2
    versions of a depthwise convolution.
    """
    ops = "_".join(_SUFFIX.sub("", part) for part in gv_name.split("_"))
    shapes = [f"[{','.join(str(int(d)) for d in info.shape)}]" for info in ArgInfo.from_prim_func(func)]
    n_in = max(1, len(shapes) - n_outputs)
    name = f"{ops} {'x'.join(shapes[:n_in][:2])}"
    return f"{name}->{'x'.join(shapes[n_in:])}" if with_output else name


def _as_task(func: tvm.tirx.PrimFunc, target: tvm.target.Target, name: str) -> tuple[Optional[SearchTask], str]:
    """A search task for ``func``, or ``None`` and why it is not worth one."""
    if is_reshape(func):
        return None, "a pure reshape (the VM makes it a view)"
    task = SearchTask(standalone(func), target, desc=name)
    try:
        if task.flop_ct == 0:
            return None, "no floating-point work (a copy or layout change)"
    except (AnsorError, tvm.s_tir.ScheduleError) as err:  # the latter: no root block (hand-written TIR)
        return None, f"ComputeDAG cannot analyse it: {short_message(err, None, pick='last')}"
    return task, ""


def extract(network: Network, target: Union[str, dict, tvm.target.Target, None] = None,
            layout: str = "NHWC", winograd: bool = True, fast_math: bool = True,
            precision: Precision = Precision.FP32) -> Extraction:
    """Prepare (CPU targets: see :mod:`.prepare`; ``layout`` is its convolution layout, ``winograd`` whether
    3x3 convolutions become Winograd tasks, ``fast_math`` whether exp, sigmoid, tanh, erf and what uses them
    become vectorizable approximations, ``precision`` what the convolutions and dense layers compute in), fuse
    ``network`` and group its PrimFuncs into weighted tasks.

    Tasks come out heaviest first (FLOPs times weight), which is the order a progress table wants.
    """
    target = parse_target(target)
    if precision is not Precision.FP32 and not device_kind(target).prepare_network:
        raise NetworkError(f"precision {precision.value} is for CPU targets (their bf16 dot product); "
                           f"target {target.kind.name} computes networks in fp32")
    if device_kind(target).prepare_network:
        network = prepare(network, layout=layout, winograd=winograd, fast_math=fast_math,
                          vector_bytes=hardware_params(target).vector_unit_bytes, precision=precision,
                          amx=has_amx(target))
    mod = fuse(network.mod, target)
    counts, n_outputs = call_counts(mod)
    groups: dict[int, list[tuple[str, tvm.tirx.PrimFunc]]] = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and counts[gv.name_hint] > 0:
            groups.setdefault(tvm_ffi.structural_hash(func), []).append((gv.name_hint, func))
    tasks: list[NetworkTask] = []
    long_names: dict[int, str] = {}
    skipped: list[SkippedFunc] = []
    for members in groups.values():
        gv_name, func = members[0]
        names = tuple(sorted(n for n, _ in members))
        weight = sum(counts[n] for n in names)
        name = task_name(gv_name, func, n_outputs.get(gv_name, 1))
        task, reason = _as_task(func, target, name)
        if task is None:
            skipped.append(SkippedFunc(name, names, weight, reason))
            logger.info("network %s: %s (x%d) is not a task: %s", network.name, name, weight, reason)
            continue
        tasks.append(NetworkTask(task, weight, name, names))
        long_names[id(tasks[-1])] = task_name(gv_name, func, n_outputs.get(gv_name, 1), with_output=True)
    tasks.sort(key=lambda t: -t.task.flop_ct * t.weight)
    _uniquify_names(tasks, long_names)
    logger.info("network %s: %d tasks (%d weighted), %d PrimFuncs skipped", network.name, len(tasks),
                sum(t.weight for t in tasks), len(skipped))
    return Extraction(mod, tasks, skipped, network, precision)


def _uniquify_names(tasks: list[NetworkTask], long_names: dict[int, str]) -> None:
    """Make task names unique: add output shapes where names clash, then numbers (``a + b`` vs ``b + a``)."""
    clash = Counter(t.name for t in tasks)
    for t in tasks:
        if clash[t.name] > 1:
            t.name = long_names[id(t)]
    clash = Counter(t.name for t in tasks)
    index: Counter = Counter()
    for t in tasks:
        if clash[t.name] > 1:
            index[t.name] += 1
            t.name = f"{t.name} #{index[t.name]}"
    for t in tasks:
        t.task.desc = t.name
