"""ComputeDAG: a PrimFunc's blocks as stages, with the analysis the sketch rules need.

One stage per TensorIR block, in program (topological) order. For each stage we keep its iterator
variables, its memory accesses as affine expressions (:mod:`ansor.state.access`), its loops, and Ansor's
predicates: strictly inlineable, needs multi-level tiling (data reuse), is output, element-wise matched
consumers. The DAG also counts floating-point operations, which turns a measured time into GFLOPS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Container, Optional, Sequence, Union

import tvm
from tvm import sym, te, tirx
from tvm.ir import Call
from tvm.ir.expr import TensorLoad
from tvm.ir.prim import expr as E
from tvm.tirx.analysis import undefined_vars

from .access import Access, Affine, BlockInfo, BlockVar, IterKind, LoopPart
from .tensor_intrin import BF16_BITS
from ..errors import AnsorError

if TYPE_CHECKING:
    from .loop_state import State

# Calls Ansor treats as expensive: inlining them would recompute a transcendental per use.
_EXPENSIVE_CALLS = frozenset(
    n for n in ("exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "pow",
                          "tanh", "sigmoid", "erf", "sin", "cos", "tan", "atan", "fast_exp", "fast_tanh")
)
_BRANCH_CALLS = frozenset(("if_then_else", "select"))  # _walk records a Select node as "select"
_FLOP_BINOPS = (E.Add, E.Sub, E.Mul, E.Div, E.Mod, E.FloorDiv, E.FloorMod, E.Max, E.Min)


@dataclass(frozen=True)
class DagStage:
    """One block of the original program, with its static analysis."""

    name: str
    block: BlockInfo
    loops: tuple[tuple[str, int, tuple[LoopPart, ...]], ...]  # (name, extent, parts), outer to inner
    is_output: bool
    is_reduction: bool
    strictly_inlineable: bool
    needs_multi_level_tiling: bool
    has_branch: bool
    has_expensive_op: bool
    flops: float
    #: Its branches are all ``select``s of values (fast math's clamps and signs), no ``if_then_else`` of
    #: indices (padding): inlined into an element-wise consumer, they add no control flow.
    selects_only: bool = False


class ComputeDAG:
    """The analysed program a search task tunes.

    Parameters
    ----------
    source
        A ``tvm.tirx.PrimFunc`` or a list of TE tensors (inputs first, outputs last).
    """

    def __init__(self, source: Union[tirx.PrimFunc, Sequence[te.Tensor]]):
        if isinstance(source, tirx.PrimFunc):
            func = source
        elif isinstance(source, (list, tuple)) and all(isinstance(t, te.Tensor) for t in source):
            func = te.create_prim_func(list(source))
        else:
            raise AnsorError(f"ComputeDAG needs a PrimFunc or a list of te.Tensor, got {type(source).__name__}")
        self.func: tirx.PrimFunc = func
        # Fused network PrimFuncs carry no global_symbol, and TVM will not build a module without one.
        if func.attrs is None or "global_symbol" not in func.attrs:
            func = func.with_attr("global_symbol", "main")
        self.mod = tvm.IRModule({"main": func})
        self.buffer_shapes: dict[str, tuple[int, ...]] = {}
        self.buffer_dtypes: dict[str, str] = {}
        self.stages: tuple[DagStage, ...] = tuple(self._analyse())
        #: Argument names in call order, and those the caller promises are constants (TVM's
        #: ``layout_free_buffers`` attribute: network weights), whose layout the schedule may choose.
        self.param_names: tuple[str, ...] = tuple(p.name for p in func.params)
        self.param_buffers = frozenset(self.param_names)
        free = func.attrs.get("layout_free_buffers", ()) if func.attrs is not None else ()
        self.layout_free = frozenset(self.param_names[int(i)] for i in free)

    # ------------------------------------------------------------------ analysis
    def _analyse(self) -> list[DagStage]:
        sch = tvm.s_tir.Schedule(self.mod)
        try:
            root = sch.get_sblock("root")
        except Exception as err:  # TVM raises ScheduleError for hand-written loops without blocks
            raise AnsorError(f"the PrimFunc has no root block to schedule ({type(err).__name__})") from None
        param_names = {p.name for p in self.func.params}
        stages = []
        for rv in sch.get_child_blocks(root):
            block = sch.get(rv)
            loops = [sch.get(l) for l in sch.get_loops(rv)]
            if not loops:
                raise AnsorError(f"block {block.name_hint} has no loops; scalar blocks are not supported")
            realize = loops[-1].body
            if not isinstance(realize, tvm.s_tir.stmt.SBlockRealize):
                raise AnsorError(f"block {block.name_hint} does not own its loop nest; "
                                 "only one block per loop nest is supported")
            stages.append(self._analyse_block(block, loops, realize, param_names))
        if not stages:
            raise AnsorError("the PrimFunc has no blocks to schedule")
        return self._inline_epilogue_selects(stages)

    def _inline_epilogue_selects(self, stages: list[DagStage]) -> list[DagStage]:
        """In a bf16 program, a stage with value selects (fast math's SiLU, erf) is strictly inlineable
        into its one element-wise consumer.

        Ansor keeps any stage with a branch out of its consumers. A bf16 epilogue ends in a rounding to
        bits, a stage of its own, so such an activation left at the root split ViT-B/16's GELU layer
        (a 197 x 768 x 3072 product) into three passes over its output, and its product had two readers,
        so it could not finish a tile's epilogue in cache. fp32 programs keep the spaces they were
        measured with.
        """
        if BF16_BITS not in self.buffer_dtypes.values():
            return stages
        readers: dict[str, list[DagStage]] = {}
        for st in stages:
            for buffer in {a.buffer for a in st.block.reads}:
                readers.setdefault(buffer, []).append(st)
        out = []
        for st in stages:
            consumers = readers.get(st.block.writes[0].buffer, [])
            if (st.selects_only and not st.is_reduction and not st.is_output
                    and not st.has_expensive_op and len(consumers) == 1 and not consumers[0].is_reduction
                    and _size(consumers[0]) == _size(st)):  # element for element: nothing recomputed
                st = replace(st, strictly_inlineable=True)
            out.append(st)
        return out

    def _analyse_block(self, block, loops, realize, param_names: set[str]) -> DagStage:
        vars_ = tuple(
            BlockVar(iv.var.name, IterKind.REDUCE if int(iv.iter_type) == 2 else IterKind.SPATIAL, int(iv.dom.extent))
            for iv in block.iter_vars
        )
        var_names = {v.name: v.extent for v in vars_}  # a name's extent: for the runs of non-affine indices
        store = block.body
        if not isinstance(store, tirx.BufferStore):
            raise AnsorError(f"block {block.name_hint}: only single-store blocks are supported")
        self._note_buffer(store.buffer)
        writes = (_access(store.buffer.name, store.indices, var_names),)
        reads: list[Access] = []
        calls: list[str] = []
        periods: dict[str, int] = {}
        flops = _walk(store.value, reads, calls, periods, var_names, self._note_buffer)
        # A reduction update reads its own output (C = C + ...): that is not a data dependence.
        reads = [r for r in reads if r.buffer != store.buffer.name]
        loop_var_of = {l.loop_var.name: l for l in loops}
        loop_parts: dict[str, list[LoopPart]] = {l.loop_var.name: [] for l in loops}
        for iv, value in zip(block.iter_vars, realize.iter_values):
            aff = _affine(value, set(loop_var_of))
            if aff is None:
                raise AnsorError(f"block {block.name_hint}: iterator {iv.var.name} is not affine in its loops")
            for lname, coef in aff.terms:
                loop_parts[lname].append(LoopPart(iv.var.name, coef, int(loop_var_of[lname].extent)))
        loop_info = tuple((l.loop_var.name, int(l.extent), tuple(loop_parts[l.loop_var.name])) for l in loops)
        is_reduction = any(v.kind == IterKind.REDUCE for v in vars_)
        has_branch = any(c in _BRANCH_CALLS for c in calls)
        has_expensive = any(c in _EXPENSIVE_CALLS for c in calls)
        is_output = store.buffer.name in param_names
        simple = all(idx is not None and (idx.single_var() is not None or not idx.terms)
                     for acc in reads for idx in acc.indices)
        strictly_inlineable = (not is_reduction and not is_output and simple and not has_branch
                               and not has_expensive)
        # Ansor's data-reuse test: count the producers whose access misses a (non-unit) spatial axis. A
        # non-affine access skips its producer, unless it reads bf16 bits by known variables (a grouped bf16
        # product's channel ``o // 16 * K + rc``): fp32's (Winograd's tiles) keep the search space they had.
        spatial = [v.name for v in vars_ if v.kind == IterKind.SPATIAL and v.extent > 1]
        n_missing = 0
        for buffer in {a.buffer for a in reads}:
            accs = [a for a in reads if a.buffer == buffer]
            used = {n for a in accs for idx in a.indices if idx is not None for n, _ in idx.terms}
            if any(idx is None for a in accs for idx in a.indices):
                if self.buffer_dtypes.get(buffer) != BF16_BITS or any(a.opaque_vars is None for a in accs):
                    continue
                used.update(*(a.opaque_vars for a in accs))
            n_missing += any(s not in used for s in spatial)
        needs_tiling = n_missing >= 2 or (n_missing >= 1 and is_reduction)
        total = flops * math.prod(v.extent for v in vars_)
        block_info = BlockInfo(vars_, tuple(reads), writes, tuple(sorted(periods.items())))
        return DagStage(block.name_hint, block_info, loop_info, is_output, is_reduction, strictly_inlineable,
                        needs_tiling, has_branch, has_expensive, total,
                        selects_only=has_branch and "if_then_else" not in calls and simple)

    def _note_buffer(self, buf) -> None:
        if buf.name not in self.buffer_shapes:
            self.buffer_shapes[buf.name] = tuple(int(d) for d in buf.shape)
            self.buffer_dtypes[buf.name] = str(buf.dtype)

    # ------------------------------------------------------------------ queries
    def element_bits(self, buffer: str) -> int:
        """Bits per element of ``buffer``; a buffer a step added (``A_shared``, ``C_local``, ``C_rf``) has
        its source's type, and an unknown one is taken as float32."""
        while buffer not in self.buffer_dtypes and "_" in buffer:
            buffer = buffer.rsplit("_", 1)[0]
        dtype = self.buffer_dtypes.get(buffer, "float32")
        return int("".join(c for c in dtype if c.isdigit()) or 32)

    @cached_property
    def flop_ct(self) -> float:
        """Floating-point operations of one run (a multiply-add counts 2)."""
        return float(sum(s.flops for s in self.stages))

    # ------------------------------------------------------------------ states
    def init_state(self) -> "State":
        """The untransformed loop state: every stage at the root with its original loops."""
        from .loop_state import State
        return State.initial(self)

    def state_from_steps(self, steps) -> "State":
        """The state the given steps produce from the initial state (raises StepError if they do not fit)."""
        from .loop_state import State
        return State.initial(self).with_steps(steps)

    def replay(self, state_or_steps, verify: bool = False) -> tvm.s_tir.Schedule:
        """Apply a state's steps to a fresh ``s_tir.Schedule`` (see :mod:`ansor.state.replay`)."""
        from .replay import replay
        steps = getattr(state_or_steps, "steps", state_or_steps)
        return replay(self, steps, verify=verify)

    def __str__(self) -> str:
        lines = []
        for s in self.stages:
            iters = ", ".join(f"{v.name}:{v.kind}{v.extent}" for v in s.block.vars)
            flags = [n for n, on in (("output", s.is_output), ("reduction", s.is_reduction),
                                     ("inlineable", s.strictly_inlineable),
                                     ("multi-level-tiling", s.needs_multi_level_tiling)) if on]
            reads = ", ".join(str(a) for a in s.block.reads)
            lines.append(f"{s.block.writes[0]} = f({reads})  iters[{iters}]  {' '.join(flags)}")
        lines.append(f"FLOPs: {self.flop_ct:.0f}")
        return "\n".join(lines)


def _size(stage: DagStage) -> int:
    return math.prod(v.extent for v in stage.block.vars)


def _affine(expr, var_names: Container[str]) -> Optional[Affine]:
    """``expr`` as an affine form over ``var_names``, or None when it is not affine."""
    if isinstance(expr, E.IntImm):
        return Affine((), int(expr.value))
    if isinstance(expr, E.Var):
        return Affine.var(expr.name) if expr.name in var_names else None
    if isinstance(expr, E.Cast):
        return _affine(expr.value, var_names)
    if isinstance(expr, (E.Add, E.Sub)):
        a, b = _affine(expr.a, var_names), _affine(expr.b, var_names)
        if a is None or b is None:
            return None
        sign = 1 if isinstance(expr, E.Add) else -1
        neg = Affine(tuple((n, sign * c) for n, c in b.terms), sign * b.const)
        return _add(a, neg)
    if isinstance(expr, E.Mul):
        a, b = _affine(expr.a, var_names), _affine(expr.b, var_names)
        if a is None or b is None:
            return None
        if not b.terms:
            a, b = b, a
        if a.terms:
            return None
        k = a.const
        return Affine(tuple((n, k * c) for n, c in b.terms if k * c), k * b.const)
    return None


def _access(buffer: str, indices, var_names: dict[str, int]) -> Access:
    """An access with its indices in affine form, the block variables of those that are not, and the runs
    along which those variables still move every index as a vector's lanes (:func:`_vector_run`)."""
    affine = tuple(_affine(i, var_names) for i in indices)
    opaque = {v.name: v for i, a in zip(indices, affine) if a is None for v in undefined_vars(i)
              if v.name in var_names}
    runs = tuple((name, run) for name, var in sorted(opaque.items())
                 if (run := _vector_run(indices, var, var_names)) > 1)
    return Access(buffer, affine, frozenset(opaque), runs)


#: The longest run :func:`_vector_run` looks for: the most lanes a loop is vectorized with.
MAX_RUN = 64


def _vector_run(indices, var: tirx.Var, extents: dict[str, int]) -> int:
    """The longest aligned run of ``var`` (a power of two up to :data:`MAX_RUN` dividing its extent) along
    which ``indices`` move as a vector's lanes: the last by one a step, the others not at all; 1 if none."""
    extent, run = extents[var.name], MAX_RUN
    while run > 1:
        if extent % run == 0 and _moves_in_lanes(indices, var, run, extents):
            return run
        run //= 2
    return 1


def _moves_in_lanes(indices, var: tirx.Var, run: int, extents: dict[str, int]) -> bool:
    """Whether, with ``var = run * outer + lane``, the last index moves by ``lane`` from the run's start and the
    others not at all."""
    outer, lane = (tirx.Var(name, str(var.ty)) for name in ("run_outer", "run_lane"))
    others = {v.name: v for i in indices for v in undefined_vars(i) if v.name in extents and v.name != var.name}
    analyzers = []
    for start in (outer * run, outer * run + lane):
        analyzer = sym.Analyzer()
        for v in others.values():
            analyzer.bind(v, tvm.ir.Range(0, extents[v.name]))
        analyzer.bind(outer, tvm.ir.Range(0, extents[var.name] // run))
        analyzer.bind(lane, tvm.ir.Range(0, run))
        analyzer.bind(var, start)
        analyzers.append(analyzer)
    first, moved = analyzers
    for d, index in enumerate(indices):
        want = lane if d == len(indices) - 1 else 0
        left = moved.simplify(moved.simplify(index) - first.simplify(index) - want)
        if not isinstance(left, E.IntImm) or int(left) != 0:
            return False
    return True


def _add(a: Affine, b: Affine) -> Affine:
    coefs = dict(a.terms)
    for n, c in b.terms:
        coefs[n] = coefs.get(n, 0) + c
    return Affine(tuple((n, c) for n, c in coefs.items() if c), a.const + b.const)


def _walk(expr, reads: list[Access], calls: list[str], periods: dict[str, int], var_names: dict[str, int],
          note_buffer) -> int:
    """Collect loads, call names and the periods of the variables ``if_then_else`` conditions depend on
    (:func:`branch_periods`) under ``expr``; return its float operation count."""
    if isinstance(expr, TensorLoad):
        note_buffer(expr.source)
        reads.append(_access(expr.source.name, expr.indices, var_names))
        for index in expr.indices:  # indirect loads (gather) are reads too; integer math is no FLOP
            _walk(index, reads, calls, periods, var_names, note_buffer)
        return 0
    is_float = str(getattr(expr, "ty", "")).startswith(("float", "bfloat"))
    if isinstance(expr, _FLOP_BINOPS):
        return int(is_float) + _walk(expr.a, reads, calls, periods, var_names, note_buffer) + \
            _walk(expr.b, reads, calls, periods, var_names, note_buffer)
    if isinstance(expr, (E.EQ, E.NE, E.LT, E.LE, E.GT, E.GE, E.And, E.Or, E.LShift, E.RShift, E.BitwiseAnd,
                         E.BitwiseOr, E.BitwiseXor)):  # bit operations: a rounding to bf16 (tensor_intrin)
        return _walk(expr.a, reads, calls, periods, var_names, note_buffer) + \
            _walk(expr.b, reads, calls, periods, var_names, note_buffer)
    if isinstance(expr, (E.Cast, E.Not, E.BitwiseNot)):
        inner = expr.value if isinstance(expr, E.Cast) else expr.a
        return _walk(inner, reads, calls, periods, var_names, note_buffer)
    if isinstance(expr, E.Let):  # a value computed once and used by name (ansor.networks.fast_math)
        return _walk(expr.value, reads, calls, periods, var_names, note_buffer) + \
            _walk(expr.body, reads, calls, periods, var_names, note_buffer)
    if isinstance(expr, E.Select):
        calls.append("select")
        cond = _walk(expr.condition, reads, calls, periods, var_names, note_buffer)
        return cond + max(_walk(expr.true_value, reads, calls, periods, var_names, note_buffer),
                          _walk(expr.false_value, reads, calls, periods, var_names, note_buffer))
    if isinstance(expr, Call):
        name = str(getattr(expr.op, "name", "")).rsplit(".", 1)[-1]  # "tirx.exp", "prim.if_then_else"
        calls.append(name)
        counts = [_walk(a, reads, calls, periods, var_names, note_buffer) for a in expr.args]
        if name == "if_then_else" and len(counts) == 3:
            branch_periods(expr.args[0], var_names, periods)
        if name in _BRANCH_CALLS and len(counts) == 3:
            return counts[0] + max(counts[1], counts[2])
        return int(is_float and name in _EXPENSIVE_CALLS) + sum(counts)
    return 0


def branch_periods(cond, var_names: Container[str], periods: dict[str, int]) -> None:
    """Note in ``periods`` each variable ``cond`` depends on, with the period at whose multiples alone its
    value can change along that variable: the gcd of the points where a comparison with a constant turns
    (a concatenation of 32-channel inputs: 32), 1 for any other use."""
    if isinstance(cond, (E.And, E.Or)):
        branch_periods(cond.a, var_names, periods)
        branch_periods(cond.b, var_names, periods)
        return
    if isinstance(cond, E.Not):
        branch_periods(cond.a, var_names, periods)
        return
    if isinstance(cond, (E.LT, E.LE, E.GT, E.GE)):
        a, b = _affine(cond.a, var_names), _affine(cond.b, var_names)
        if a is not None and b is not None and bool(a.terms) != bool(b.terms):
            side, bound = (a, b.const) if a.terms else (b, a.const)
            # as ``side < t``: the first t where it is false
            t = bound + int(isinstance(cond, (E.LE, E.GT)) if a.terms else isinstance(cond, (E.GE, E.LT)))
            if len(side.terms) == 1 and abs(side.terms[0][1]) == 1:
                var, sign = side.terms[0]
                turn = t - side.const if sign == 1 else side.const - t + 1
                periods[var] = math.gcd(periods.get(var, 0), turn)
                return
    for var in undefined_vars(cond):
        if var.name in var_names:
            periods[var.name] = 1
