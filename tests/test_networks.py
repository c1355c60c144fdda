"""Networks: definitions, task extraction, apply-best, default schedules, end-to-end builds, ONNX import.

The big networks are built and their tasks extracted (cheap); only the tiny CNN, MobileNet-V2 at batch 1,
a small ONNX model and a module of PrimFuncs ComputeDAG rejects are compiled and run. Timing runs in a
subprocess so ``TVM_NUM_THREADS`` is set before that process's TVM runtime starts.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from ansor.errors import AnsorError, RecordError
from ansor.state.layout_rewrite import packed_layouts
from ansor.log.measurement import MeasureResult
from ansor.networks import (
    Network, NetworkError, TensorSpec, apply_schedules, apply_history_best, build, check_against_default,
    compare_outputs, extract, get_network, load_onnx, network_names, profile_calls, schedule_task,
    time_networks,
)
from ansor.log.records import RecordWriter
from ansor.sketch.search_space import generate_sketches, sample_initial_population
from ansor.target import physical_cores

TARGET = {"kind": "llvm", "num-cores": 2}

#: (tasks, weighted task occurrences, skipped PrimFuncs) at batch size 1; see docs/networks.md.
EXPECTED = {
    "resnet-50": (39, 82, 1),
    "mobilenet-v2": (32, 54, 1),
    "resnet3d-18": (21, 23, 1),
    "bert": (9, 110, 7),
    "dcgan": (5, 5, 1),
    "tiny-cnn": (7, 7, 1),
}


@pytest.fixture(scope="module")
def extractions():
    """Every registered network at batch 1, extracted once for the module (about 3 s in all)."""
    return {name: (get_network(name, 1), extract(get_network(name, 1), TARGET)) for name in network_names()}


def _parallel_and_vector(func: tvm.tirx.PrimFunc) -> tuple[bool, bool]:
    text = func.script()
    return "T.parallel(" in text, "T.vectorized(" in text


# ---------------------------------------------------------------------------------------------- registry
def test_registry_lists_ansor_networks():
    assert set(EXPECTED) == set(network_names())


def test_unknown_network_lists_valid_names():
    with pytest.raises(NetworkError) as info:
        get_network("resnet-51", 1)
    message = str(info.value)
    assert isinstance(info.value, AnsorError) and "\n" not in message
    assert "resnet-51" in message and all(name in message for name in network_names())


def test_bad_batch_size():
    with pytest.raises(NetworkError, match="batch size"):
        get_network("tiny-cnn", 0)


def test_weights_are_seeded_and_match_the_module():
    a, b = get_network("tiny-cnn", 1), get_network("tiny-cnn", 1)
    func = a.mod[a.entry]
    assert len(func.params) == len(a.inputs) + len(a.weights)
    for spec in a.weights:
        value = a.params[spec.name]
        assert value.shape == spec.shape and str(value.dtype) == spec.dtype
        np.testing.assert_array_equal(value, b.params[spec.name])
    assert np.all(np.isfinite(a.weight_arrays()[0]))


# ---------------------------------------------------------------------------------------------- extraction
@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.slow
def test_network_extracts_expected_tasks(extractions, name):
    net, ex = extractions[name]
    n_tasks, n_weighted, n_skipped = EXPECTED[name]
    assert (len(ex.tasks), ex.total_weight, len(ex.skipped)) == (n_tasks, n_weighted, n_skipped), ex.summary()
    keys = [t.workload_key for t in ex.tasks]
    assert len(set(keys)) == len(keys)
    assert len({t.name for t in ex.tasks}) == len(ex.tasks)
    module_funcs = {gv.name_hint for gv, f in ex.mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    for t in ex.tasks:
        assert t.weight >= 1 and t.task.flop_ct > 0 and set(t.global_vars) <= module_funcs
        assert t.task.desc == t.name and "[" in t.name
    assert net.inputs[0].shape[0] == 1


@pytest.mark.slow
def test_task_names_and_weights_resnet50(extractions):
    _, ex = extractions["resnet-50"]
    by_name = {t.name: t for t in ex.tasks}
    conv = by_name["fused_conv2d_add_relu [1,56,56,256]x[1,1,256,64]"]
    assert conv.weight == 2  # the first 1x1 convolution of the first stage's second and third blocks
    assert conv.task.flop_ct == pytest.approx(2 * 56 * 56 * 256 * 64, rel=0.01)
    # The first stage's three 3x3 convolutions are Winograd products: 16 of 28 x 28 tiles x 64 x 64.
    product = by_name["matmul [16,784,64]x[16,64,64]"]
    assert product.weight == 3 and product.task.flop_ct == pytest.approx(2 * 16 * 784 * 64 * 64, rel=0.01)
    assert by_name["winograd_input [1,56,56,64]"].weight == 3
    # 53 convolutions, of which the 13 3x3 stride-1 ones are Winograd (the 3 stride-2 ones stay direct)
    assert sum(t.weight for t in ex.tasks if "conv2d" in t.name) == 40
    assert sum(t.weight for t in ex.tasks if t.name.startswith("fused_winograd_output_add_relu")) == 13


@pytest.mark.slow
def test_bert_copies_are_skipped_not_tasks(extractions):
    _, ex = extractions["bert"]
    reasons = {s.name.split(" ")[0]: s.reason for s in ex.skipped}
    assert "floating-point" in reasons["take"] and "reshape" in reasons["reshape"]
    names = {t.name.split(" ")[0] for t in ex.tasks}
    assert {"fast_softmax", "layer_norm"} <= names  # fast math: softmax's exp and GELU vectorize
    assert any(n.startswith("fused_matmul_add") and "fast_gelu" in n for n in names)  # GELU fused into the dense


@pytest.mark.parametrize("name", ["resnet-50", "bert"])
@pytest.mark.slow
def test_batch_16_extracts_the_same_structure(extractions, name):
    tasks = extract(get_network(name, 16), TARGET).tasks
    n_tasks, n_weighted, _ = EXPECTED[name]
    assert (len(tasks), sum(t.weight for t in tasks)) == (n_tasks, n_weighted)
    batch_dim = "[16," if name == "resnet-50" else "[2048,"  # BERT's dense layers see batch * 128 tokens
    assert any(batch_dim in t.name for t in tasks)


# ---------------------------------------------------------------------------------------------- apply-best
@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.slow
def test_default_schedule_is_parallel_and_vectorized(extractions, name):
    _, ex = extractions[name]
    mod = apply_schedules(ex.mod, ex.tasks, {}, target=TARGET)
    for t in ex.tasks:
        for gv in t.global_vars:
            # a Winograd input transform too: its non-affine tile indices do not use the channel loop
            assert _parallel_and_vector(mod[gv]) == (True, True), f"{t.name}\n{mod[gv].script()}"
            assert dict(mod[gv].attrs)["tirx.noalias"] and "global_symbol" not in mod[gv].attrs
    for s in ex.skipped:
        if "reshape" in s.reason:  # left alone, so the VM can make the reshape a view
            assert mod[s.global_vars[0]].same_as(ex.mod[s.global_vars[0]])
        else:
            assert _parallel_and_vector(mod[s.global_vars[0]])[0], s.name


@pytest.mark.slow
def test_tuned_tiny_cnn_matches_default_build(extractions):
    net, ex = extractions["tiny-cnn"]
    for seed in range(2):
        rng = random.Random(seed)
        schedules = {}
        for t in ex.tasks:
            states = sample_initial_population(t.task, generate_sketches(t.task), 3, rng)
            assert states, t.name
            schedules[t.workload_key] = states[-1]
        tuned = apply_schedules(ex.mod, ex.tasks, schedules, target=TARGET)
        for t in ex.tasks:
            want = schedule_task(t.task, schedules[t.workload_key]).kernel  # weights are constants: packed
            assert tvm_ffi.structural_equal(tuned[t.global_vars[0]].body, want.body)
        comparison = check_against_default(ex, tuned, TARGET)
        assert comparison.ok, comparison


def test_builds_timed_in_turn_get_a_timing_each(extractions):
    net, ex = extractions["tiny-cnn"]
    default = build(apply_schedules(ex.mod, ex.tasks, {}, target=TARGET), TARGET)
    naive = {t.workload_key: t.task.compute_dag.init_state() for t in ex.tasks}
    serial = build(apply_schedules(ex.mod, ex.tasks, naive, target=TARGET), TARGET)
    timings = time_networks([default, serial], ex.network, target=TARGET, repeat=3, min_repeat_ms=1)
    assert [t.repeats for t in timings] == [3, 3]
    assert all(0 < t.min_ms <= t.median_ms <= t.max_ms and t.min_ms <= t.mean_ms <= t.max_ms for t in timings)


@pytest.mark.timing
@pytest.mark.slow
def test_call_profile_times_every_kernel_call_of_an_inference():
    """The in-place profile sees each task's kernels as often as the network calls them, and nothing the
    network does not call; a kernel doing more work shows as more milliseconds. Every task keeps its
    initial (serial, unvectorized) loop nest: parallel kernels this small take a few microseconds each
    whatever their work, the thread pool's wake-up dominating them (on a Zen 5, tiny-cnn's largest task
    ran faster than its smallest one). Its own extraction: the module's fixture extracts every network
    (~10 s), and this test runs in the timing pass, alone."""
    ex = extract(get_network("tiny-cnn", 1), TARGET)
    naive = {t.workload_key: t.task.compute_dag.init_state() for t in ex.tasks}
    exe = build(apply_schedules(ex.mod, ex.tasks, naive, target=TARGET), TARGET)
    profile = profile_calls(exe, ex.network, target=TARGET, repeat=3)
    kernels = {name: n for name, n in profile.calls.items() if not name.startswith("vm.builtin")}
    assert kernels == {gv: 1 for t in ex.tasks for gv in t.global_vars}
    assert all(profile.ms[name] > 0 for name in kernels) and profile.latency_ms > 0
    assert "vm.builtin.alloc_tensor" in profile.calls
    conv = max(ex.tasks, key=lambda t: t.task.flop_ct)
    pool = min(ex.tasks, key=lambda t: t.task.flop_ct)
    assert profile.ms[conv.global_vars[0]] > profile.ms[pool.global_vars[0]]


@pytest.mark.slow
def test_weights_are_packed_once_at_build_time(extractions):
    """Tuned convolutions and the dense layer read packed constant weights. apply_schedules packs each weight
    once: the kernels hold no packing block, the calls pass constants in the packed layout, and the
    result is unchanged."""
    net, ex = extractions["tiny-cnn"]
    rng = random.Random(4)
    schedules = {t.workload_key: sample_initial_population(t.task, generate_sketches(t.task), 1, rng)[0]
                 for t in ex.tasks}
    packed = {t.global_vars[0]: layouts for t in ex.tasks
              if (layouts := packed_layouts(schedules[t.workload_key]))}
    assert len(packed) >= 2  # both convolutions (and the dense layer) read constant weights
    tuned = apply_schedules(ex.mod, ex.tasks, schedules, target=TARGET)
    for name, layouts in packed.items():
        kernel = tuned[name]  # takes the weight packed: the packing block is gone from it
        assert all(tuple(int(d) for d in kernel.params[lay.index].shape) == lay.packed_shape for lay in layouts)
        calls = _calls(tuned[ex.network.entry], name)
        assert calls and all(tuple(args[lay.index].ty.shape) == lay.packed_shape for args in calls for lay in layouts)
    assert check_against_default(ex, tuned, TARGET).ok


def _calls(func, name: str) -> list[list]:
    found = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir" \
                and expr.args[0].name_hint == name:
            found.append(list(expr.args[1].fields))

    relax.analysis.post_order_visit(func, visit)
    return found


@pytest.mark.slow
def test_mobilenet_default_build_matches_untuned_build(extractions):
    net, ex = extractions["mobilenet-v2"]
    default = build(apply_schedules(ex.mod, ex.tasks, {}, target=TARGET), TARGET)
    untuned = build(net.mod, TARGET, fused=False)
    comparison = compare_outputs(ex.network, default, untuned, TARGET, reference_network=net)
    assert comparison.ok and comparison.scale > 0, comparison


@pytest.mark.slow
def test_apply_schedules_rejects_tasks_of_another_module(extractions):
    _, ex = extractions["tiny-cnn"]
    other = extract(get_network("tiny-cnn", 2), TARGET)
    with pytest.raises(NetworkError, match="differs"):
        apply_schedules(ex.mod, other.tasks, {})


@pytest.mark.slow
def test_apply_history_best_takes_the_fastest_record(extractions, tmp_path):
    net, ex = extractions["tiny-cnn"]
    log = tmp_path / "tiny.json"
    chosen = {}
    with RecordWriter(log) as writer:
        for t in ex.tasks[:2]:
            states = sample_initial_population(t.task, generate_sketches(t.task), 2, random.Random(1))
            for cost, state in zip((2e-3, 1e-3), states):
                writer.write_record(t.task, state.steps, MeasureResult((cost,), 0))
            chosen[t.workload_key] = states[-1]
    mod = apply_history_best(ex.mod, ex.tasks, log, target=TARGET)
    for t in ex.tasks[:2]:
        want = schedule_task(t.task, chosen[t.workload_key]).kernel
        assert tvm_ffi.structural_equal(mod[t.global_vars[0]].body, want.body)
    assert _parallel_and_vector(mod[ex.tasks[2].global_vars[0]]) == (True, True)  # not in the log: default
    assert check_against_default(ex, mod, TARGET).ok
    with pytest.raises(RecordError):
        apply_history_best(ex.mod, ex.tasks, tmp_path / "missing.json")


def _rejected_network() -> Network:
    """group_norm and argmax (multi-store reduction blocks) and scatter (no root block): ComputeDAG rejects."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    idx = relax.Var("idx", relax.TensorType((4, 2), "int64"))
    gamma = relax.Var("gamma", relax.TensorType((16,), "float32"))
    beta = relax.Var("beta", relax.TensorType((16,), "float32"))
    with bb.function("main", [x, idx, gamma, beta], attrs={"num_input": 2}):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.group_norm(x, gamma, beta, 4, 1, [2, 3]))
            top = bb.emit(relax.op.argmax(relax.op.reshape(y, (16, 64)), axis=1))
            scattered = bb.emit(relax.op.scatter_elements(relax.op.reshape(y, (4, 256)), idx,
                                                          relax.op.zeros((4, 2), "float32"), axis=1))
            out = bb.emit_output(relax.Tuple([top, scattered]))
        bb.emit_func_output(out)
    rng = np.random.default_rng(0)
    weights = {"gamma": rng.uniform(0.5, 1.5, 16).astype("float32"), "beta": rng.normal(size=16).astype("float32")}
    return Network("rejected-ops", bb.get(), (TensorSpec("x", (1, 16, 8, 8), "float32"),
                                              TensorSpec("idx", (4, 2), "int64")),
                   (TensorSpec("gamma", (16,), "float32"), TensorSpec("beta", (16,), "float32")), 1, "NCHW",
                   param_factory=lambda: weights)


