"""Random annotation: turn a sketch into a complete program (Ansor's initial-population rules).

In order: fill tile sizes, change compute locations, parallelise outer loops, add an unroll pragma, and
vectorize inner loops. Every choice is random; the cost model and evolution sort out which are good.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Optional

from ..state.access import Access, IterKind
from ..errors import StepError
from ..state.layout_rewrite import packable_arguments
from ..state.loop_nest import AttachKind
from ..state.loop_state import Stage, State
from ..task.search_task import SearchTask
from ..state.transform_steps import SplitStep, consumers_beside
from ..state.transform_steps.split import divisors, padded_extents
from .rules import CPU_STRUCTURE, dag_stage, has_reduce_iter, is_output, is_rfactor_stage, needs_multi_level_tiling

#: The innermost tile is at most this long (Ansor's default). Vectorized loops get up to 64 lanes, as in
#: MetaSchedule (Ansor allowed 16): with AVX-512 a 4 x 64 register block is 16 accumulators.
MAX_INNERMOST_FACTOR = 64
MAX_VECTORIZE_LANES = 64
#: Auto-unroll limits on CPU. Ansor's were (0, 16, 64, 512); here 512 made LLVM's code generation 7-10x
#: slower (0.7-1.1 s per matmul candidate instead of ~0.1 s, most of the build time of a tuning run) and
#: its programs were no faster than with 64 or 128 when re-timed side by side.
CPU_UNROLL_STEPS = (0, 16, 64, 128)
#: How often random annotation packs a runtime input of a tiled stage (an ``LR`` step: a copy in the kernel
#: that pays when the tile would otherwise thrash the cache). Constant weights are always packed: free.
P_PACK_INPUT = 0.5
#: How often random annotation draws a multi-level tiled stage's innermost tiles as a register block
#: (:func:`fits_registers`), and how many draws it tries; the rest of the programs stay uniform, so the
#: search still sees every tiling.
P_REGISTER_TILE = 0.5
REGISTER_TILE_TRIES = 200
#: How often random annotation inlines a stage that branches (a padding) into its consumer, rather than as
#: one of Ansor's 10-15 uniform choices: inlined, a depthwise convolution reads no padded copy of its input
#: (MobileNet-V2's 112x112x32 one tuned alone: 0.140 -> 0.070 ms at 96 trials, Zen 3; docs/design.md).
P_INLINE_BRANCH = 0.5
#: How often a reduction is computed under the loop of all its consumers (else uniformly): a chain fuses
#: only if each stage follows. BERT's layer norm: 12 us fused, 19 us as five regions (design.md, "Why").
P_FOLLOW_CONSUMERS = 0.75
#: Programs this small (loop iterations) are left serial at ``P_SERIAL``, so measurement decides whether
#: threads pay: a 1x96x24 product took 0.91 us serial, 1.05 us on 2 threads (design.md, "Why").
SERIAL_MAX_WORK = 1 << 16
P_SERIAL = 0.25
#: Most vectors unrolled to vectorize a concatenation in runs of its branch period (across branches each
#: lane is a gather): DenseNet-121's 0.12-0.26 ms at 64 lanes, 0.03-0.04 in runs (design.md, "Why").
MAX_UNROLLED_VECTORS = 64
#: How often a short outer loop of an untiled element-wise stage moves inside the next one, unrolled (a
#: Winograd transform's 16 positions share one tile's loads): 0.139 ms vs 0.199 (design.md, "Why").
P_SHORT_OUTER_INWARD = 0.5
MAX_SHORT_OUTER = 16
#: Registers a register block leaves free for the operands (a broadcast input, the weight vectors).
SPARE_REGISTERS = 4
#: A spatial iterator of the CPU tiling structure is split into one level per ``S``: that many less one lengths.
SPATIAL_SPLIT_LENGTHS = CPU_STRUCTURE.count("S") - 1
#: How often a spatial loop (not the vectorized one) is tiled as if padded (:func:`padded_extents`): 197
#: rows (ViT-B/16) have no register-block divisor; padded, its matmuls ran 12-17 % faster (design.md).
P_PADDED_TILE = 0.25


@functools.lru_cache(maxsize=4096)
def factorizations(extent: int, n: int, max_innermost: int = MAX_INNERMOST_FACTOR) -> tuple[tuple[int, ...], ...]:
    """Every ``n``-tuple of inner tile lengths whose product divides ``extent`` (innermost bounded)."""
    if n == 0:
        return ((),)
    out = []
    for first in divisors(extent):
        for rest in factorizations(extent // first, n - 1, max_innermost):
            lengths = (first, *rest)
            if lengths[-1] <= max_innermost:
                out.append(lengths)
    return tuple(out)


def fill_tile_sizes(state: State, rng: random.Random, registers: Optional["RegisterFile"] = None) -> State:
    """Give every unfilled split random lengths that divide its extent, or an extent it is padded to.

    With ``registers`` (CPU):

    - a multi-level tiled stage gets, with probability :data:`P_REGISTER_TILE`, innermost tiles drawn
      until they form a register block (see :func:`fits_registers`);
    - a spatial split other than the stage's last (vectorized) one is drawn, with probability
      :data:`P_PADDED_TILE`, for one of its :func:`padded_extents`.
    """
    fills: dict[int, tuple[int, ...]] = {}
    by_stage: dict[int, list[int]] = {}
    for k, step in enumerate(state.steps):
        if isinstance(step, SplitStep) and any(v is None for v in step.lengths):
            by_stage.setdefault(step.stage_id, []).append(k)
    for stage_id, ids in by_stage.items():
        lanes = registers.lanes(state, stage_id) if registers else 0
        blocked = registers is not None and lanes > 1 and rng.random() < P_REGISTER_TILE
        spatial_ids = [k for k in ids if len(state.steps[k].lengths) == SPATIAL_SPLIT_LENGTHS]
        paddable = set(spatial_ids[:-1]) if registers is not None else set()
        for _ in range(REGISTER_TILE_TRIES if blocked else 1):
            drawn = {k: _draw_lengths(state.steps[k], rng, k in paddable) for k in ids}
            spatial = [drawn[k] for k in ids if len(drawn[k]) == SPATIAL_SPLIT_LENGTHS]
            if not blocked or fits_registers(spatial, lanes, registers.count):
                break
        fills.update(drawn)
    if not fills:
        return state.copy()
    steps = [SplitStep(s.stage_id, s.iter_id, s.extent, fills[k], s.inner_to_outer) if k in fills else s
             for k, s in enumerate(state.steps)]
    return state.with_steps(steps)


def _draw_lengths(step: SplitStep, rng: random.Random, paddable: bool) -> tuple[int, ...]:
    extent = step.extent or 1
    pads = padded_extents(extent) if paddable else ()
    if pads and rng.random() < P_PADDED_TILE:
        extent = rng.choice(pads)
    return rng.choice(factorizations(extent, len(step.lengths)))


@dataclass(frozen=True)
class RegisterFile:
    """The vector registers of a CPU target: ``count`` registers of ``vector_bytes`` each.

    x86-64 has 16 (SSE, AVX, AVX2) or 32 (AVX-512) vector registers; the count follows the vector width
    the target's features give, so a test names its target and gets the same answer on any host.
    """

    count: int
    vector_bytes: int

    @staticmethod
    def of(task: SearchTask) -> "RegisterFile":
        width = task.hardware_params.vector_unit_bytes
        return RegisterFile(32 if width >= 64 else 16, width)

    def lanes(self, state: State, stage_id: int) -> int:
        """Elements of the stage's output type in one register."""
        return state.vector_lanes(stage_id, self.vector_bytes)


