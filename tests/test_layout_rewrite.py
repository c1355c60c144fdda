"""Layout rewrite (LR steps): packed layouts follow the loops, and packed programs compute the same answer."""

import random

import numpy as np
import pytest

from ansor.task import program
from ansor.errors import StepError
from ansor.state.layout_rewrite import PREPROC_ANNOTATION, pack_arguments, packable_arguments, packed_layout
from ansor.task.search_task import SearchTask
from ansor.sketch.search_space import generate_sketches, sample_initial_population
from ansor.task.workloads import get_workload

TARGET = "llvm -num-cores=2"  # this CPU: the programs run here


def weights_constant(name: str, *weights: int) -> SearchTask:
    """The workload with the given arguments marked as constants, as a network's weights are."""
    task = SearchTask.from_workload(name, TARGET)
    return SearchTask(task.func.with_attr("layout_free_buffers", list(weights)), TARGET,
                      workload_key=f"{name}-const")


def tiled_matmul(task: SearchTask, pack: bool):
    """i -> 8 x 2 x 4, j -> 2 x 2 x 16 (64 = 1 x 2 x 2 x 16), k -> 4 x 16; write-back at j0."""
    s = task.compute_dag.init_state()
    s.cache_write(0, "local")
    s.split(0, 0, [2, 1, 4])
    s.split(0, 4, [2, 1, 16])
    s.split(0, 8, [16])
    s.reorder(0, [0, 4, 1, 5, 8, 2, 6, 9, 3, 7])
    s.compute_at(1, 0, 1)
    s.fuse(0, [0, 1])
    s.annotate(0, 0, "parallel")
    s.annotate(0, 8, "vectorize")
    if pack:
        s.layout_rewrite(0, "B")
    return s


def test_packed_layout_is_the_loop_order_of_the_tiles():
    task = SearchTask.from_workload("matmul-64", TARGET)
    state = tiled_matmul(task, pack=True)
    layout = packed_layout(state, 0, "B")
    # Loops that index B[k, j], outer to inner: j0 (in the fused parallel loop), j1, k0, k1, j3 (unit tiles
    # are left out): B'[j0, j1, k0, k1, j3].
    assert layout.packed_shape == (2, 2, 4, 16, 16)
    b = np.arange(64 * 64, dtype="float32").reshape(64, 64)
    packed = layout.pack(b)
    assert packed[1, 0, 2, 3, 5] == b[2 * 16 + 3, 1 * 32 + 0 * 16 + 5]
    assert sorted(packed.ravel()) == sorted(b.ravel())


def test_runtime_input_packed_in_the_kernel_gives_the_same_answer():
    task = SearchTask.from_workload("matmul-64", TARGET)
    args = program.random_inputs(task, seed=3)
    want = args[0] @ args[1]
    state = tiled_matmul(task, pack=True)
    mod = program.schedule(task, state)
    assert "B_global" in mod.script() and PREPROC_ANNOTATION not in mod.script()  # an in-kernel copy
    got = program.run_program(program.build_program(task, state), args)[-1]
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert program.kernel(task, state)[1] == []  # nothing is pre-packed: the kernel takes B as given


def test_constant_weight_is_prepacked_outside_the_measured_kernel():
    task = weights_constant("matmul-64", 1)
    args = program.random_inputs(task, seed=4)
    want = args[0] @ args[1]
    state = tiled_matmul(task, pack=True)
    assert PREPROC_ANNOTATION in program.schedule(task, state).script()
    # The scheduled module packs B itself (a network build folds that block away) ...
    np.testing.assert_allclose(program.run_program(program.build_program(task, state), args)[-1], want, rtol=1e-4)
    # ... the measured kernel takes B packed.
    module, layouts = program.build_kernel(task, state)
    assert [(lay.param, lay.index, lay.packed_shape) for lay in layouts] == [("B", 1, (2, 2, 4, 16, 16))]
    np.testing.assert_allclose(program.run_program(module, pack_arguments(layouts, args))[-1], want, rtol=1e-4)


def test_which_arguments_can_be_packed():
    runtime = tiled_matmul(SearchTask.from_workload("matmul-64", TARGET), pack=False)
    assert packable_arguments(runtime, 0) == ["B"]  # A[i, k] is broadcast along j: nothing to gain
    constants = tiled_matmul(weights_constant("matmul-64", 0, 1), pack=False)
    assert packable_arguments(constants, 0) == ["A", "B"]
    with pytest.raises(StepError, match="does not read an argument named 'C'"):
        runtime.layout_rewrite(0, "C")


@pytest.mark.parametrize("name", ["conv2d-nhwc-small", "conv2d-bias-relu"])
def test_random_programs_with_packed_conv_weights_are_correct(name):
    """Random annotation always packs a constant weight; every program's pre-packed kernel is right."""
    task = weights_constant(name, 1)
    wl = get_workload(name)
    states = sample_initial_population(task, generate_sketches(task), 6, random.Random(2))
    packed = [s for s in states if any(stage.packed for stage in s.stages)]
    assert packed, "constant weights of tiled stages are always packed"
    args = program.random_inputs(task, seed=5)
    want = wl.reference(args[:-1])[-1]
    for state in packed[:3]:
        module, layouts = program.build_kernel(task, state)
        assert [lay.param for lay in layouts] == [task.compute_dag.param_names[1]]
        got = program.run_program(module, pack_arguments(layouts, args))[-1]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
