"""The loop state and its two interpreters, on real TVM programs.

Four hand-written schedules together use all 14 steps; each is replayed onto s_tir (checking every
loop extent against the pure-Python state), compiled for llvm, run, and compared with numpy.
"""

import random
import re

import numpy as np
import pytest
import tvm

from ansor import StepError
from ansor.task import program
from ansor.state.access import IterKind
from ansor.state.loop_nest import AttachKind
from ansor.state.loop_state import State
from ansor.task.search_task import SearchTask
from ansor.state.transform_steps import step_from_json, steps_to_json
from ansor.task.workloads import get_workload


def matmul_512(s: State) -> None:
    s.cache_write(0, "local")                       # CHW: C computes into C_local; write-back is stage 1
    s.split(0, 0, [4, 8])                           # SP  i -> i_0 i_1 i_2           (step 1)
    s.split(0, 3, [2, 16])                          # SP  j -> j_0 j_1 j_2           (step 2)
    s.split(0, 6, [4])                              # SP  k -> k_0 k_1
    s.reorder(0, [0, 3, 1, 4, 6, 2, 7, 5])          # RE  i_0 j_0 i_1 j_1 k_0 i_2 k_1 j_2
    s.compute_at(1, 0, 1)                           # CA  write-back under j_0 (reverse_compute_at)
    s.follow_split(1, 1, 2, 2)                      # FSP write-back's j follows step 2
    s.annotate(1, 3, "vectorize")
    s.fuse(0, [0, 1])                               # FU
    s.annotate(0, 0, "parallel")                    # AN
    s.annotate(0, 6, "vectorize")
    s.annotate(0, 5, "unroll")
    s.pragma(0, 0, "auto_unroll_max_step$16")       # PR


def conv2d_nhwc(s: State) -> None:
    s.cache_read(1, "kernel", "global")             # CHR kernel_global becomes stage 1, conv stage 2
    s.split(2, 1, [7])                              # SP  h -> h_0 h_1               (step 1)
    s.split(2, 4, [16])                             # SP  co -> co_0 co_1            (step 2)
    s.reorder(2, [0, 1, 4, 3, 6, 7, 8, 2, 5])       # n h_0 co_0 w rh rw rc h_1 co_1
    s.compute_at(0, 2, 3)                           # CA  padding under w (compute_at)
    s.compute_at(1, 2, 2)                           # CA  kernel copy under co_0
    s.fuse(1, [0, 1, 2, 3])
    s.follow_fused_split(1, 0, [2], 0, True)        # FFSP split the copy by step 2's co_1 length
    s.annotate(1, 1, "vectorize")
    s.fuse(2, [0, 1, 2])
    s.annotate(2, 0, "parallel")
    s.annotate(2, 6, "vectorize")


def softmax(s: State) -> None:
    s.split(0, 1, [16])                             # maxelem k -> k_0 k_1
    s.rfactor(0, 2, 1)                              # RF  maxelem_rf (stage 0) + maxelem (stage 1)
    s.annotate(0, 2, "vectorize")
    s.storage_align(0, 0, 32, 1)                    # SA  pad the rf buffer's row stride
    s.compute_root(1)                               # CR
    s.compute_inline(2)                             # CI  exp into its two consumers
    s.compute_at(3, 4, 0)                           # expsum under norm's row loop
    s.split(4, 1, [16])
    s.annotate(4, 2, "vectorize")
    s.annotate(4, 0, "parallel")


def conv2d_bias_relu(s: State) -> None:
    s.compute_inline(2)                             # bias_add into relu
    s.compute_inline(0)                             # padding into conv
    s.split(1, 1, [7])
    s.split(1, 4, [16])
    s.reorder(1, [0, 1, 3, 4, 6, 7, 8, 2, 5])       # n h_0 w co_0 rh rw rc h_1 co_1
    s.compute_at(3, 1, 3)                           # relu fused under co_0
    s.fuse(1, [0, 1, 2])
    s.annotate(1, 0, "parallel")
    s.annotate(1, 6, "unroll")
    s.annotate(3, 3, "vectorize")