def _copy_funcs() -> dict[str, tvm.tirx.PrimFunc]:
    """BERT's attention copies in miniature: K's transpose, the q/k/v split of a reshape, a reshape of a
    transpose (its index divides the innermost loop by 64), and an add (it computes)."""
    from tvm import te, topi

    k = te.placeholder((128, 12, 64), name="k")
    qkv = te.placeholder((128, 2304), name="qkv")
    heads = te.placeholder((12, 128, 64), name="heads")
    b = te.placeholder((128, 768), name="b")
    c = te.placeholder((128, 768), name="c")
    split = topi.split(topi.reshape(qkv, (128, 3, 12, 64)), 3, axis=1)
    return {
        "transpose": te.create_prim_func([k, topi.transpose(k, (1, 2, 0))]),
        "split": te.create_prim_func([qkv, *split]),
        "transpose_reshape": te.create_prim_func([heads, topi.reshape(topi.transpose(heads, (1, 0, 2)), (128, 768))]),
        "add": te.create_prim_func([b, c, topi.add(b, c)]),
    }


def test_copy_schedule_tiles_a_transpose_and_vectorizes_a_split_and_a_transposed_reshape():
    from ansor.task.program import arg_specs, run_program
    from ansor.networks import copy_schedule
    from ansor.task.search_task import SearchTask

    funcs = _copy_funcs()
    scheduled = {name: copy_schedule(f, 2, 32) for name, f in funcs.items()}
    assert scheduled["add"] is None  # it computes: the State default's case
    transpose = scheduled["transpose"].script()
    # 8 x 8 tiles (AVX2: 8 float lanes): the output's innermost loop unrolled, the input's vectorized
    assert "T.vectorized(8)" in transpose and "T.unroll(8)" in transpose and "T.parallel(" in transpose
    split = scheduled["split"].script()
    assert "T_reshape" not in split and split.count("T.vectorized(64)") == 3  # reshape inlined, no scalar copy
    # [s, c] reads heads[c // 64, s, c % 64]: c split by 64, then a contiguous 64-wide copy
    assert "T.vectorized(64)" in scheduled["transpose_reshape"].script()
    rng = np.random.default_rng(0)
    for name in ("transpose", "split", "transpose_reshape"):
        args = [rng.random(shape, dtype="float32") for shape, _ in arg_specs(SearchTask(funcs[name], "llvm"))]
        want, got = (run_program(_compile(f), args) for f in (funcs[name], scheduled[name]))
        assert all(np.array_equal(w, g) for w, g in zip(want, got)), name


