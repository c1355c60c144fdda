"""Sketch rules, random annotation and evolution on real programs."""

import dataclasses
import random

import numpy as np
import pytest
import tvm

from ansor.state.loop_nest import AttachKind
from ansor.state.access import IterKind
from ansor.state.transform_steps import SplitStep
from ansor.state.transform_steps.split import padded_extents
from ansor.task import program
from ansor.task.search_task import SearchTask
from ansor.sketch import annotation
from ansor.sketch.annotation import RegisterFile, factorizations, fill_tile_sizes, fits_registers, sample_cpu_program
from ansor.sketch.search_space import generate_sketches, sample_initial_population
from ansor.sketch.evolution import evolutionary_search
from ansor.sketch.mutation import mutate_parallel, mutate_tile_size
from ansor.sketch.rules import Cond, SketchRule
from ansor.task.workloads import get_workload

# Sketches and annotation depend on the core count: name it (this CPU's mcpu, so the programs run here).
TARGET = "llvm -num-cores=2"


def task_with_cores(name: str, cores: int) -> SearchTask:
    task = SearchTask.from_workload(name, TARGET)
    task.hardware_params = dataclasses.replace(task.hardware_params, num_cores=cores)
    return task


# Ansor's oracles were taken on a machine with many cores: rfactor rules compare reduction lengths with
# the core count. With 16 cores our rules give exactly Ansor's counts.
@pytest.mark.parametrize("name, expected", [
    ("matmul-512", 3), ("matmul-8x8x512", 5), ("conv2d-bn-relu", 3), ("max-pool2d", 1), ("softmax-4x1024", 9),
])
def test_ansor_sketch_count_oracles(name, expected):
    assert len(generate_sketches(task_with_cores(name, 16))) == expected


def test_two_cores_add_rfactor_sketches_for_small_reductions():
    """Deliberate difference: on 2 cores a 3x3 pooling window (9 > 2 cores) also gets two rfactor sketches,
    and an 8x8 matmul has enough spatial parallelism (64 > 2 * 16) to skip rfactor."""
    assert len(generate_sketches(task_with_cores("max-pool2d", 2))) == 3
    assert len(generate_sketches(task_with_cores("matmul-8x8x512", 2))) == 3


def test_matmul_sketches_are_tiled_ssrsrs_with_and_without_cache_write():
    sketches = generate_sketches(task_with_cores("matmul-512", 16))
    shapes = sorted((len(s.stages), [it.name for it in s.stages[0].iters][:4]) for s in sketches)
    assert [n for n, _ in shapes] == [1, 2, 2]
    assert all(names == ["i_0", "j_0", "i_1", "j_1"] for _, names in shapes)
    fused_levels = sorted(s.stages[1].attach[1] for s in sketches if len(s.stages) == 2)
    assert fused_levels == [1, 3]  # the write-back fused under tile level 1 (j_0) and level 2 (j_1)


def test_user_rule_runs_first_and_can_replace_builtins():
    class InlineNothingKeepRoot(SketchRule):
        name = "keep"

        def condition(self, task, state, stage_id):
            return Cond.APPLY_AND_SKIP_REST

        def apply(self, task, state, stage_id):
            return [(state, stage_id - 1)]

    sketches = generate_sketches(SearchTask.from_workload("matmul-512", TARGET), extra_rules=(InlineNothingKeepRoot(),))
    assert len(sketches) == 1 and sketches[0].steps == []


def test_factorizations():
    assert set(factorizations(8, 2)) == {(1, 1), (1, 2), (1, 4), (1, 8), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2),
                                         (8, 1)}
    assert all(f[-1] <= 64 for f in factorizations(512, 3))


def test_padded_extents_round_up_to_small_multiples_with_little_waste():
    assert padded_extents(197) == (198, 200, 208)  # 208: 5.6 % padding
    assert padded_extents(60) == (64,)
    assert padded_extents(7) == ()  # 8 would pad 14 %
    assert padded_extents(3072) == ()


def _row_products(states, extent: int) -> list[int]:
    return [int(np.prod(s.lengths)) for st in states for s in st.steps
            if isinstance(s, SplitStep) and s.extent == extent and len(s.lengths) == 3]