CASES = {
    "matmul-512": matmul_512,
    "conv2d-nhwc-small": conv2d_nhwc,
    "softmax-4x1024": softmax,
    "conv2d-bias-relu": conv2d_bias_relu,
}


def scheduled(name: str) -> tuple[SearchTask, State]:
    task = SearchTask.from_workload(name)
    state = task.compute_dag.init_state()
    CASES[name](state)
    return task, state


def test_cases_use_all_14_steps():
    tags = {type(step).TAG for name in CASES for step in scheduled(name)[1].steps}
    assert tags == {"SP", "FSP", "FFSP", "RE", "FU", "AN", "PR", "SA", "CA", "CI", "CR", "CHR", "CHW", "RF"}


@pytest.mark.parametrize("name", list(CASES))
def test_replay_compiles_and_matches_numpy(name):
    task, state = scheduled(name)
    task.compute_dag.replay(state, verify=True)  # every loop extent agrees with the State
    module = program.build_program(task, state)
    args = program.random_inputs(task, seed=1)
    expected = get_workload(name).reference(args[: len(args) - 1])
    got = program.run_program(module, args)
    np.testing.assert_allclose(got[-1], expected[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_json_round_trip_replays_to_the_same_program(name):
    task, state = scheduled(name)
    again = task.compute_dag.init_state().with_steps([step_from_json(j) for j in steps_to_json(state.steps)])
    assert again.key() == state.key()
    assert str(again) == str(state)
    tvm.ir.assert_structural_equal(task.compute_dag.replay(state).mod, task.compute_dag.replay(again).mod)


def test_extents_follow_bound_inference():
    _, s = scheduled("conv2d-nhwc-small")
    assert [it.extent for it in s.stages[0].iters] == [1, 9, 3, 16]  # 7 rows + 3-tap window - 1
    assert [it.extent for it in s.stages[1].iters] == [144, 16]  # 3*3*16*16 kernel values, split by 16
    _, s = scheduled("conv2d-bias-relu")
    assert [it.extent for it in s.stages[3].iters] == [1, 7, 1, 16]


def test_stage_ids_shift_after_chr_chw_rf():
    task = SearchTask.from_workload("conv2d-bias-relu")
    s = task.compute_dag.init_state()
    s.compute_inline(2)
    s.compute_at(3, 1, 3)  # relu under conv's co loop
    with pytest.raises(StepError, match="add caches and rfactors before compute_at"):
        s.copy().cache_write(1, "local")
    s.cache_read(0, "data", "global")  # a new stage 0 shifts every later id, attach points included
    assert [st.name for st in s.stages] == ["data_global", "pad", "conv", "bias_add", "relu"]
    assert s.stages[4].attach == (2, 3)
    s.cache_write(1, "local")  # the write-back lands right after pad, before conv
    assert [st.name for st in s.stages] == ["data_global", "pad", "pad_local", "conv", "bias_add", "relu"]
    assert s.stages[5].attach == (3, 3)
    assert s.stages[1].block.writes[0].buffer == "pad_local"
    task.compute_dag.replay(s, verify=True)
    s2 = SearchTask.from_workload("softmax-4x1024").compute_dag.init_state()
    s2.compute_at(2, 3, 0)  # expsum under norm, then an rfactor before both
    s2.split(0, 1, [16])
    s2.rfactor(0, 2, 1)
    assert [st.name for st in s2.stages][:3] == ["T_softmax_maxelem_rf", "T_softmax_maxelem", "T_softmax_exp"]
    assert s2.stages[3].attach == (4, 0)
    assert [(it.name, it.kind) for it in s2.stages[0].iters] == [("i", IterKind.SPATIAL), ("k_0", IterKind.REDUCE), ("k_1", IterKind.SPATIAL)]
    assert [(it.name, it.kind) for it in s2.stages[1].iters] == [("i", IterKind.SPATIAL), ("k_1", IterKind.REDUCE)]
    s2.storage_align(0, 0, 16, 1)
    s2.compute_at(0, 1, 0)
    assert [it.extent for it in s2.stages[0].iters] == [16, 1, 64]  # rf var, i, remaining k_0
    s2.compute_root(1)
    SearchTask.from_workload("softmax-4x1024").compute_dag.replay(s2, verify=True)


def test_attach_follows_split_and_blocks_illegal_moves():
    s = SearchTask.from_workload("matmul-relu-64").compute_dag.init_state()
    s.compute_at(1, 0, 0)  # relu under matmul's i loop (after the reduction)
    assert s.stages[1].compute_at == AttachKind.ITER
    s.split(0, 0, [8])     # i -> i_0 i_1: relu now sits under i_1
    assert s.stages[1].attach == (0, 1)
    with pytest.raises(StepError, match="in between the loops"):
        s.copy().fuse(0, [1, 2])
    with pytest.raises(StepError, match="cannot move it back to the root"):
        s.copy().compute_root(1)
    with pytest.raises(StepError, match="computed at its loops"):
        s.copy().compute_at(0, 1, 0)
    s.copy().with_steps(s.steps)  # the same steps rebuild the same state


def test_a_loop_with_a_stage_computed_inside_it_is_not_vectorized():
    """TVM 0.27 vectorizes such a loop into wrong values (every such Winograd output transform in five
    ResNet-50 tunings was WRONG_ANSWER), so neither order of the two steps is accepted."""
    task = SearchTask.from_workload("matmul-relu-64")
    s = task.compute_dag.init_state()
    s.compute_at(0, 1, 1)  # matmul computed under relu's j loop
    with pytest.raises(StepError, match="cannot vectorize iterator 1 .* is computed inside it"):
        s.copy().annotate(1, 1, "vectorize")
    s.split(1, 1, [16])    # j -> j_0 j_1: matmul now sits under j_1
    assert s.stages[0].attach == (1, 2)
    with pytest.raises(StepError, match="is computed inside it"):
        s.copy().annotate(1, 2, "vectorize")
    ok = task.compute_dag.init_state()
    ok.annotate(1, 1, "vectorize")
    with pytest.raises(StepError, match="it is vectorized"):
        ok.copy().compute_at(0, 1, 1)
    ok.compute_at(0, 1, 0)  # under i, outside the vectorized loop: fine
    task.compute_dag.replay(ok, verify=True)


def test_a_reduction_is_computed_under_the_loop_of_all_its_consumers():
    """A softmax's max feeds its exponentials' sum and the normalization: once the sum is computed under
    the normalization's row loop, the max can be too (ahead of it), and the whole softmax is one parallel
    loop over rows. While the sum stays at the root the move is refused, naming it."""
    task = SearchTask.from_workload("softmax-64x128", "llvm -num-cores=2")
    s = task.compute_dag.init_state()
    ids = {st.name: i for i, st in enumerate(s.stages)}
    maxelem, expsum, norm = ids["T_softmax_maxelem"], ids["T_softmax_expsum"], ids["T_softmax_norm"]
    s.compute_inline(ids["T_softmax_exp"])
    with pytest.raises(StepError, match=re.escape(f"other consumers ([{expsum}])")):
        s.copy().compute_at(maxelem, norm, 0)
    s.compute_at(expsum, norm, 0)
    s.compute_at(maxelem, norm, 0)
    assert [it.extent for it in s.stages[maxelem].iters] == [1, 128]  # one row, all its columns
    s.annotate(norm, 0, "parallel")
    s.annotate(norm, 1, "vectorize")
    mod = task.compute_dag.replay(s, verify=True).mod
    assert mod.script().count("T.parallel(") == 1
    args = program.random_inputs(task, seed=1)
    got = program.run_program(program.build_program(task, s), args)
    want = get_workload("softmax-64x128").reference(args[:-1])[-1]
    np.testing.assert_allclose(got[-1], want, rtol=1e-5, atol=1e-6)


def test_inline_rewrites_consumer_accesses():
    s = SearchTask.from_workload("conv2d-bias-relu").compute_dag.init_state()
    s.compute_inline(2)
    assert s.stages[2].compute_at == AttachKind.INLINED
    assert sorted(s.stages[3].block.read_buffers()) == ["bias", "conv"]
    assert s.consumers(1) == [3] and s.producers(3) == [1]


def test_unfilled_split_cannot_replay():
    task = SearchTask.from_workload("matmul-64")
    s = task.compute_dag.init_state()
    s.split(0, 0, [None, 8])
    assert [it.extent for it in s.stages[0].iters][:3] == [None, None, 8]
    with pytest.raises(StepError, match="unfilled split"):
        task.compute_dag.replay(s)


def test_copy_is_independent():
    s = SearchTask.from_workload("matmul-64").compute_dag.init_state()
    c = s.copy()
    c.split(0, 0, [8])
    assert len(s.stages[0].iters) == 3 and len(c.stages[0].iters) == 4 and s.steps == []


def test_an_edited_step_list_replays_only_from_the_edit(monkeypatch):
    """``with_steps`` starts from the state's structure after the steps the edit kept; the result equals a
    replay from the start, and the state it came from is unchanged."""
    from ansor.state.transform_steps import SplitStep

    task, s = scheduled("matmul-512")
    before = (list(s.stages), s.shapes)
    steps = list(s.steps)
    assert steps[3] == SplitStep(0, 6, 512, (4,), True)
    steps[3] = SplitStep(0, 6, 512, (8,), True)
    applied, apply = [], State.apply

    def counted(state: State, step) -> None:
        applied.append(step)
        apply(state, step)

    monkeypatch.setattr(State, "apply", counted)
    edited = s.with_steps(steps)
    assert applied == steps[3:]
    monkeypatch.undo()
    fresh = State.initial(task.compute_dag)
    for step in steps:
        fresh.apply(step)
    assert (edited.stages, edited.shapes, edited.steps) == (fresh.stages, fresh.shapes, fresh.steps)
    assert [it.extent for it in edited.stages[0].iters][-2:] == [8, 16]  # k_1 is 8 long now
    assert (s.stages, s.shapes) == before


@pytest.mark.parametrize("target", ["llvm -mcpu=skylake-avx512 -num-cores=4", "cuda -arch=sm_80"])
def test_mutated_programs_equal_their_replay_from_the_start(target):
    """Every mutation rule of the target's search, on sampled programs: the child's structure (replayed from
    its parent's kept steps) is the structure its steps give from the initial state."""
    from ansor.sketch.search_space import generate_sketches, sample_initial_population, space_of

    task = SearchTask.from_workload("conv2d-bias-relu", target=target)
    rng = random.Random(3)
    population = sample_initial_population(task, generate_sketches(task), 8, rng)
    children = 0
    for mutator in space_of(task.target).mutators:
        for parent in population:
            child = mutator.mutate(task, parent, rng)
            if child is None:
                continue
            fresh = State.initial(task.compute_dag)
            for step in child.steps:
                fresh.apply(step)
            assert (child.stages, child.shapes) == (fresh.stages, fresh.shapes), mutator.name
            children += 1
    assert children >= len(population)


def test_to_code_and_print_name_the_loops():
    task, s = scheduled("matmul-512")
    code = s.to_code()
    assert "sch.cache_write(C, 0, \"local\")" in code and "sch.reverse_compute_at(C_local" in code
    assert "sch.parallel(C_i_0_j_0_fused)" in code
    text = str(s)
    assert "parallel i_0_j_0_fused (0,256)" in text and "vectorize j_2 (0,16)" in text


def _random_steps(task: SearchTask, rng: random.Random, n: int) -> State:
    """Random structural steps; the State rejects what it knows to be illegal."""
    s = task.compute_dag.init_state()
    for _ in range(n):
        live = [i for i, st in enumerate(s.stages) if st.compute_at != AttachKind.INLINED and st.iters]
        sid = rng.choice(live)
        st = s.stages[sid]
        op = rng.choice(["split", "split", "reorder", "fuse", "ca", "inline", "cw"])
        trial = s.copy()
        try:
            if op == "split":
                k = rng.randrange(len(st.iters))
                ext = st.iters[k].extent or 1
                divisors = [d for d in range(1, ext + 1) if ext % d == 0]
                trial.split(sid, k, [rng.choice(divisors)])
            elif op == "reorder":
                order = list(range(len(st.iters)))
                rng.shuffle(order)
                trial.reorder(sid, order)
            elif op == "fuse" and len(st.iters) > 1:
                k = rng.randrange(len(st.iters) - 1)
                trial.fuse(sid, [k, k + 1])
            elif op == "ca":
                others = trial.consumers(sid) + trial.producers(sid)
                if others:
                    t = rng.choice(others)
                    trial.compute_at(sid, t, rng.randrange(len(trial.stages[t].iters)))
            elif op == "inline":
                trial.compute_inline(sid)
            elif op == "cw" and st.compute_at == AttachKind.ROOT and len(s.stages) < 6:
                trial.cache_write(sid, "local")
        except StepError:
            continue
        s = trial
    return s


@pytest.mark.parametrize("name", ["matmul-relu-64", "conv2d-bias-relu", "softmax-4x1024"])
def test_random_step_sequences_agree_with_tensorir(name):
    """Whatever structural steps the State accepts, TensorIR accepts too, with identical loop nests."""
    task = SearchTask.from_workload(name)
    rng = random.Random(7)
    n_steps = 0
    for _ in range(60):
        state = _random_steps(task, rng, 8)
        task.compute_dag.replay(state, verify=True)
        n_steps += len(state.steps)
    assert n_steps >= 60 * 4  # the generator really exercised the interpreters


@pytest.mark.parametrize("lanes, pieces", [(24, "T.unroll(3)"), (48, "T.unroll(3)"), (16, None)])
def test_a_vectorized_loop_is_replayed_in_power_of_two_vectors(lanes, pieces):
    """TVM vectorizes a 24-lane loop as one vector built from scalar loads (BERT's dense layers in 4 x 24
    register blocks ran 10x slower than in 4 x 16); replay vectorizes it as 3 unrolled vectors of 8 (48: of
    16). The State keeps the one loop the search sees; the program computes the same."""
    task = SearchTask.from_workload(f"matmul-8x{2 * lanes}x8", "llvm")
    s = task.compute_dag.init_state()
    s.split(0, 1, [lanes])                          # i j_0 j_1 k
    s.reorder(0, [0, 1, 3, 2])                      # i j_0 k j_1
    s.annotate(0, 3, "vectorize")
    assert [it.annotation for it in s.stages[0].iters][-1] == "vectorize" and len(s.stages[0].iters) == 4
    text = task.compute_dag.replay(s, verify=True).mod.script()
    piece = lanes & -lanes
    if pieces is None:
        assert f"T.vectorized({lanes})" in text and "T.unroll(" not in text
    else:
        assert f"T.vectorized({lanes})" not in text and f"T.vectorized({piece})" in text and pieces in text
    a, b = (np.random.default_rng(0).random(shape, dtype="float32") for shape in ((8, 8), (8, 2 * lanes)))
    c = program.run_program(program.build_program(task, s), [a, b, np.zeros((8, 2 * lanes), "float32")])[2]
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)