def test_a_transpose_with_a_long_strided_innermost_loop_is_vectorized_in_pieces():
    """ConvNeXt's [1,768,7,7] -> [1,7,7,768]: no lanes x lanes tiles fit (7 is no multiple of the lanes), so
    the innermost loop is vectorized; all 768 at once was one LLVM vector LLVM took over 15 minutes on."""
    import re
    import time

    from tvm import te, topi

    from ansor.task.program import run_program
    from ansor.networks import copy_schedule
    from ansor.sketch.annotation import MAX_VECTORIZE_LANES

    x = te.placeholder((1, 768, 7, 7), name="x")
    func = te.create_prim_func([x, topi.transpose(x, (0, 2, 3, 1))])
    scheduled = copy_schedule(func, 2, 64)
    widths = [int(w) for w in re.findall(r"T\.vectorized\((\d+)\)", scheduled.script())]
    assert widths and max(widths) <= MAX_VECTORIZE_LANES and "T.parallel(" in scheduled.script()
    start = time.monotonic()
    module = _compile(scheduled)
    assert time.monotonic() - start < 60
    arg = np.random.default_rng(0).random((1, 768, 7, 7), dtype="float32")
    assert np.array_equal(run_program(module, [arg, np.zeros((1, 7, 7, 768), "float32")])[-1], arg.transpose(0, 2, 3, 1))