def fits_registers(spatial: list[tuple[int, ...]], lanes: int, registers: int) -> bool:
    """True if the innermost spatial tiles form a register block: the last (vectorized) one a multiple of
    the vector lanes, and between a quarter of the registers and all but :data:`SPARE_REGISTERS` of them
    holding accumulators (enough independent FMAs to hide their latency, room left for the operands).

    Why: uniform draws over the factorizations rarely give such a block (matmul-512: 12.5 % of draws on
    AVX2, 6.5 % on AVX-512), and the search then spends its first rounds on programs that spill registers
    or leave the FMA units waiting.
    """
    if not spatial:
        return True
    vector = spatial[-1][-1]
    if vector % lanes:
        return False
    accumulators = math.prod(t[-1] for t in spatial) // lanes
    return registers // 4 <= accumulators <= registers - SPARE_REGISTERS


def compute_location_candidates(state: State, stage_id: int) -> list[tuple[int, int]]:
    """Loops under which a producer could be computed: those of its single consumer (Ansor's candidate
    rule), and the loop where all its consumers are already computed (:func:`consumers_loop`)."""
    consumers = state.consumers(stage_id)
    out: list[tuple[int, int]] = []
    if len(consumers) == 1:
        out = _consumer_loops(state, consumers[0])
        if has_reduce_iter(state, stage_id):
            out = _without_recomputation(state, stage_id, out)
    shared = consumers_loop(state, stage_id)
    if shared is not None and shared not in out:
        out.append(shared)
    return out


