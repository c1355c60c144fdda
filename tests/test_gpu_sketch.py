"""CUDA sketches, random annotation, mutation and the GPU validity filter, compile-checked on a CPU machine.

TVM's CUDA code generator needs no GPU, so every program here is really built for ``cuda -arch=sm_80``
(``tvm.compile``) and checked by TVM's GPU verifier; nothing runs on a GPU.
"""

import dataclasses
import random
import shutil
import subprocess

import pytest
import tvm

from ansor.state.loop_nest import AttachKind
from ansor.state.transform_steps import PragmaStep
from ansor.cost_model import RandomModel
from ansor.task.search_task import SearchTask
from ansor.sketch import search_space
from ansor.sketch.search_space import generate_sketches, sample_initial_population, space_of
from ansor.sketch.evolution import EvolutionParams, evolutionary_search
from ansor.sketch.gpu_annotation import GPU_UNROLL_STEPS, fits_gpu, thread_counts
from ansor.sketch.gpu_rules import has_cross_thread_reduction
from ansor.sketch import gpu_verify
from ansor.sketch.gpu_verify import launch_dims, verify_gpu
from ansor.sketch.policy import SketchPolicy

CUDA = "cuda -arch=sm_80"


def cuda_task(name: str) -> SearchTask:
    return SearchTask.from_workload(name, CUDA)


def test_cuda_hardware_params():
    hw = cuda_task("matmul-64").hardware_params
    assert (hw.max_threads_per_block, hw.warp_size, hw.max_vthread_extent) == (1024, 32, 8)
    assert hw.max_shared_memory_per_block == 48 * 1024 and hw.num_cores == 108  # sm_80: an A100's SMs


def test_matmul_sketch_is_ansors_single_tiled_sketch():
    """Ansor's oracle: 1 sketch; A and B read through shared memory at the outer reduction tile, the
    accumulator in a local cache written back under the thread tile, block/vthread/thread tiles bound."""
    sketches = generate_sketches(cuda_task("matmul-512"))
    assert len(sketches) == 1
    s = sketches[0]
    assert [st.name for st in s.stages] == ["A_shared", "B_shared", "C", "C_local"]
    c = s.stages[2]
    assert [it.annotation for it in c.iters[:3]] == ["blockIdx.x", "vthread", "threadIdx.x"]
    assert c.block.writes[0].buffer == "C_local"
    assert s.stages[3].attach == (2, 2)  # write-back under the thread tile
    reduce_tile = s.stages[0].attach[1]
    assert s.stages[1].attach == (2, reduce_tile) and c.iters[reduce_tile].name == "k_0"


def test_softmax_has_ansors_four_sketches():
    """Ansor's oracle: (cross-thread reduction or not) for each of the two reductions = 4 sketches."""
    sketches = generate_sketches(cuda_task("softmax-4x1024"))
    assert len(sketches) == 4
    by_ctr = sorted((has_cross_thread_reduction(s, 0), any(has_cross_thread_reduction(s, i)
                                                           for i in range(1, len(s.stages)))) for s in sketches)
    assert by_ctr == [(False, False), (False, True), (True, False), (True, True)]
    for s in sketches:  # exp is always inlined on GPU
        assert s.stages[1].compute_at == AttachKind.INLINED


@pytest.mark.parametrize("name, expected", [("max-pool2d", 1), ("conv2d-bias-relu", 1), ("matmul-relu-512", 1),
                                            ("GRP-b1", 1)])
def test_other_cuda_sketch_counts(name, expected):
    """Ansor's max_pool2d oracle is 1; the fused conv and matmul epilogues give one tiled sketch each. The
    grouped conv reads its input non-affinely: that input gets no shared copy (it used to raise)."""
    assert len(generate_sketches(cuda_task(name))) == expected


def test_fused_epilogue_reads_the_per_thread_accumulator():
    """TensorIR cannot allocate a global intermediate inside a kernel: relu must read the local cache."""
    s = generate_sketches(cuda_task("conv2d-bias-relu"))[0]
    relu = next(st for st in s.stages if st.name == "relu")
    assert relu.compute_at == AttachKind.ITER and sorted(relu.block.read_buffers()) == ["bias", "conv_local"]


# Five workloads x 24 programs = 120 states; each is built for sm_80 and verified.
POPULATION_WORKLOADS = ["matmul-512", "conv2d-nhwc-small", "softmax-4x1024", "conv2d-bias-relu", "max-pool2d"]