def test_a_channel_shuffle_with_a_concatenate_is_one_vectorized_pass():
    """ShuffleNet-V2's blocks end in concatenate, reshape, transpose, reshape (the shuffle stays NCHW while
    its branches run NHWC): untuned, each intermediate was a whole buffer of its own, 13 such functions 0.42 ms
    of its 1.80. Now it is one parallel, vectorized pass that picks each element from its input."""
    from tvm import te, topi

    from ansor.task.program import run_program
    from ansor.networks import copy_schedule

    kept = te.placeholder((1, 8, 6, 6), name="kept")  # NCHW
    branch = te.placeholder((1, 6, 6, 8), name="branch")  # NHWC, out of a convolution
    joined = topi.concatenate([kept, topi.transpose(branch, (0, 3, 1, 2))], axis=1)
    shuffled = topi.reshape(topi.transpose(topi.reshape(joined, (1, 2, 8, 6, 6)), (0, 2, 1, 3, 4)), (1, 16, 6, 6))
    func = te.create_prim_func([kept, branch, shuffled])
    scheduled = copy_schedule(func, 2, 32)
    assert scheduled is not None
    script = scheduled.script()
    assert "T_concat" not in script and "T_transpose" not in script  # inlined: no intermediate buffer
    assert "T.parallel(" in script and "T.vectorized(6)" in script
    rng = np.random.default_rng(0)
    a, b = rng.random((1, 8, 6, 6), dtype="float32"), rng.random((1, 6, 6, 8), dtype="float32")
    want = np.concatenate([a, b.transpose(0, 3, 1, 2)], 1).reshape(1, 2, 8, 6, 6).transpose(0, 2, 1, 3, 4)
    got = run_program(_compile(scheduled), [a, b, np.zeros((1, 16, 6, 6), "float32")])[-1]
    assert np.array_equal(got, want.reshape(1, 16, 6, 6))