def _consumer_loops(state: State, target: int) -> list[tuple[int, int]]:
    tstage = state.stages[target]
    is_tiled = tiled(state, target)
    out: list[tuple[int, int]] = []
    seen_reduce = False
    attached_at = {state.stages[c].attach[1] for c in state.attached_to(target)}
    for k, it in enumerate(tstage.iters):
        if it.kind == IterKind.REDUCE:
            seen_reduce = True
            if not is_tiled:
                break
        elif seen_reduce:
            break
        if it.annotation == "unroll":
            break
        if (it.extent or 1) == 1:
            continue
        out.append((target, k))
        if k in attached_at:
            break
    return out


def _without_recomputation(state: State, stage_id: int, loops: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The leading loops of ``loops`` (all of the stage's one consumer) that each move the part of the stage's
    output the consumer reads.

    Under a loop that does not (a normalization's column loop, for a row's mean), the whole stage would
    run again at every iteration: for a reduction that is its whole cost again, never a gain.
    """
    if not loops:
        return loops
    consumer = state.stages[loops[0][0]]
    read = {name for acc in consumer.block.reads_of(state.stages[stage_id].block.writes[0].buffer)
            for idx in acc.indices if idx is not None for name, _ in idx.terms}
    out: list[tuple[int, int]] = []
    for target, k in loops:
        if not read & {p.var for p in consumer.iters[k].parts}:
            break
        out.append((target, k))
    return out


def consumers_loop(state: State, stage_id: int) -> Optional[tuple[int, int]]:
    """The loop (stage, iterator) that every consumer of the stage is computed at, the stage owning it
    aside (it may be a consumer too); None if there is none. The stage can be computed there, ahead of them
    (what ``CA`` accepts: :func:`~ansor.state.transform_steps.consumers_beside`)."""
    placed = {state.stages[c].attach for c in state.consumers(stage_id)
              if state.stages[c].compute_at == AttachKind.ITER}
    if len(placed) != 1:
        return None
    loop = placed.pop()
    return loop if consumers_beside(state, stage_id, *loop) else None


def lanes_innermost(state: State, stage_id: int) -> None:
    """Move the stage's last contiguous spatial loop (short enough to vectorize) innermost, if it has one.

    For a reduction just computed at a consumer's loop: its loops were regenerated in block-variable
    order, which puts an ``_rf`` stage's lanes outside its reduce loop, where they cannot be vectorized.
    """
    stage = state.stages[stage_id]
    attached_at = {state.stages[c].attach[1] for c in state.attached_to(stage_id)}
    for k in range(len(stage.iters) - 1, -1, -1):
        it = stage.iters[k]
        if (it.kind == IterKind.SPATIAL and it.annotation == "none" and k not in attached_at
                and 1 < (it.extent or 1) <= MAX_VECTORIZE_LANES and contiguous(stage, (it,))):
            if k < len(stage.iters) - 1:
                state.reorder(stage_id, [j for j in range(len(stage.iters)) if j != k] + [k])
            return


def change_compute_location(state: State, rng: random.Random) -> State:
    """For each untiled, unplaced stage: keep it at the root, inline it, or compute it at a consumer loop
    (a padding stage inlined with probability :data:`P_INLINE_BRANCH`; a reduction whose consumers are all
    under one loop computed there with probability :data:`P_FOLLOW_CONSUMERS`)."""
    for stage_id in range(len(state.stages) - 1, -1, -1):
        stage = state.stages[stage_id]
        if stage.compute_at != AttachKind.ROOT or needs_multi_level_tiling(state, stage_id):
            continue
        if stage.origin < 0 and not is_rfactor_stage(state, stage_id):
            continue
        candidates = compute_location_candidates(state, stage_id)
        shared = consumers_loop(state, stage_id)
        ds = dag_stage(state, stage_id)
        reduction = has_reduce_iter(state, stage_id)
        if shared is not None and reduction and rng.random() < P_FOLLOW_CONSUMERS:
            choice = 2 + candidates.index(shared)
        elif reduction:  # cannot be inlined: the root or a loop
            choice = rng.choice([0, *range(2, len(candidates) + 2)])
        elif ds is not None and ds.has_branch and rng.random() < P_INLINE_BRANCH:
            choice = 1
        else:
            choice = rng.randrange(len(candidates) + 2)
        trial = state.copy()
        try:
            if choice == 1:
                if is_output(state, stage_id):
                    continue
                trial.compute_inline(stage_id)
            elif choice >= 2:
                trial.compute_at(stage_id, *candidates[choice - 2])
                if reduction:
                    lanes_innermost(trial, stage_id)
            else:
                continue
        except StepError:
            continue
        state = trial
    return state


def outer_parallel_loops(state: State, stage_id: int) -> int:
    """How many leading loops of a stage may be fused into one parallel (or GPU block) loop.

    Spatial, not yet annotated, and none past the first loop another stage is computed at: fusing beyond
    it would change where that stage is computed.
    """
    stage = state.stages[stage_id]
    attached = {state.stages[c].attach[1] for c in state.attached_to(stage_id)}
    n = 0
    for k, it in enumerate(stage.iters):
        if it.kind != IterKind.SPATIAL or it.annotation != "none":
            break
        n += 1
        if k in attached:
            break
    return n


def loop_work(state: State) -> int:
    """Iterations of every stage's loops: the size of a program whatever it computes (a copy has no FLOPs)."""
    return sum(math.prod(it.extent or 1 for it in stage.iters) for stage in state.stages)


def may_run_serial(state: State) -> bool:
    """Whether a program is small enough for the search to also try it without threads."""
    return loop_work(state) <= SERIAL_MAX_WORK


def annotate_parallel(state: State, task: SearchTask, rng: Optional[random.Random] = None) -> None:
    """Fuse the outer spatial loops of every root stage until there is enough parallelism, then parallel.
    With ``rng``, a small program (:func:`may_run_serial`) is left serial at ``P_SERIAL``."""
    if rng is not None and may_run_serial(state) and rng.random() < P_SERIAL:
        return
    limit = task.hardware_params.num_cores * 16
    for stage_id, stage in enumerate(state.stages):
        if stage.compute_at == AttachKind.ROOT:
            _parallel_outer(state, stage_id, limit)


def _parallel_outer(state: State, stage_id: int, limit: int) -> None:
    """Fuse the fewest outer loops that give over ``limit`` parallel iterations (all of them if none do)."""
    n, degree = 0, 1
    for it in state.stages[stage_id].iters[:outer_parallel_loops(state, stage_id)]:
        n += 1
        degree *= it.extent or 1
        if degree > limit:
            break
    if n == 0:
        return
    if n > 1:
        state.fuse(stage_id, list(range(n)))
    state.annotate(stage_id, 0, "parallel")


def tiled(state: State, stage_id: int) -> bool:
    """Whether a split step has tiled the stage's loops."""
    return any(isinstance(s, SplitStep) and s.stage_id == stage_id for s in state.steps)


def move_short_outer_inward(state: State, task: SearchTask, rng: random.Random) -> None:
    """At :data:`P_SHORT_OUTER_INWARD`, swap a short first loop of an untiled root stage that does not
    reduce with a longer loop after it and unroll it; in half of those, also split the innermost loop
    into vectors of a random width and move its outer part outside the unrolled loop, so the unrolled
    body is one vector per position. Called before :func:`annotate_parallel`, which then parallelizes
    the longer loop."""
    for stage_id, stage in enumerate(state.stages):
        if stage.compute_at != AttachKind.ROOT or len(stage.iters) < 3 or state.attached_to(stage_id) or \
                has_reduce_iter(state, stage_id) or tiled(state, stage_id):
            continue
        first, second, last = stage.iters[0], stage.iters[1], stage.iters[-1]
        if not all(it.kind == IterKind.SPATIAL and it.annotation == "none" for it in (first, second, last)):
            continue
        if not (1 < (first.extent or 0) <= MAX_SHORT_OUTER and (second.extent or 0) > (first.extent or 0)) or \
                rng.random() >= P_SHORT_OUTER_INWARD:
            continue
        n = len(stage.iters)
        state.reorder(stage_id, [1, 0, *range(2, n)])
        state.annotate(stage_id, 1, "unroll")
        lanes = state.vector_lanes(stage_id, task.hardware_params.vector_unit_bytes)
        extent = last.extent or 1
        widths = [d for d in divisors(extent) if lanes <= d <= MAX_VECTORIZE_LANES and d < extent]
        if widths and contiguous(stage, (last,)) and rng.random() < 0.5:
            state.split(stage_id, n - 1, [rng.choice(widths)])
            state.reorder(stage_id, [0, n - 1, *range(1, n - 1), n])


def annotate_unroll(state: State, rng: random.Random, choices: tuple[int, ...]) -> None:
    """An auto-unroll pragma with a step limit drawn from ``choices`` on every stage that reduces."""
    for stage_id, stage in enumerate(state.stages):
        if stage.compute_at != AttachKind.INLINED and stage.iters and has_reduce_iter(state, stage_id):
            value = rng.choice(choices)
            state.pragma(stage_id, 0, f"auto_unroll_max_step${value}")


def annotate_vectorize(state: State, rng: random.Random) -> None:
    """Vectorize (a fusion of) the innermost spatial loops of every stage, up to 64 lanes.

    Beyond Ansor: only loops whose every access is contiguous are vectorized (a strided vector access is
    a gather: slow, and fully unrolled it can take LLVM minutes to compile), an untiled stage whose
    innermost loop is too long is split first, so element-wise epilogues still get vector code, and one
    that branches along it is vectorized by :func:`vectorize_branch_runs`.
    """
    for stage_id, stage in enumerate(state.stages):
        if stage.compute_at == AttachKind.INLINED or not stage.iters:
            continue
        is_tiled = tiled(state, stage_id)
        attached_at = {state.stages[c].attach[1] for c in state.attached_to(stage_id)}
        if not is_tiled and (len(stage.iters) - 1) not in attached_at and vectorize_branch_runs(state, stage_id):
            continue
        n = len(stage.iters)
        fusible, length = 0, 1
        while fusible < n:
            k = n - 1 - fusible
            it = stage.iters[k]
            if k in attached_at or it.kind != IterKind.SPATIAL or it.annotation != "none" or (is_tiled and fusible):
                break
            if length * (it.extent or 1) > MAX_VECTORIZE_LANES or not contiguous(stage, stage.iters[k:]):
                break
            length *= it.extent or 1
            fusible += 1
        if fusible == 0:
            last = stage.iters[-1]
            free = last.kind == IterKind.SPATIAL and last.annotation == "none" and (n - 1) not in attached_at
            if not is_tiled and free and (last.extent or 1) > MAX_VECTORIZE_LANES and contiguous(stage, (last,)):
                factor = largest_divisor_at_most(last.extent or 1, MAX_VECTORIZE_LANES)
            else:
                factor = contiguous_run(stage, last) if not is_tiled and free else 1
            if 1 < factor < (last.extent or 1):
                state.split(stage_id, n - 1, [factor])
                state.annotate(stage_id, n, "vectorize")
            continue
        if fusible > 1:
            fusible = 1 + rng.randrange(fusible - 1) if fusible > 2 else rng.choice((1, 2))
        if fusible == 1:
            state.annotate(stage_id, n - 1, "vectorize")
        else:
            state.fuse(stage_id, list(range(n - fusible, n)))
            state.annotate(stage_id, n - fusible, "vectorize")


def branch_run_lanes(period: int, extent: int) -> int:
    """The vector width for a loop of ``extent`` whose value picks another input only at multiples of
    ``period`` (a concatenation): each vector then reads one input, and its runs are unrolled. 0 when the
    runs would be shorter than 2 lanes or more than :data:`MAX_UNROLLED_VECTORS`."""
    lanes = largest_divisor_at_most(math.gcd(period, extent), MAX_VECTORIZE_LANES)
    return lanes if lanes >= 2 and extent // lanes <= MAX_UNROLLED_VECTORS else 0


def vectorize_branch_runs(state: State, stage_id: int) -> bool:
    """Vectorize the innermost loop of a stage whose ``if_then_else`` branch changes along it in runs of
    the branch's period, unrolling the runs (:data:`MAX_UNROLLED_VECTORS`); False (nothing done) when it
    does not branch along that loop or the runs are too short or too many."""
    stage = state.stages[stage_id]
    last = stage.iters[-1]
    if last.kind != IterKind.SPATIAL or last.annotation != "none" or len(last.parts) != 1 or not last.extent:
        return False
    period = dict(stage.block.branch_periods).get(last.parts[0].var)
    if period is None or last.parts[0].stride != 1 or not contiguous(stage, (last,)):
        return False
    lanes = branch_run_lanes(period, last.extent)
    if not lanes:
        return False
    n = len(stage.iters)
    if lanes < last.extent:
        state.split(stage_id, n - 1, [lanes])
        state.annotate(stage_id, n - 1, "unroll")
        n += 1
    state.annotate(stage_id, n - 1, "vectorize")
    return True


def annotate_layout_rewrite(state: State, rng: random.Random) -> None:
    """``LR`` for the arguments each tiled root stage could read packed (see :mod:`ansor.state.layout_rewrite`)."""
    for stage_id, stage in enumerate(state.stages):
        if stage.compute_at != AttachKind.ROOT or not needs_multi_level_tiling(state, stage_id):
            continue
        for buffer in packable_arguments(state, stage_id):
            if buffer in state.dag.layout_free or rng.random() < P_PACK_INPUT:
                state.layout_rewrite(stage_id, buffer)


def contiguous(stage: Stage, iters) -> bool:
    """True if the loops walk every buffer the stage touches along its innermost dimension only.

    A fusion of loops is contiguous when, read as one loop, each variable it moves sits in the last
    dimension with unit stride, or nowhere (a broadcast). A non-affine index counts as strided when it uses
    a moved variable; one over other variables only (a Winograd tile's rows) stays fixed along the loop.
    """
    moved = {p.var for it in iters for p in it.parts}
    return len(moved) <= 1 and all(not acc.moved_opaquely(moved) and _affine_contiguous(acc, moved)
                                   for acc in (*stage.block.reads, *stage.block.writes))


def _affine_contiguous(acc: Access, moved: set[str]) -> bool:
    last = len(acc.indices) - 1
    return all(var not in dict(idx.terms) or (d == last and dict(idx.terms)[var] == 1)
               for d, idx in enumerate(acc.indices) if idx is not None for var in moved)


def contiguous_run(stage: Stage, it) -> int:
    """The lanes of aligned runs of loop ``it`` (a whole block variable) along which every access of the
    stage is contiguous, where some index is not affine in it (:attr:`Access.runs`: a tap pair's A16 reads
    16 channels of one pixel, then 16 of the next); 1 where there are none."""
    if len(it.parts) != 1 or it.parts[0].stride != 1:
        return 1
    var, runs = it.parts[0].var, []
    for acc in (*stage.block.reads, *stage.block.writes):
        if acc.moved_opaquely({var}):
            runs.append(dict(acc.runs).get(var, 1))
        elif not _affine_contiguous(acc, {var}):
            return 1
    run = min(runs, default=1)
    return run if (it.extent or 1) % run == 0 else 1


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` not above ``cap`` (1 at least)."""
    return max(d for d in divisors(n) if d <= cap)


def sample_cpu_program(task: SearchTask, sketch: State, rng: random.Random) -> Optional[State]:
    """One complete random CPU program from ``sketch`` (None if the random choices were illegal)."""
    try:
        state = fill_tile_sizes(sketch, rng, RegisterFile.of(task))
        state = change_compute_location(state, rng)
        move_short_outer_inward(state, task, rng)
        annotate_parallel(state, task, rng)
        annotate_unroll(state, rng, CPU_UNROLL_STEPS)
        annotate_vectorize(state, rng)
        annotate_layout_rewrite(state, rng)
    except StepError:
        return None
    return state
