"""The correctness check: wrong outputs of any size are rejected, reordered fp32 reductions are not, and a
task whose reference cannot be computed is measured with every result saying it was not checked."""

import logging
import random

import numpy as np
import pytest
import ray
from tvm import te

from ansor.task import program
from ansor.cost_model import RandomModel
from ansor.measure import ErrorNo, ProgramMeasurer
from ansor.measure.builder import build_program
from ansor.measure.check import output_mismatch
from ansor.measure.runner import RunConfig, Runner
from ansor.measure.shipping import ship, task_key
from ansor.task.search_task import SearchTask
from ansor.sketch.policy import SketchPolicy
from ansor.state.tensor_intrin import round_to_bf16

# Slow tier: runs on a real local Ray (started once, ~4 s) and times real candidates.
pytestmark = pytest.mark.slow

TARGET = "llvm -num-cores=2"


def candidates(task: SearchTask, n: int) -> list:
    """``n`` random programs of ``task`` drawn from all its sketches (what a search measures first)."""
    return SketchPolicy(task, RandomModel(0), seed=0).next_batch(n)


def test_scaled_outputs_fail_and_reordered_reductions_pass():
    for name in ("softmax-4x1024", "conv2d-nhwc-small", "matmul-128"):
        task = SearchTask.from_workload(name, TARGET)
        args = program.random_inputs(task)
        want = program.run_program(program.build_program(task, None), args)
        for state in candidates(task, 4):  # tiled, unrolled, vectorized, rfactor-ed: reductions reordered
            got = program.run_program(program.build_program(task, state), args)
            assert output_mismatch(got, want) == "", (name, state.steps)
        for factor in (0.5, 1.5):
            scaled = want[:-1] + [want[-1] * np.float32(factor)]
            assert "wrong answer" in output_mismatch(scaled, want), (name, factor)

    # Why the tolerance must scale: softmax-4x1024 outputs are ~1e-3, and the former fixed tolerance
    # (rtol = atol = 1e-3) took half of them for the real thing.
    softmax = SearchTask.from_workload("softmax-4x1024", TARGET)
    out = program.run_program(program.build_program(softmax, None), program.random_inputs(softmax))[-1]
    assert out.max() < 2e-3 and np.allclose(out * 0.5, out, rtol=1e-3, atol=1e-3)


def test_bf16_bits_are_compared_as_the_numbers_they_hold():
    """A stored bf16 activation computed in another order may round an element to the neighbouring bf16 value
    (one unit of the bits, or a sign near zero): that passes; the same activation 5 % larger does not."""
    values = np.random.default_rng(0).uniform(-1, 1, (64, 16)).astype(np.float32)
    values[0, 0] = 1e-6
    want = round_to_bf16(values)
    got = want.copy()
    got[1, 2] += 1  # the neighbouring bf16 value
    got[0, 0] = round_to_bf16(np.array([-1e-6], np.float32))[0]  # its other sign: bits 0x8000 apart
    assert output_mismatch([got], [want]) == ""
    assert "wrong answer" in output_mismatch([round_to_bf16(values * np.float32(1.05))], [want])


def test_the_reference_is_the_unscheduled_program_on_every_core():
    """The measurer's reference runs each block's leading spatial loops, fused, in parallel: the unscheduled
    program's bits, no loop of a reduction iterator among them, nothing changed for a GPU task."""
    import tvm

    from ansor import codegen

    for name in ("softmax-4x1024", "conv2d-nhwc-small", "matmul-128"):  # padding, epilogues, row reductions
        task = SearchTask.from_workload(name, TARGET)
        ref = program.reference(task)
        sch = tvm.s_tir.Schedule(ref)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        for block_rv in blocks:
            loops = [sch.get(loop) for loop in sch.get_loops(block_rv)]
            block, realize = sch.get(block_rv), loops[-1].body
            reducing = [var for iv, value in zip(block.iter_vars, realize.iter_values)
                        if iv.iter_type != tvm.tirx.IterVar.DataPar
                        for var in tvm.tirx.analysis.undefined_vars(value)]
            assert loops[0].kind == tvm.tirx.ForKind.PARALLEL, (name, ref.script())
            assert not any(v.same_as(loop.loop_var) for loop in loops if loop.kind == tvm.tirx.ForKind.PARALLEL
                           for v in reducing), (name, ref.script())
        assert blocks, name
        args = program.random_inputs(task)
        want = program.run_program(program.build_program(task, None), args)
        got = program.run_program(codegen.compile(ref, task.target).jit(), args)
        assert all(np.array_equal(g, w) for g, w in zip(got, want)), name
    cuda = SearchTask.from_workload("matmul-128", "cuda")
    assert program.reference(cuda).same_as(cuda.compute_dag.mod)