def test_a_concatenate_is_vectorized_in_runs_that_each_read_one_input():
    """Inception-style channel concatenations (NHWC): a vector whose lanes come from two inputs is a gather
    in LLVM. The inputs' channel counts share a period (here 32): vectors of it, their runs unrolled, each
    read one input. Without a shared period above 1 the loop is vectorized as before."""
    from tvm import te, topi

    from ansor.task.program import run_program
    from ansor.networks import copy_schedule

    rng = np.random.default_rng(0)
    for channels, runs in (((64, 96, 32, 32), 'T.unroll(7)'), ((3, 5), None)):
        parts = [te.placeholder((1, 5, 5, c), name=f"x{k}") for k, c in enumerate(channels)]
        scheduled = copy_schedule(te.create_prim_func([*parts, topi.concatenate(parts, axis=3)]), 2, 32)
        script = scheduled.script()
        assert "T.parallel(" in script
        if runs:
            assert runs in script and "T.vectorized(32)" in script
        else:
            assert "T.unroll(" not in script and "T.vectorized(8)" in script
        args = [rng.random((1, 5, 5, c), dtype="float32") for c in channels]
        got = run_program(_compile(scheduled), [*args, np.zeros((1, 5, 5, sum(channels)), "float32")])[-1]
        assert np.array_equal(got, np.concatenate(args, 3))


