"""bf16 products in the search: a sketch whose innermost tile is the bf16 dot product, programs sampled,
mutated, measured and replayed from a log like any other.

On a CPU without AVX512_BF16 the sketch uses the intrinsic's portable form (the same layouts and loops in
fp32 code), so every program here is really built, run and checked on any machine; for an explicit
AVX512_BF16 target the same programs are compiled and their assembly holds ``vdpbf16ps``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te

import ansor
from ansor import codegen
from ansor.errors import StepError, WorkloadError
from ansor.host_cpu import host_cpu
from ansor.log.records import load_records
from ansor.sketch.rules import CPU_RULES, derive_sketches
from ansor.sketch.search_space import generate_sketches, sample_initial_population
from ansor.state.tensor_intrin import TENSORIZE, BF16Intrin
from ansor.task import program
from ansor.task.precision import Precision, in_precision, workload_in
from ansor.task.search_task import SearchTask
from ansor.task.te_ops import matmul_stage
from ansor.task.workloads import get_workload

PORTABLE = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # AVX2: no bf16 unit
AVX512_BF16 = {"kind": "llvm", "mcpu": "znver4", "mtriple": "x86_64-linux-gnu", "num-cores": 2}


def tensorized(state) -> list[str]:
    return [it.annotation[len(TENSORIZE):] for st in state.stages for it in st.iters
            if it.annotation.startswith(TENSORIZE)]


def operands(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.1, 1.0, (n, n)).astype(np.float32) for _ in range(2)]


def test_a_bf16_product_has_one_sketch_around_the_dot_product():
    task = SearchTask.from_workload("bf16-matmul-128", PORTABLE)
    [sketch] = generate_sketches(task)
    assert tensorized(sketch) == [BF16Intrin.PORTABLE_DOT_16x2.value]
    product = next(st for st in sketch.stages if st.name == "C")
    assert [(it.extent, it.kind.value) for it in product.iters[-2:]] == [(16, "S"), (2, "R")]
    assert {st.name for st in sketch.stages} == {"A16", "B16", "C"}  # the operands' conversions stay
    native = SearchTask.from_workload("bf16-matmul-128", AVX512_BF16)
    assert tensorized(generate_sketches(native)[0]) == [BF16Intrin.AVX512_DOT_16x2.value]


def test_fp32_sketches_are_what_the_cpu_rules_alone_derive():
    for name in ("matmul-128", "C2D-b1", "softmax-4x1024"):
        task = SearchTask.from_workload(name, PORTABLE)
        assert [s.key() for s in generate_sketches(task)] == [s.key() for s in derive_sketches(task, CPU_RULES)]


def test_sampled_programs_compute_the_bf16_product():
    task = SearchTask.from_workload("bf16-matmul-64", PORTABLE)
    states = sample_initial_population(task, generate_sketches(task), 6, random.Random(0))
    assert len(states) >= 4 and all(tensorized(s) for s in states)
    a, b = operands(64)
    want = get_workload("bf16-matmul-64").reference([a, b])[0]
    fp32 = a.astype(np.float64) @ b
    for state in states:
        c = tvm.runtime.tensor(np.zeros((64, 64), np.float32))
        program.build_program(task, state)["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
        got = c.numpy()
        assert np.abs(got - want).max() <= 64 * 2.0 ** -24 * np.abs(want).max()  # only the fp32 sums' order
        assert np.abs(got - fp32).max() > 1e-4  # and the inputs were rounded to bf16


def test_programs_for_an_avx512_bf16_target_use_vdpbf16ps():
    task = SearchTask.from_workload("bf16-matmul-128", AVX512_BF16)
    for state in sample_initial_population(task, generate_sketches(task), 3, random.Random(1)):
        asm = codegen.compile(program.schedule(task, state), task.target).mod.inspect_source("asm")
        assert "vdpbf16ps" in asm


def test_an_operand_of_a_tensorized_product_is_never_inlined():
    task = SearchTask.from_workload("bf16-matmul-64", PORTABLE)
    sketch = generate_sketches(task)[0]
    a16 = next(k for k, st in enumerate(sketch.stages) if st.name == "A16")
    with pytest.raises(StepError, match="tensorized"):
        sketch.copy().compute_inline(a16)


def test_a_tensorize_step_checks_the_loops_it_replaces():
    task = SearchTask.from_workload("bf16-matmul-64", PORTABLE)
    state = task.compute_dag.init_state()
    c = next(k for k, st in enumerate(state.stages) if st.name == "C")
    with pytest.raises(StepError, match="innermost loops must be exactly"):
        state.tensorize(c, 1, BF16Intrin.AVX512_DOT_16x2.value)


def test_bf16_workloads_and_their_names():
    assert workload_in("matmul-512", Precision.BF16) == "bf16-matmul-512"
    assert workload_in("matmul-512", Precision.FP32) == "matmul-512"
    with pytest.raises(WorkloadError, match="no bf16 form"):
        workload_in("C2D-b1", Precision.BF16)
    with pytest.raises(WorkloadError, match="multiple of 16"):
        get_workload("bf16-matmul-100")


def fp32_matmul(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> tvm.tirx.PrimFunc:
    a, b = te.placeholder(shape_a, "float32", name="X"), te.placeholder(shape_b, "float32", name="Y")
    return te.create_prim_func([a, b, matmul_stage(a, b, name="Z")])


def test_a_matmul_primfunc_in_bf16_is_the_bf16_workload():
    bf16 = in_precision(fp32_matmul((64, 96), (96, 32)), Precision.BF16)
    assert tvm_ffi.structural_equal(bf16, SearchTask.from_workload("bf16-matmul-64x32x96", PORTABLE).func)
    batched = in_precision(fp32_matmul((3, 8, 4), (3, 4, 16)), Precision.BF16)
    assert [tuple(int(d) for d in p.shape) for p in batched.params] == [(3, 8, 4), (3, 4, 16),
                                                                                         (3, 8, 16)]
    fp32 = fp32_matmul((8, 8), (8, 16))
    assert in_precision(fp32, Precision.FP32) is fp32
    with pytest.raises(WorkloadError, match="multiple of 16"):
        in_precision(fp32_matmul((8, 8), (8, 40)), Precision.BF16)
    with pytest.raises(WorkloadError, match="one float32 matmul"):  # a matmul with an epilogue is not one
        in_precision(SearchTask.from_workload("matmul-relu-64", PORTABLE).func, Precision.BF16)
    with pytest.raises(WorkloadError, match="choices: fp32, bf16"):
        ansor.tune(fp32, PORTABLE, precision="fp16")


@pytest.mark.slow
def test_tuning_a_bf16_product_measures_checks_and_replays(tmp_path, local_ray):
    """``ansor.tune(..., precision="bf16")`` on a matmul: measured with the real builder and runner (each
    candidate checked against the unscheduled bf16 program), mutated by the evolutionary search, logged, and
    replayed from the log."""
    log = tmp_path / "bf16.json"
    options = ansor.TuningOptions(num_measure_trials=16, num_measures_per_round=8, pretrained=False)
    result = ansor.tune(fp32_matmul((64, 64), (64, 64)), PORTABLE, options=options, log_file=log, precision="bf16")
    task = result.task
    assert tvm_ffi.structural_equal(task.func, SearchTask.from_workload("bf16-matmul-64", PORTABLE).func)
    records = load_records(log)
    assert result.best_state is not None and len(records) == 16  # two rounds: sampled, then evolved
    assert sum(r.result.ok for r in records) >= 13, [r.result.error_msg for r in records if not r.result.ok][:3]
    best = ansor.best_record(task, log)
    assert tensorized(best.state)
    a, b = operands(64, seed=3)
    c = tvm.runtime.tensor(np.zeros((64, 64), np.float32))
    tvm.compile(ansor.apply_best(task, log), target=task.target)["main"](
        tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    want = get_workload("bf16-matmul-64").reference([a, b])[0]
    assert np.abs(c.numpy() - want).max() <= 64 * 2.0 ** -24 * np.abs(want).max()


def test_precision_bf16_on_a_cpu_without_the_unit_is_one_error_line():
    if "avx512_bf16" in host_cpu().flags:
        pytest.skip("this CPU has AVX512_BF16: --precision bf16 tunes here")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "ansor", "tune-op", "--wkl", "matmul-512", "--precision", "bf16",
                           "--n-trials", "4"], capture_output=True, text=True, timeout=120, env=env)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "avx512_bf16" in errors[0] and "this CPU" in errors[0] and "Traceback" not in proc.stderr