def test_a_block_parallel_loops_could_race_in_stays_serial():
    """Hand-written TIR the search accepts, where parallel loops would not be safe or TVM refuses them: a
    store that leaves out a spatial iterator (two iterations write one element), an opaque iterator, a loop
    not starting at 0 (TVM cannot fuse it). Each reference stays the serial program and builds."""
    from tvm.script import tirx as T

    @T.prim_func(check_well_formed=False)
    def last_row(a: T.Buffer((64, 32)), c: T.Buffer((32,))):
        with T.sblock("root"):
            for i, j in T.grid(64, 32):
                with T.sblock("C"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    c[vj] = a[vi, vj]

    @T.prim_func(check_well_formed=False)
    def opaque(a: T.Buffer((64, 32)), c: T.Buffer((64, 32))):
        with T.sblock("root"):
            for i, j in T.grid(64, 32):
                with T.sblock("C"):
                    vi, vj = T.axis.opaque(64, i), T.axis.spatial(32, j)
                    c[vi, vj] = a[vi, vj] * T.float32(2)

    @T.prim_func(check_well_formed=False)
    def from_one(a: T.Buffer((64, 32)), c: T.Buffer((64, 32))):
        with T.sblock("root"):
            for i in range(1, 65):
                for j in range(32):
                    with T.sblock("C"):
                        vi, vj = T.axis.spatial(64, i - 1), T.axis.spatial(32, j)
                        c[vi, vj] = a[vi, vj] + T.float32(1)

    for func in (last_row, opaque, from_one):
        task = SearchTask(func, TARGET)
        assert "T.parallel" not in program.reference(task).script(), func
        assert build_program(task, None).error_no == ErrorNo.NO_ERROR, func


def scaled_softmax(m: int, n: int, factor: float):
    """Softmax whose result is multiplied by ``factor``: a deliberately wrong program for the real one."""
    a = te.placeholder((m, n), name="A")
    k = te.reduce_axis((0, n), name="k")
    top = te.compute((m,), lambda i: te.max(a[i, k], axis=k), name="T_softmax_maxelem")
    e = te.compute((m, n), lambda i, j: te.exp(a[i, j] - top[i]), name="T_softmax_exp")
    k2 = te.reduce_axis((0, n), name="k2")
    total = te.compute((m,), lambda i: te.sum(e[i, k2], axis=k2), name="T_softmax_expsum")
    out = te.compute((m, n), lambda i, j: e[i, j] / total[i] * factor, name="T_softmax_norm")
    return te.create_prim_func([a, out])


def test_the_runner_rejects_a_scaled_softmax(local_ray):
    """End to end in a real runner actor: the reference is the real softmax, the candidate is built from a
    softmax whose output is halved (or 1.5x), and a real scheduled softmax passes the same check."""
    task = SearchTask.from_workload("softmax-4x1024", TARGET)
    handle = ship([task])[task_key(task)]
    runner = ray.remote(Runner).options(num_cpus=0).remote("cpu")
    reference = ray.get(runner.reference.remote(handle, build_program(task, None).lib))
    assert reference.error_no == ErrorNo.NO_ERROR, reference.error_msg
    outputs = (ray.put(reference.outputs),)
    config = RunConfig(min_repeat_ms=1)
    try:
        for factor in (0.5, 1.5):
            wrong = build_program(SearchTask(scaled_softmax(4, 1024, factor), TARGET), None)
            reply = ray.get(runner.run.remote(handle, wrong.lib, outputs, config))
            assert reply.error_no == ErrorNo.WRONG_ANSWER and "wrong answer" in reply.error_msg, reply
        right = build_program(task, random.Random(1).choice(candidates(task, 4)).steps)
        reply = ray.get(runner.run.remote(handle, right.lib, outputs, config))
        assert reply.error_no == ErrorNo.NO_ERROR, reply.error_msg
    finally:
        ray.kill(runner)


def test_a_failed_reference_is_retried_then_its_results_say_unchecked(local_ray, caplog, matmul_inputs):
    """The unscheduled matmul-256 (naive loops, tens of ms) cannot finish in 5 ms: its reference run times
    out, is retried once on a fresh runner, times out again, and the candidates are timed unchecked."""
    task = SearchTask.from_workload("matmul-256", TARGET)
    seen = []
    with caplog.at_level(logging.INFO, logger="ansor"), \
            ProgramMeasurer(reference_timeout=0.005, min_repeat_ms=1, callbacks=[lambda i, r: seen.extend(r)]) as m:
        results = m.measure(matmul_inputs(task, 2))
        references = [s for s in m.spans if s.kind == "reference"]
        again = m.measure(matmul_inputs(task, 3)[2:])  # given up for the session: no third attempt
        assert not [s for s in m.spans if s.kind == "reference"]
    assert len(references) == 2, references
    assert all(r.ok and not r.checked for r in results + again), results + again
    assert [r.checked for r in seen] == [False] * 3
    assert "trying once more on a fresh runner" in caplog.text and "marked unchecked" in caplog.text