def _compile(func: tvm.tirx.PrimFunc) -> tvm.runtime.Module:
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm").jit()


def test_primfuncs_compute_dag_rejects_get_a_tir_default():
    net = _rejected_network()
    ex = extract(net, TARGET)
    reasons = {s.name.split(" ")[0]: s.reason for s in ex.skipped}
    assert not ex.tasks
    assert "single-store" in reasons["group_norm"] and "single-store" in reasons["argmax"]
    assert "root" in reasons["scatter_elements"]
    mod = apply_schedules(ex.mod, ex.tasks, {}, target=TARGET)
    for s in ex.skipped:
        if "reshape" not in s.reason:
            assert _parallel_and_vector(mod[s.global_vars[0]])[0], s.name
    comparison = compare_outputs(ex.network, build(mod, TARGET), build(net.mod, TARGET, fused=False), TARGET,
                                 reference_network=net)
    assert comparison.ok, comparison


@pytest.mark.skipif(tvm.get_global_func("target.build.cuda", allow_missing=True) is None,
                    reason="this TVM build has no CUDA code generator")
def test_cuda_default_build_compiles():
    """No GPU is needed to compile: untuned PrimFuncs get dlight's GPU rules (threads bound) and build."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host={"kind": "llvm"})
    ex = extract(get_network("tiny-cnn", 1), target)
    mod = apply_schedules(ex.mod, ex.tasks, {}, target=target)
    assert all("blockIdx" in mod[t.global_vars[0]].script() for t in ex.tasks)
    build(mod, target)


# ---------------------------------------------------------------------------------------------- timing
_TIMING_SCRIPT = textwrap.dedent("""
    import json, sys
    from ansor.networks import apply_schedules, build, extract, get_network, time_network
    target = {"kind": "llvm", "num-cores": int(sys.argv[1])}
    net = get_network("tiny-cnn", 1)
    ex = extract(net, target)
    default = time_network(build(apply_schedules(ex.mod, ex.tasks, {}, target=target), target), ex.network, target=target,
                           repeat=5, min_repeat_ms=50)
    untuned = time_network(build(net.mod, target, fused=False), net, target=target, repeat=5, min_repeat_ms=50)
    print(json.dumps({"default": default.__dict__, "untuned": untuned.__dict__}))