@pytest.mark.parametrize("name", POPULATION_WORKLOADS)
@pytest.mark.slow
def test_initial_population_builds_for_cuda_and_passes_gpu_verification(name):
    task = cuda_task(name)
    rng = random.Random(0)
    population = sample_initial_population(task, generate_sketches(task), 24, rng)
    assert len(population) >= 20 and len({s.key() for s in population}) == len(population)
    valid = 0
    for state in population:
        if verify_gpu(task, state) is None:
            tvm.compile(task.compute_dag.replay(state).mod, target=task.target)
            valid += 1
    assert valid >= 0.95 * len(population), f"{valid}/{len(population)} valid"
    for state in rng.sample(population, 5):  # the State predicts TensorIR's loops exactly
        task.compute_dag.replay(state, verify=True)


def test_fast_check_and_verifier_reject_a_block_over_the_limit():
    """A program legal at 1024 threads per block is rejected by both checks when the limit is 256."""
    task = cuda_task("matmul-512")
    rng = random.Random(2)
    population = sample_initial_population(task, generate_sketches(task), 64, rng)
    big = [s for s in population if launch_dims(s)[0]["block"][0] > 256]
    assert big
    small = dataclasses.replace(task.hardware_params, max_threads_per_block=256)
    tight = SearchTask(task.func, task.target, workload_key=task.workload_key, hardware=small)
    assert not fits_gpu(tight, big[0])
    assert verify_gpu(tight, big[0]) is not None and verify_gpu(task, big[0]) is None
    assert all(launch_dims(s)[0]["block"][0] <= 256 for s in sample_initial_population(
        tight, generate_sketches(tight), 16, rng))


def test_cooperative_fetch_uses_the_consumers_thread_count():
    task = cuda_task("matmul-512")
    state = sample_initial_population(task, generate_sketches(task), 1, random.Random(4))[0]
    threads = launch_dims(state)[0]["block"][0]
    for shared in state.stages[:2]:
        bound = [it for it in shared.iters if it.annotation == "threadIdx.x"]
        assert [it.extent for it in bound] == [threads]


def test_thread_counts():
    assert thread_counts(16, 32, 1024) == [16]
    assert thread_counts(1024, 32, 1024) == [32, 64, 128, 256, 512, 1024]
    assert 49 in thread_counts(50176, 32, 1024) and all(32 <= t <= 1024 for t in thread_counts(50176, 32, 1024))


def test_mutation_and_evolution_keep_programs_within_the_limits():
    task = cuda_task("matmul-512")
    rng = random.Random(6)
    population = sample_initial_population(task, generate_sketches(task), 32, rng)
    mutate = {m.name: m.mutate for m in search_space.CUDA.mutators}["tile_size"]
    children = [c for c in (mutate(task, s, rng) for s in population) if c is not None]
    assert children

    class MoreThreads:
        def predict(self, task, states):
            return [float(launch_dims(s)[0]["block"][0]) for s in states]

    best = evolutionary_search(task, MoreThreads(), population, 8, set(), rng)
    assert best and all(fits_gpu(task, s) for _, s in best)
    assert best[0][0] <= task.hardware_params.max_threads_per_block


def test_each_target_kind_has_one_search_space_holding_what_the_search_uses():
    """The search asks the space, never the target: CUDA's space has its own rules, sampler, mutators,
    hardware filter and check, and only the mutations that make sense on a GPU."""
    cpu, cuda = search_space.CPU, search_space.CUDA
    assert space_of(cuda_task("matmul-64").target) is cuda
    assert space_of(SearchTask.from_workload("matmul-64", "llvm -num-cores=2").target) is cpu
    assert {m.name for m in cpu.mutators} == {"tile_size", "unroll", "compute_location", "parallel", "layout_rewrite"}
    assert {m.name for m in cuda.mutators} == {"tile_size", "unroll"}  # the sketch fixes locations; no parallel
    fields = {f.name for f in dataclasses.fields(EvolutionParams)}
    assert all(set(m.probabilities) <= fields for space in (cpu, cuda) for m in space.mutators)
    params = EvolutionParams()
    unroll = {m.name: m for m in cuda.mutators}["unroll"]
    assert sum(getattr(params, p) for p in unroll.probabilities) == pytest.approx(0.09)  # Ansor's GPU share
    assert cuda.rules != cpu.rules and cuda.sample is not cpu.sample

    task = cuda_task("matmul-512")
    rng = random.Random(2)
    population = sample_initial_population(task, generate_sketches(task), 64, rng)
    unrolled = [c for c in (unroll.mutate(task, s, rng) for s in population) if c is not None]
    limits = {int(step.pragma.split("$")[1]) for c in unrolled for step in c.steps if isinstance(step, PragmaStep)}
    assert limits <= set(GPU_UNROLL_STEPS) and limits & {512, 1024}  # GPU limits, beyond the CPU's 128
    big = [s for s in population if launch_dims(s)[0]["block"][0] > 256]
    assert big
    small = dataclasses.replace(task.hardware_params, max_threads_per_block=256)
    tight = SearchTask(task.func, task.target, workload_key=task.workload_key, hardware=small)
    assert not cuda.fits(tight, big[0]) and cuda.check(tight, big[0]) is not None
    assert cuda.fits(task, big[0]) and cuda.check(task, big[0]) is None
    assert cpu.fits(tight, big[0])  # a CPU space knows no block limits