def test_rows_without_a_good_divisor_get_padded_tiles_that_compute_the_right_answer():
    """A 197-row matmul (197 is prime) gets row tiles that do not divide 197 in some random programs; TVM
    guards the last tile, so they still compute the product. The vectorized column split (60: it could pad
    to 64) keeps tiles that divide it."""
    task = SearchTask.from_workload("matmul-197x60x64", TARGET)
    rng = random.Random(1)
    population = sample_initial_population(task, generate_sketches(task), 200, rng)
    rows = _row_products(population, 197)
    padded = [st for st in population if any(p not in (1, 197) for p in _row_products([st], 197))]
    assert 0.05 < len(padded) / len(population) < 0.5 and len(rows) >= len(population)
    assert all(60 % p == 0 for p in _row_products(population, 60))
    args = program.random_inputs(task, seed=2)
    want = get_workload("matmul-197x60x64").reference(args[:-1])[-1]
    for state in padded[:3]:
        got = program.run_program(program.build_program(task, state), args)
        np.testing.assert_allclose(got[-1], want, rtol=1e-4, atol=1e-4)
    mutated = [mutate_tile_size(task, padded[0], rng) for _ in range(20)]
    assert all(-(-197 // p) * p <= 208 for p in _row_products([m for m in mutated if m is not None], 197))


def test_fits_registers_counts_accumulators_against_the_register_file():
    # AVX2, float32: 8 lanes, 16 registers: 4 to 12 accumulators, the vector tile a multiple of 8.
    assert fits_registers([(1, 1, 4), (1, 2, 16)], lanes=8, registers=16)  # 4 x 16 = 8 registers
    assert not fits_registers([(1, 1, 8), (1, 1, 32)], lanes=8, registers=16)  # 32 registers: spills
    assert not fits_registers([(1, 1, 6), (1, 1, 12)], lanes=8, registers=16)  # 12 is not whole vectors
    assert not fits_registers([(1, 1, 1), (1, 1, 8)], lanes=8, registers=16)  # 1 FMA chain: latency-bound
    assert fits_registers([(1, 1, 8), (1, 1, 32)], lanes=16, registers=32)  # AVX-512: 16 of 32


@pytest.mark.parametrize("mcpu, registers, lanes", [("znver3", 16, 8), ("skylake-avx512", 32, 16)])
def test_random_tiles_are_register_blocks_more_often_than_uniform_draws(mcpu, registers, lanes):
    """The innermost tiles of matmul-512's tiled stage fit the target's registers in about half the random
    programs (uniform draws: 12.5 % on AVX2, 6.5 % on AVX-512); the target is named, not the host's."""
    task = SearchTask.from_workload("matmul-512", f"llvm -mcpu={mcpu} -num-cores=2")
    regs = RegisterFile.of(task)
    assert (regs.count, regs.vector_bytes) == (registers, lanes * 4)
    sketch = generate_sketches(task)[0]
    rng = random.Random(0)

    def share(with_registers: bool) -> float:
        hits = 0
        for _ in range(400):
            state = fill_tile_sizes(sketch, rng, regs if with_registers else None)
            spatial = [s.lengths for s in state.steps if getattr(s, "lengths", ()) and len(s.lengths) == 3]
            hits += fits_registers(spatial, lanes, registers)
        return hits / 400

    assert share(True) > 0.4
    assert share(False) < 0.25


def test_padding_is_inlined_in_about_half_the_random_programs(monkeypatch):
    """A depthwise convolution's padding stage (it branches at the borders) is inlined into the convolution
    in about half the random programs; drawn uniformly among root, inline and the consumer's loops it is
    inlined far less often."""
    task = SearchTask.from_workload("DEP-b1", "llvm -mcpu=znver3 -num-cores=2")
    sketches = generate_sketches(task)
    pad = next(i for i, st in enumerate(task.compute_dag.stages) if st.has_branch)
    assert all(s.stages[pad].compute_at == AttachKind.ROOT for s in sketches)  # annotation places it

    def inlined_share() -> float:
        rng = random.Random(0)
        states = [sample_cpu_program(task, sketches[i % len(sketches)], rng) for i in range(200)]
        placed = [s.stages[pad].compute_at for s in states if s is not None]
        assert len(placed) > 150
        return placed.count(AttachKind.INLINED) / len(placed)

    assert inlined_share() > 0.4
    monkeypatch.setattr(annotation, "P_INLINE_BRANCH", 0.0)
    assert inlined_share() < 0.25


def _row_fused(state) -> bool:
    """Every reduction (rfactor stages too) computed under one and the same loop."""
    reductions = [st for st in state.stages if st.compute_at != AttachKind.INLINED
                  and any(it.kind == IterKind.REDUCE for it in st.iters)]
    return all(st.compute_at == AttachKind.ITER for st in reductions) and len({st.attach for st in reductions}) == 1


def test_random_programs_compute_a_softmax_row_by_row(monkeypatch):
    """A reduction cannot be inlined, and at the root it is a parallel region of its own. Random annotation
    computes a softmax's reductions (the max, the sum of exponentials, their rfactor stages) under the
    normalization's row loop, where all their readers are, in a good share of programs, with the rfactor
    lanes moved innermost and vectorized; never under the column loop, which would redo a row's reduction
    for every column. Drawn uniformly (no following), whole rows are fused far less often."""
    task = SearchTask.from_workload("softmax-128x128", TARGET)
    sketches = generate_sketches(task)
    init = task.compute_dag.init_state()
    ids = {st.name: i for i, st in enumerate(init.stages)}
    assert annotation.compute_location_candidates(init, ids["T_softmax_expsum"]) == [(ids["T_softmax_norm"], 0)]

    def sample(n: int) -> list:
        rng = random.Random(0)
        states = [sample_cpu_program(task, sketches[i % len(sketches)], rng) for i in range(n)]
        return [s for s in states if s is not None]

    states = sample(300)
    fused = [s for s in states if _row_fused(s)]
    assert len(fused) > 0.15 * len(states)
    vectorized = [s for s in fused if any(st.name.endswith("_rf") and st.iters[-1].annotation == "vectorize"
                                          for st in s.stages)]
    assert vectorized
    wl = get_workload("softmax-128x128")
    args = program.random_inputs(task, seed=2)
    for state in vectorized[:2]:
        task.compute_dag.replay(state, verify=True)
        got = program.run_program(program.build_program(task, state), args)
        np.testing.assert_allclose(got[-1], wl.reference(args[:-1])[-1], rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(annotation, "P_FOLLOW_CONSUMERS", 0.0)
    assert sum(map(_row_fused, sample(300))) < len(fused) / 2


@pytest.mark.parametrize("name", ["matmul-512", "softmax-4x1024", "nhwc-resnet-50.C2", "conv2d-bn-relu", "TBS"])
@pytest.mark.slow
def test_initial_population_replays_and_compiles(name):
    """>= 95 % of 250 distinct random programs per workload replay onto TensorIR; a sample is checked loop by
    loop against the State and compiled for llvm (a compile costs ~50 ms, a replay ~2 ms)."""
    task = SearchTask.from_workload(name)
    rng = random.Random(0)
    population = sample_initial_population(task, generate_sketches(task), 250, rng)
    assert len(population) == 250
    assert len({s.key() for s in population}) == 250
    valid = 0
    for state in population:
        try:
            task.compute_dag.replay(state)
            valid += 1
        except Exception:
            pass
    assert valid >= 0.95 * len(population)
    for state in rng.sample(population, 20):
        task.compute_dag.replay(state, verify=True)
    for state in rng.sample(population, 8):
        tvm.compile(task.compute_dag.replay(state).mod, target=task.target)


def test_random_programs_compute_the_right_answer():
    task = SearchTask.from_workload("conv2d-bias-relu", TARGET)
    wl = get_workload("conv2d-bias-relu")
    rng = random.Random(3)
    for state in sample_initial_population(task, generate_sketches(task), 4, rng):
        args = program.random_inputs(task, seed=2)
        got = program.run_program(program.build_program(task, state), args)
        np.testing.assert_allclose(got[-1], wl.reference(args[:-1])[-1], rtol=1e-4, atol=1e-4)


def test_mutation_keeps_the_tile_product():
    task = SearchTask.from_workload("matmul-512", TARGET)
    rng = random.Random(5)
    state = sample_initial_population(task, generate_sketches(task), 1, rng)[0]
    changed = 0
    for _ in range(30):
        child = mutate_tile_size(task, state, rng)
        if child is None:
            continue
        assert [it.extent for it in child.stages[0].iters if it.kind == IterKind.REDUCE] != [] and child.key() != state.key()
        for stage in child.stages:
            for v in stage.block.vars:
                spans = [p.extent for it in stage.iters for p in it.parts if p.var == v.name]
                if stage.compute_at == AttachKind.ROOT and spans:
                    assert np.prod(spans) == v.extent
        changed += 1
    assert changed >= 20


@pytest.mark.parametrize("wkl", ["matmul-512", "conv2d-bias-relu"])
def test_parallel_mutation_changes_the_parallel_loop_and_stays_valid(wkl):
    task = SearchTask.from_workload(wkl)
    rng = random.Random(7)

    def parallel_extents(state):
        return [it.extent for stage in state.stages for it in stage.iters if it.annotation == "parallel"]

    changed = 0
    for state in sample_initial_population(task, generate_sketches(task), 12, rng):
        child = mutate_parallel(task, state, rng)
        if child is None:
            continue
        assert parallel_extents(child) != parallel_extents(state)
        task.compute_dag.replay(child, verify=True)  # TensorIR builds the same loops as the State
        changed += 1
    assert changed >= 6
    args = program.random_inputs(task, seed=2)
    got = program.run_program(program.build_program(task, child), args)
    want = program.run_program(program.build_program(task, None), args)
    np.testing.assert_allclose(got[-1], want[-1], rtol=1e-4, atol=1e-4)


def _parallel(state) -> bool:
    return any(it.annotation == "parallel" for stage in state.stages for it in stage.iters)


def test_small_programs_are_also_tried_serial_and_large_ones_never():
    """Whether a tiny task gains from a second thread is measured, not assumed: its random programs and the
    parallel mutation include serial ones, which build and compute the same; a large task's are all parallel."""
    small = SearchTask.from_workload("matmul-8x8x512", TARGET)
    rng = random.Random(3)
    population = sample_initial_population(small, generate_sketches(small), 64, rng)
    assert annotation.may_run_serial(population[0])
    serial = [s for s in population if not _parallel(s)]
    assert serial and len(serial) < len(population)
    dropped = [c for c in (mutate_parallel(small, s, rng) for s in population if _parallel(s) for _ in range(4))
               if c is not None and not _parallel(c)]
    assert dropped
    args = program.random_inputs(small, seed=4)
    want = program.run_program(program.build_program(small, None), args)[-1]
    for state in (serial[0], dropped[0]):
        small.compute_dag.replay(state, verify=True)
        np.testing.assert_allclose(program.run_program(program.build_program(small, state), args)[-1], want,
                                   rtol=1e-4, atol=1e-4)
    large = SearchTask.from_workload("matmul-512", TARGET)
    states = sample_initial_population(large, generate_sketches(large), 32, rng)
    assert not annotation.may_run_serial(states[0])
    assert all(_parallel(s) for s in states)
    assert all(_parallel(c) for c in (mutate_parallel(large, s, rng) for s in states) if c is not None)


def test_evolution_finds_what_the_scorer_likes_and_skips_excluded():
    """A scorer that prefers a long innermost j tile: evolution must climb towards it."""
    task = SearchTask.from_workload("matmul-512", TARGET)
    rng = random.Random(1)
    population = sample_initial_population(task, generate_sketches(task), 64, rng)

    class InnermostJ:
        def predict(self, task, states):
            return np.array([float(s.stages[0].iters[-1].extent or 0) for s in states])

    start = max(InnermostJ().predict(task, population))
    excluded = {population[0].key()}
    best = evolutionary_search(task, InnermostJ(), population, 8, excluded, rng)
    assert best[0][0] >= start and best[0][0] == 64  # the innermost tile is capped at 64
    assert all(state.key() not in excluded for _, state in best)


def test_vectorize_only_contiguous_loops():
    """A strided vector access is a gather; fully unrolled it once took LLVM four minutes to compile."""
    from ansor.sketch.annotation import contiguous
    state = SearchTask.from_workload("matmul-64", TARGET).compute_dag.init_state()
    c = state.stages[0]
    assert contiguous(c, c.iters[1:2])        # j: last dim of B and C, absent from A
    assert not contiguous(c, c.iters[0:1])    # i: first dim of A and C
    state.reorder(0, [0, 2, 1])
    state.fuse(0, [1, 2])
    assert not contiguous(state.stages[0], state.stages[0].iters[1:])  # k*j fused: two variables


def _tile_gather(name: str, channel_index) -> SearchTask:
    """``relu(x[p // 3, p % 3, channel_index(c)])``: rows picked by a non-affine index, as a Winograd input
    transform picks its tiles' pixels; registered as workload ``name``."""
    from tvm import te, topi
    from ansor.task.workloads import register_workload

    def make():
        x = te.placeholder((16, 3, 64), "float32", name="x")
        rows = te.compute((48, 64), lambda p, c: x[p // 3, p % 3, channel_index(c)], name="rows")
        return [x, topi.nn.relu(rows)]

    def reference(ins):
        c = np.array([channel_index(k) for k in range(64)])
        return [np.maximum(ins[0].reshape(48, 64)[:, c], 0)]

    register_workload(name, make, reference)
    return SearchTask.from_workload(name, TARGET)


def test_a_loop_that_no_non_affine_index_uses_is_contiguous_and_vectorized():
    """Non-affine indices over the outer variables stay fixed along the channels: the channel loop is
    contiguous, in the stage and after inlining it, and the default vectorizes it; the rows are not."""
    from ansor.networks import default_state
    from ansor.sketch.annotation import contiguous

    task = _tile_gather("tile-gather-relu", lambda c: c)
    rows = task.compute_dag.init_state().stages[0]
    assert contiguous(rows, rows.iters[1:]) and not contiguous(rows, rows.iters[:1])
    inlined = task.compute_dag.init_state()
    inlined.compute_inline(0)
    relu = inlined.stages[1]
    assert [sorted(a.opaque_vars) for a in relu.block.reads] == [["v_i0"]]
    assert contiguous(relu, relu.iters[1:]) and not contiguous(relu, relu.iters[:1])
    state = default_state(task)
    assert any(it.annotation == "vectorize" for stage in state.stages for it in stage.iters)
    inputs = program.random_inputs(task)
    for schedule in (state, inlined):
        got = program.run_program(program.build_kernel(task, schedule)[0], inputs)[-1]
        np.testing.assert_array_equal(got, np.maximum(inputs[0].reshape(48, 64), 0))
    halves = _tile_gather("tile-gather-halves-relu", lambda c: c // 2).compute_dag.init_state().stages[0]
    assert not contiguous(halves, halves.iters[1:])  # the channel itself is read through a non-affine index


def test_a_short_outer_loop_can_move_inside_unrolled_and_the_transform_stays_exact():
    """A Winograd input transform's 16 tile positions are its outer loop: random annotation also moves it
    inside the tiles and unrolls it, half of those with the channels in vectors outside it; every program
    computes B^T d B of each tile."""
    from tvm import te
    from ansor.networks.winograd import _BT, _input_transform
    from ansor.task.workloads import register_workload

    def make():
        data = te.placeholder((1, 16, 16, 32), "float32", name="data")
        return [data, _input_transform(data, 1, 1, (1, 8, 8), 64)]

    def reference(ins):
        padded = np.pad(ins[0][0], ((1, 1), (1, 1), (0, 0)))
        tiles = np.stack([padded[2 * r:2 * r + 4, 2 * c:2 * c + 4] for r in range(8) for c in range(8)])
        return [np.einsum("ei,pijc,nj->enpc", _BT, tiles, _BT).reshape(16, 64, 32).astype("float32")]

    register_workload("winograd-input-16x16x32", make, reference)
    task = SearchTask.from_workload("winograd-input-16x16x32", TARGET)
    programs = sample_initial_population(task, generate_sketches(task), 32, random.Random(0))
    moved = [s for s in programs if [it.annotation for it in s.stages[0].iters][:2] == ["parallel", "unroll"]]
    split = [s for s in programs if "unroll" in [it.annotation for it in s.stages[0].iters[2:]]]
    kept = [s for s in programs if "unroll" not in [it.annotation for it in s.stages[0].iters]]
    assert moved and split and kept
    assert all(s.stages[0].iters[0].extent == 64 for s in moved + split)  # the tiles go parallel
    inputs = program.random_inputs(task)
    want = reference(inputs)[0]
    for state in (moved[0], split[0], kept[0]):
        got = program.run_program(program.build_kernel(task, state)[0], inputs)[-1]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _strided_conv(name: str, size: int) -> SearchTask:
    """A 3x3, stride-2 NHWC convolution of a ``size`` x ``size`` x 32 image to 64 channels, for AVX2."""
    from tvm import te
    from ansor.task.te_ops import conv_stage
    from ansor.task.workloads import register_workload

    def make():
        data = te.placeholder((1, size, size, 32), "float32", name="data")
        weight = te.placeholder((3, 3, 32, 64), "float32", name="kernel")
        return [data, weight, conv_stage(data, weight, 2, 1)]

    def reference(ins):
        padded = np.pad(ins[0].astype("float64"), ((0, 0), (1, 1), (1, 1), (0, 0)))
        taps = [padded[:, i:i + size:2, j:j + size:2] @ ins[1][i, j] for i in range(3) for j in range(3)]
        return [sum(taps).astype("float32")]

    register_workload(name, make, reference)
    return SearchTask.from_workload(name, "llvm -mcpu=znver3 -num-cores=2")


def test_a_default_register_tile_of_short_rows_takes_rows_of_the_next_loop_too():
    """A 4x4 output keeps 2 x 4 positions in registers per weight vector (ResNet3D-18's 4x4x512 layers ran
    1.6-1.8x faster so than with 4), a 7x7 one 7 of one row as before; both compute the convolution."""
    from ansor.networks import default_state

    for size, tile in ((8, [(2, "unroll"), (4, "unroll"), (8, "vectorize")]), (14, [(7, "unroll"), (8, "vectorize")])):
        task = _strided_conv(f"conv-3x3-s2-{size}x{size}x32", size)
        state = default_state(task)
        conv = next(k for k, s in enumerate(state.stages) if s.name == "conv")
        iters = state.stages[conv].iters
        assert [(it.extent, it.annotation) for it in iters[-len(tile):]] == tile
        assert iters[-len(tile) - 1].kind == IterKind.REDUCE
        inputs = program.random_inputs(task)
        got = program.run_program(program.build_kernel(task, state)[0], inputs)[-1]
        np.testing.assert_allclose(got, get_workload(task.workload_key).reference(inputs[:2])[0], rtol=1e-4, atol=1e-4)


def _concat_relu(name: str, channels: tuple[int, ...]) -> SearchTask:
    """ReLU of a concatenation along NHWC channels (DenseNet's blocks), registered as workload ``name``."""
    from tvm import te, topi
    from ansor.task.workloads import register_workload

    def make():
        inputs = [te.placeholder((1, 14, 14, c), "float32", name=f"x{k}") for k, c in enumerate(channels)]
        return [*inputs, topi.nn.relu(topi.concatenate(inputs, axis=3))]

    register_workload(name, make, lambda ins: [np.maximum(np.concatenate(ins, axis=3), 0)])
    return SearchTask.from_workload(name, TARGET)


def test_a_concatenation_is_vectorized_in_runs_of_its_inputs_and_computes_the_right_answer():
    """Vectorized across its inputs, each lane of a concatenation picks its own input: LLVM compiles that
    to gathers. In runs of the inputs' channel counts' gcd, the runs unrolled, each vector reads one."""
    from ansor.networks import default_state

    task = _concat_relu("concat-64-32-96-relu", (64, 32, 96))
    concat = next(k for k, s in enumerate(task.compute_dag.stages) if s.name.startswith("T_concat"))
    assert dict(task.compute_dag.stages[concat].block.branch_periods) == {"v_ax3": 32}
    state = default_state(task)
    runs = [(it.extent, it.annotation) for it in state.stages[concat].iters[-2:]]
    assert runs == [(6, "unroll"), (32, "vectorize")]
    inputs = program.random_inputs(task)
    got = program.run_program(program.build_kernel(task, state)[0], inputs)[-1]
    np.testing.assert_array_equal(got, np.maximum(np.concatenate(inputs[:3], axis=3), 0))
    inlined = task.compute_dag.init_state()
    inlined.compute_inline(concat)  # the consumer now branches along its channels, in the same runs
    assert dict(inlined.stages[-1].block.branch_periods) == {"v_i3": 32}
    assert annotation.vectorize_branch_runs(inlined, len(inlined.stages) - 1)
    got = program.run_program(program.build_kernel(task, inlined)[0], inputs)[-1]
    np.testing.assert_array_equal(got, np.maximum(np.concatenate(inputs[:3], axis=3), 0))


def test_a_concatenation_whose_runs_are_too_many_or_too_short_is_vectorized_as_before():
    odd = _concat_relu("concat-33-31-relu", (33, 31))  # runs of 1 channel
    assert not annotation.vectorize_branch_runs(odd.compute_dag.init_state(), 0)
    many = _concat_relu("concat-8x65-relu", (8,) * 65)  # 65 runs of 8 > MAX_UNROLLED_VECTORS
    concat = len(many.compute_dag.stages) - 2
    assert not annotation.vectorize_branch_runs(many.compute_dag.init_state(), concat)
    conv = SearchTask.from_workload("conv2d-bn-relu", TARGET)  # a padding branches along rows, not channels
    pad = conv.compute_dag.stages[0].block
    assert pad.branch_periods and pad.vars[-1].name not in dict(pad.branch_periods)


def test_checks_in_threads_propose_what_checks_one_by_one_do(monkeypatch):
    """The policy checks as many programs at once as its batch still needs (sketch/policy.py): its batches,
    and the programs it refuses, are those of checking them in order one by one."""
    import zlib
    from concurrent.futures import ThreadPoolExecutor

    from ansor.cost_model import RandomModel
    from ansor.sketch import policy as policy_module
    from ansor.sketch.policy import SketchPolicy

    task = SearchTask.from_workload("conv2d-bias-relu", target=TARGET)

    def run(pool):
        monkeypatch.setattr(policy_module, "_checkers", lambda: pool)
        policy = SketchPolicy(task, RandomModel(0), seed=5)
        check = policy.space.check  # TVM's replay, and a third of the programs refused besides (by their steps)
        policy.space = dataclasses.replace(policy.space, check=lambda t, s: "refused" if zlib.crc32(
            repr(s.key()).encode()) % 3 == 0 else check(t, s))
        return [[s.key() for s in policy.next_batch(8)] for _ in range(2)], policy.measured

    with ThreadPoolExecutor(4) as pool:
        threaded = run(pool)
    serial = run(None)
    assert threaded == serial
    assert [len(batch) for batch in serial[0]] == [8, 8] and serial[1]  # full batches, some programs refused
    assert not set(serial[0][0]) & serial[1]


def test_each_intrinsics_sketches_get_a_program_measured_whatever_the_model_prefers():
    """A model that ranks vdpbf16ps programs first (as the pretrained one, trained where no AMX existed,
    did): the first search round still holds one AMX tile program, the next rounds only what it ranks."""
    from ansor.log.measurement import MeasureInput, MeasureResult
    from ansor.sketch.policy import SketchPolicy, family

    class DotsFirst:
        def predict(self, task, states):
            return np.array([0.0 if any("amx" in f for f in family(s)) else 1.0 for s in states])

        def update(self, inputs, results):
            pass

    task = SearchTask.from_workload("bf16-matmul-512", "llvm -mcpu=sapphirerapids -num-cores=2")
    policy = SketchPolicy(task, DotsFirst(), seed=3)
    first = policy.next_batch(8)
    tiles = [s for s in first if "amx" in "".join(family(s))]
    assert len(first) == 8 and len(tiles) == 1
    policy.record([MeasureInput(task, s) for s in first], [MeasureResult((1e-3,), 0)] * len(first))
    assert not any("amx" in "".join(family(s)) for s in policy.next_batch(8))
    dots_only = SketchPolicy(SearchTask.from_workload("bf16-matmul-512", "llvm -mcpu=znver4 -num-cores=2"),
                             DotsFirst(), seed=3)
    assert {family(s) for s in dots_only.next_batch(8)} == {("ansor_avx512bf16_dot_16x2",)}