""")


@pytest.mark.timing
@pytest.mark.slow
def test_default_build_is_faster_than_untuned_build():
    cores = physical_cores()
    env = {**os.environ, "TVM_NUM_THREADS": str(cores)}
    proc = subprocess.run([sys.executable, "-c", _TIMING_SCRIPT, str(cores)], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    default, untuned = result["default"], result["untuned"]
    print(f"tiny-cnn b1, {cores} threads: default {default['median_ms']:.3f} ms, "
          f"untuned {untuned['median_ms']:.3f} ms")
    assert default["num_threads"] == untuned["num_threads"] == cores
    assert set(default) >= {"mean_ms", "median_ms", "max_ms", "min_ms", "std_ms"}
    assert default["min_ms"] <= default["median_ms"] <= default["max_ms"]
    assert default["median_ms"] < untuned["median_ms"]


# ---------------------------------------------------------------------------------------------- ONNX
def _tiny_onnx(path) -> None:
    onnx = pytest.importorskip("onnx", reason="the onnx package is not installed (pip install 'ansor[onnx]')")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "B"),
             numpy_helper.from_array((rng.standard_normal((512, 10)) * 0.05).astype(np.float32), "FW"),
             numpy_helper.from_array(np.zeros(10, np.float32), "FB")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "FW", "FB"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_onnx_model_imports_extracts_and_runs(tmp_path):
    path = tmp_path / "tiny.onnx"
    _tiny_onnx(path)
    net = load_onnx(path, shapes={"x": (2, 3, 16, 16)})
    assert net.name == "tiny" and net.batch_size == 2
    assert net.inputs == (TensorSpec("x", (2, 3, 16, 16), "float32"),)
    assert [w.name for w in net.weights] == ["W", "B", "FW", "FB"]
    ex = extract(net, TARGET)
    # Convolution and pooling run in NHWC (transposes at the model's edges); weights are constants.
    assert sorted(t.name for t in ex.tasks) == ["fused_conv2d_add_relu [2,16,16,3]x[3,3,3,8]",
                                               "fused_matmul_add [2,512]x[512,10]", "max_pool2d [2,16,16,8]"]
    assert ex.network.layout == "NHWC" and ex.network.weights == () and ex.network.inputs == net.inputs
    mod = apply_schedules(ex.mod, ex.tasks, {}, target=TARGET)
    comparison = compare_outputs(ex.network, build(mod, TARGET), build(net.mod, TARGET, fused=False), TARGET,
                                 reference_network=net)
    assert comparison.ok, comparison
    assert load_onnx(path).inputs[0].shape == (1, 3, 16, 16)  # symbolic batch: 1 unless overridden


def test_onnx_relu6_converts_to_nhwc_without_transposes_inside(tmp_path):
    """PyTorch exports ReLU6 as Clip with constant bounds; TVM imports that as opaque TIR calls. Prepared,
    they are Relax operators again, so the whole model runs in NHWC with transposes at its edges only."""
    onnx = pytest.importorskip("onnx", reason="the onnx package is not installed (pip install 'ansor[onnx]')")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)
             for name, shape in (("W1", (8, 3, 3, 3)), ("B1", (8,)), ("W2", (4, 8, 1, 1)), ("B2", (4,)))]
    const = lambda name, v: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(  # noqa: E731
        np.array(v, np.float32)))
    nodes = [const("lo", 0.0), const("hi", 6.0),
             helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"]),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["y"])]
    graph = helper.make_graph(nodes, "relu6", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    path = tmp_path / "relu6.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    net = load_onnx(path)
    assert net.mod[net.entry].script().count("R.call_tir") == 4  # TVM's import: Clip as TIR calls
    ex = extract(net, TARGET)
    text = ex.network.mod[ex.network.entry].script()
    assert text.count("R.permute_dims") == 2 and "R.call_tir" not in text  # data in, result out
    assert text.count("R.maximum") == 2 and text.count("R.minimum") == 2
    mod = apply_schedules(ex.mod, ex.tasks, {}, target=TARGET)
    comparison = compare_outputs(ex.network, build(mod, TARGET), build(net.mod, TARGET, fused=False), TARGET,
                                 reference_network=net)
    assert comparison.ok and comparison.scale > 0, comparison


def test_onnx_missing_or_invalid_file_is_one_line(tmp_path):
    pytest.importorskip("onnx", reason="the onnx package is not installed (pip install 'ansor[onnx]')")
    missing = tmp_path / "missing.onnx"
    invalid = tmp_path / "invalid.onnx"
    invalid.write_bytes(b"\x08\x07this is not a protobuf model\xff\xff")
    for path, words in ((missing, "no such"), (invalid, "not a valid ONNX model")):
        with pytest.raises(NetworkError) as info:
            load_onnx(path)
        assert "\n" not in str(info.value) and str(path) in str(info.value) and words in str(info.value)


def test_onnx_unknown_input_override(tmp_path):
    path = tmp_path / "tiny.onnx"
    _tiny_onnx(path)
    with pytest.raises(NetworkError, match="no input named y"):
        load_onnx(path, shapes={"y": (1, 10)})


def test_onnx_package_missing_is_a_network_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)  # makes ``import onnx`` fail
    with pytest.raises(NetworkError, match="pip install"):
        load_onnx(tmp_path / "model.onnx")


def test_ncdhw_convolutions_become_channels_last():
    """A video CNN's NCDHW convolution is tuned in NDHWC with DHWIO weights, as 2D ones are in NHWC (R3D-18's
    default build: 4.2 s in NCDHW, 0.22 s so); the network still computes the same outputs."""
    x = relax.Var("x", relax.TensorType((1, 8, 4, 10, 10), "float32"))
    w = relax.Var("w", relax.TensorType((16, 8, 3, 3, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv3d(x, w, padding=1)))
        bb.emit_func_output(out)
    rng = np.random.default_rng(0)
    spec = TensorSpec("w", (16, 8, 3, 3, 3), "float32")
    net = Network("c3d", bb.get(), (TensorSpec("x", (1, 8, 4, 10, 10), "float32"),), (spec,), 1, "NCHW",
                  param_factory=lambda: {"w": rng.standard_normal(spec.shape).astype("float32")})
    ex = extract(net, TARGET)
    assert [t.name for t in ex.tasks] == ["fused_conv3d_relu [1,4,10,10,8]x[3,3,3,8,16]"]
    executable = build(apply_schedules(ex.mod, ex.tasks, {}, target=TARGET), TARGET)
    comparison = compare_outputs(ex.network, executable, build(net.mod, TARGET, fused=False), TARGET,
                                 reference_network=net)
    assert comparison.ok, comparison