def test_policy_batches_pass_gpu_verification():
    task = cuda_task("softmax-4x1024")

    class Flat:
        def predict(self, task, states):
            return [0.0] * len(states)

    batch = SketchPolicy(task, Flat(), seed=1).next_batch(8)
    assert batch and all(verify_gpu(task, s) is None for s in batch)


@pytest.mark.slow
def test_cuda_source_compiles_with_nvcc(tmp_path):
    """The generated CUDA C is a standalone translation unit for nvcc (no GPU needed to compile)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    task = cuda_task("matmul-512")
    state = sample_initial_population(task, generate_sketches(task), 1, random.Random(8))[0]
    source = tvm.compile(task.compute_dag.replay(state).mod, target=task.target).mod.imports[0].inspect_source()
    path = tmp_path / "matmul.cu"
    path.write_text(source)
    done = subprocess.run([nvcc, "-arch=sm_80", "-c", str(path), "-o", str(tmp_path / "matmul.o")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_tuned_program_runs_correctly_on_a_gpu():
    """Runs only where a CUDA device exists: a random program must match numpy."""
    if not tvm.cuda().exist:
        pytest.skip("no CUDA device on this machine: CUDA programs are compile-checked only")
    import numpy as np

    from ansor.task import program
    from ansor.task.workloads import get_workload
    task = cuda_task("matmul-512")
    state = sample_initial_population(task, generate_sketches(task), 1, random.Random(9))[0]
    args = program.random_inputs(task, seed=1)
    got = program.run_program(program.build_program(task, state), args, device=tvm.cuda())
    np.testing.assert_allclose(got[-1], get_workload("matmul-512").reference(args[:-1])[-1], rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_tune_test_without_a_gpu_fails_with_one_line(tmp_path):
    """Sketches and sampling work for CUDA here; measurement needs a GPU node, which is a clean exit 2."""
    if tvm.cuda().exist:
        pytest.skip("this machine has a GPU: measurement would succeed")
    import os
    import sys
    log = tmp_path / "cuda.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "scripts/tune_test.py", "--wkl", "matmul-64", "--target", CUDA,
                           "--n-trials", "4", "--per-round", "4", "--log-file", str(log)],
                          capture_output=True, text=True, timeout=240, env=env)
    errors = [line for line in done.stderr.replace("\r", "\n").splitlines() if "error:" in line]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(errors) == 1 and "no GPU" in errors[0] and "Traceback" not in done.stderr


def test_final_report_of_a_cuda_program_without_a_local_gpu_is_a_note(capsys):
    """tune_test.py tuned on a cluster's GPU but ends on a machine without one: no re-timing on CPU tensors."""
    if tvm.cuda().exist:
        pytest.skip("this machine has a GPU: the program is re-timed on it")
    from ansor.cli.commands import tune_op as tune_test
    task = cuda_task("matmul-64")
    state = SketchPolicy(task, RandomModel(0), seed=0).next_batch(1)[0]
    assert tune_test.report_best(task, state, 1e-5) == 0
    out = capsys.readouterr().out
    assert "Lowered TIR" in out and "not re-timed: this machine has no CUDA device" in out



def _threaded_reductions(state) -> list[int]:
    """Extents of the reduction loops of ``state`` bound to ``threadIdx.x``."""
    return [it.extent for st in state.stages for it in st.iters
            if it.kind.name != "SPATIAL" and it.annotation == "threadIdx.x"]


@pytest.mark.parametrize("name", ["matmul-relu-1x1000x2048", "softmax-4x1024"])
def test_reductions_across_threads_become_tvm_allreduce(name):
    """A reduction loop bound to threads must reach TVM's cross-thread reduction with its initialisation
    in its block: decomposed, every thread added into one accumulator and all 12 such candidates of
    ResNet-50's classifier (1 x 2048 x 1000) computed wrong outputs on an H200. With the consumer fused
    (the classifier's bias, here relu) and without one (softmax)."""
    task = cuda_task(name)
    population = sample_initial_population(task, generate_sketches(task), 48, random.Random(3))
    threaded = [s for s in population if any(e > 1 for e in _threaded_reductions(s))][:6]
    assert threaded
    for state in threaded:
        assert verify_gpu(task, state) is None
        mod = task.compute_dag.replay(state).mod
        assert str(mod).count("tvm_thread_allreduce") == 0  # not yet: TVM's lowering makes it
        with task.target:
            lowered = gpu_verify._lowering()(mod)
        assert str(lowered).count("tvm_thread_allreduce(") >= len(_threaded_reductions(state))


def test_a_racing_reduction_across_threads_is_refused():
    """The verifier checks sizes only; a reduction bound to threads but decomposed (no allreduce) races."""
    task = cuda_task("matmul-relu-1x1000x2048")
    population = sample_initial_population(task, generate_sketches(task), 48, random.Random(3))
    state = next(s for s in population if any(e > 1 for e in _threaded_reductions(s)))
    sch = task.compute_dag.replay(state)
    block = sch.get_sblock("C")
    sch.decompose_reduction(block, sch.get_loops(block)[-2])  # the loop outside the thread-bound one
    with task.target:
        lowered = gpu_verify._lowering()(sch.mod)
    assert "would race" in gpu_verify._cross_thread_reduction_error(task, state, sch.mod, lowered)


def _global_pool_steps(threads: int, unroll: int) -> list:
    """ResNet-50's global average pool reduced across ``threads`` threads, as ansor's sketch writes it."""
    from ansor.state.transform_steps import (
        AnnotationStep, CacheWriteStep, ComputeAtStep, ComputeInlineStep, FollowSplitStep, FuseStep, SplitStep,
    )
    return [CacheWriteStep(0, "shared"), ComputeInlineStep(1), SplitStep(2, 3, 2048, (threads,), True),
            AnnotationStep(2, 4, "threadIdx.x"), ComputeAtStep(0, 2, 3), FuseStep(0, (4, 5)),
            FollowSplitStep(0, 4, 2, 1), AnnotationStep(0, 5, "threadIdx.x"), FuseStep(2, (0, 1, 2, 3)),
            AnnotationStep(2, 0, "blockIdx.x"), PragmaStep(0, 0, f"auto_unroll_max_step${unroll}")]


def test_a_reduction_across_threads_that_tvm_cannot_lower_is_refused():
    """Unrolled, the pool's allreduce is duplicated and TVM's LowerThreadAllreduce fails: 6 of 48 candidates
    failed to build on an H200 (COMPILE_DEVICE). The verifier passed them; the full lowering refuses exactly
    those. The same program unrolled less builds."""
    from tvm import te
    x = te.placeholder((1, 7, 7, 2048), name="x")
    r0, r1 = te.reduce_axis((0, 7), "r0"), te.reduce_axis((0, 7), "r1")
    total = te.compute((1, 1, 1, 2048), lambda n, h, w, c: te.sum(x[n, h * 7 + r0, w * 7 + r1, c], axis=[r0, r1]),
                       name="pool_sum")
    avg = te.compute((1, 1, 1, 2048), lambda n, h, w, c: total[n, h, w, c] / 49.0, name="pool_avg")
    task = SearchTask(te.create_prim_func([x, avg]), CUDA)
    unrolled, rolled = (task.compute_dag.state_from_steps(_global_pool_steps(16, unroll)) for unroll in (512, 16))
    assert "lowering the cross-thread reduction of pool_sum failed" in verify_gpu(task, unrolled)
    with pytest.raises(Exception, match="load_remap_"):
        tvm.compile(task.compute_dag.replay(unrolled).mod, target=task.target)
    assert verify_gpu(task, rolled) is None
    tvm.compile(task.compute_dag.replay(rolled).mod, target=task.target)
