"""The shipped pretrained cost model and schedule database: they load, rank held-out programs better than
chance, seed a task with steps that fit it, and a seeded search is not worse than a cold one."""

import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import te

import ansor
import ansor.target
from ansor.cost_model import XGBModel, load_model
from ansor.cost_model.pretrained import add_to_database, pretrain, pretrained_model
from ansor.cost_model.training import evaluate, to_measure_pairs
from ansor.errors import RecordError, StepError
from ansor.log.measurement import ErrorNo, MeasureInput, MeasureResult
from ansor.measure import ProgramMeasurer
from ansor.host_cpu import MachineFacts, host_machine
from ansor.log.records import RecordWriter, distill, load_records
from ansor.log.seeds import (
    Kinship, ScheduleDatabase, constant_reads, core_signature, refit, seed_states, signature,
)
from ansor.sketch.search_space import generate_sketches, sample_initial_population, space_of
from ansor.state.loop_nest import AttachKind
from ansor.state.transform_steps.layout import LayoutRewriteStep
from ansor.state.transform_steps.split import SplitStep
from ansor.state.transform_steps.placement import ComputeAtStep
from ansor.state.transform_steps.stages import CacheWriteStep
from ansor.task.workloads import register_workload
from ansor.target import parse_target, physical_cores, shipped_file
from ansor.tuning import TuningOptions, make_cost_model

ROOT = Path(__file__).resolve().parents[1]
#: Records of two ViT-B/16 tasks (a model the shipped files were not trained on), measured on AVX-512.
HELD_OUT = ROOT / "tests" / "data" / "held_out_vit.json"
AVX2 = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}
CUDA = {"kind": "cuda", "arch": "sm_80"}


def ok(cost: float) -> MeasureResult:
    return MeasureResult((cost,), ErrorNo.NO_ERROR, all_cost=0.1, timestamp=1.7e9)


def tiled(task, a: int, b: int):
    s = task.compute_dag.init_state()
    s.split(0, 0, [a])
    s.split(0, 2, [b])
    s.reorder(0, [0, 2, 4, 1, 3])
    s.annotate(0, 4, "vectorize")
    return s


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """An empty directory standing in for the package's ansor/data."""
    monkeypatch.setattr(ansor.target, "DATA_DIR", tmp_path / "data")
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


def test_the_package_ships_both_files_for_cpu_and_none_for_cuda():
    cpu = parse_target(AVX2)
    assert shipped_file(cpu, "model.npz") is not None and shipped_file(cpu, "schedules.json") is not None
    assert shipped_file(parse_target(CUDA), "model.npz") is None
    assert make_cost_model(TuningOptions(), cpu).prior is not None
    assert make_cost_model(TuningOptions(pretrained=False), cpu).prior is None
    assert make_cost_model(TuningOptions(), parse_target(CUDA)).prior is None


def test_the_shipped_model_ranks_held_out_programs_better_than_chance():
    inputs, results = to_measure_pairs(load_records(HELD_OUT))
    assert len({inp.task.workload_key for inp in inputs}) == 2 and len(inputs) >= 100
    shipped = evaluate(pretrained_model(inputs[0].task.target), inputs, results)
    cold = evaluate(XGBModel(seed=0), inputs, results)  # untrained: random scores
    assert shipped.pairwise_accuracy >= 0.6, shipped  # 0.618 here; 0.615 over all of the held-out ViT log
    assert abs(cold.pairwise_accuracy - 0.5) < 0.05, cold


def test_a_damaged_shipped_model_means_a_cold_start_with_a_warning(data_dir, caplog):
    (data_dir / "cpu.model.npz").write_bytes(b"PK\x03\x04 not a zip archive")
    assert pretrained_model(parse_target(AVX2)) is None
    assert "pretrained cost model not used" in caplog.text
    assert make_cost_model(TuningOptions(), parse_target(AVX2)).prior is None


def test_a_model_with_a_prior_corrects_it_and_keeps_it_when_saved(tmp_path):
    task = ansor.SearchTask.from_workload("matmul-128", AVX2)
    states = [tiled(task, a, b) for a in (1, 2, 4, 8, 16) for b in (1, 4, 16, 32)]
    costs = [1e-3 * (1 + abs(math.log2(s.steps[0].lengths[0]) - 3)) for s in states]
    model = pretrained_model(task.target)
    before = model.predict(task, states)
    assert np.isfinite(before).all() and np.ptp(before) > 0  # ranks before any measurement
    model.update([MeasureInput(task, s) for s in states], [ok(c) for c in costs])
    after = model.predict(task, states)
    assert not np.allclose(before, after)
    model.save(tmp_path / "m.npz")
    loaded = load_model(tmp_path / "m.npz")
    assert loaded.prior is not None and np.allclose(loaded.predict(task, states), after)


def test_refit_fits_the_splits_of_another_size():
    small, large = (ansor.SearchTask.from_workload(f"matmul-{n}", AVX2) for n in (64, 96))
    assert signature(small) == signature(large)
    state = refit(large, tiled(small, 16, 32).steps)
    splits = [s for s in state.steps if isinstance(s, SplitStep)]
    assert [(s.extent, s.lengths) for s in splits] == [(96, (16,)), (96, (32,))]
    assert space_of(large.target).check(large, state) is None  # TVM replays it


def test_refit_pads_a_row_split_whose_extent_has_no_divisor_near_the_recorded_tiles():
    """97 rows (a prime) take 16-row tiles as 20-row tiles over 100; the vectorized columns never pad."""
    small, large = (ansor.SearchTask.from_workload(f"matmul-{m}x64x64", AVX2) for m in (64, 97))
    state = refit(large, tiled(small, 16, 32).steps)
    splits = [s for s in state.steps if isinstance(s, SplitStep)]
    assert [(s.extent, s.lengths) for s in splits] == [(97, (20,)), (64, (32,))]
    assert space_of(large.target).check(large, state) is None
    wide = ansor.SearchTask.from_workload("matmul-64x97x64", AVX2)
    cols = [s for s in refit(wide, tiled(small, 16, 32).steps).steps if isinstance(s, SplitStep)][1]
    assert 97 % math.prod(cols.lengths) == 0  # the last (vectorized) split divides its extent


def test_refit_gives_the_vectorized_split_whole_vectors_of_the_target():
    """A record's 8-lane vector (an AVX2 record, or an extent 16 did not divide) becomes 16 lanes on AVX-512
    where the new extent has them; a row split keeps its recorded length."""
    avx512 = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
    small = ansor.SearchTask.from_workload("matmul-64x72x64", AVX2)
    large = ansor.SearchTask.from_workload("matmul-64x96x64", avx512)
    lengths = [s.lengths for s in refit(large, tiled(small, 8, 8).steps).steps if isinstance(s, SplitStep)]
    assert lengths == [(8,), (16,)]
    odd = ansor.SearchTask.from_workload("matmul-64x72x64", avx512)  # 72: no whole 16-lane vectors
    assert [s.lengths for s in refit(odd, tiled(small, 8, 8).steps).steps if isinstance(s, SplitStep)][1] == (8,)
    same = ansor.SearchTask.from_workload("matmul-64x96x64", AVX2)  # 8 lanes are whole AVX2 vectors
    assert [s.lengths for s in refit(same, tiled(small, 8, 8).steps).steps if isinstance(s, SplitStep)][1] == (8,)


def test_refit_names_the_argument_another_model_reads_at_the_same_place():
    """A record's layout rewrite names the argument of the model it was tuned on; another model's task
    of the same operator reads it under another name (BERT's ``B``, ViT's ``permute_dims``)."""
    def make():
        x = te.placeholder((96, 64), "float32", name="X")
        w = te.placeholder((64, 96), "float32", name="W")
        r = te.reduce_axis((0, 64), name="k")
        return [x, w, te.compute((96, 96), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="C")]

    register_workload("matmul-xw-refit", make, lambda ins: [ins[0] @ ins[1]])
    small = ansor.SearchTask.from_workload("matmul-64", AVX2)
    other = ansor.SearchTask.from_workload("matmul-xw-refit", AVX2)
    assert signature(small) == signature(other)
    recorded = tiled(small, 16, 32)
    recorded.layout_rewrite(0, "B")
    with pytest.raises(StepError, match="'B'"):
        refit(other, recorded.steps)  # without the source task: the name does not exist in `other`
    state = refit(other, recorded.steps, small)
    assert state.steps[-1] == LayoutRewriteStep(0, "W")
    assert space_of(other.target).check(other, state) is None  # TVM replays it, packing W


def test_seeds_come_from_the_workload_else_from_the_same_operator_at_another_size(data_dir):
    small = ansor.SearchTask.from_workload("matmul-64", AVX2)
    log = data_dir / "cpu.schedules.json"
    with RecordWriter(log) as writer:
        for (a, b), cost in (((8, 16), 2e-5), ((4, 32), 1e-5), ((2, 2), 9e-5)):
            writer.write([MeasureInput(small, tiled(small, a, b))], [ok(cost)])
    ScheduleDatabase.write_index(load_records(log), log)
    own = seed_states(small)
    assert [tuple(s.steps[i].lengths[0] for i in (0, 1)) for s in own] == [(4, 32), (8, 16), (2, 2)]  # fastest first
    other = seed_states(ansor.SearchTask.from_workload("matmul-96", AVX2), limit=1)
    assert len(other) == 1 and other[0].steps[0].extent == 96
    assert seed_states(ansor.SearchTask.from_workload("conv2d-nhwc-small", AVX2)) == []  # another operator


def test_seeds_come_first_from_records_whose_constant_operands_are_the_tasks(data_dir):
    """A product of two activations (an attention product) takes the record of another one before a record
    nearer in FLOPs whose B is a weight, packed for free there and at every call here; a weight's product
    takes the other way round."""
    near = ansor.SearchTask.from_workload("matmul-96", AVX2)
    near = ansor.SearchTask(near.func.with_attr("layout_free_buffers", [1]), AVX2, workload_key="matmul-96-weight")
    far = ansor.SearchTask.from_workload("matmul-256", AVX2)
    log = data_dir / "cpu.schedules.json"
    with RecordWriter(log) as writer:
        for task, (a, b) in ((near, (8, 16)), (far, (4, 32))):
            writer.write([MeasureInput(task, tiled(task, a, b))], [ok(1e-5)])
    ScheduleDatabase.write_index(load_records(log), log)
    activations = ansor.SearchTask.from_workload("matmul-64", AVX2)
    weight = ansor.SearchTask(activations.func.with_attr("layout_free_buffers", [1]), AVX2,
                              workload_key="matmul-64-weight")
    assert constant_reads(activations) == constant_reads(far) == "00" and constant_reads(weight) == "01"
    for task, tiles in ((activations, [(4, 32), (8, 16)]), (weight, [(8, 16), (4, 32)])):
        assert [tuple(s.steps[i].lengths[0] for i in (0, 1)) for s in seed_states(task)] == tiles


def test_a_record_of_another_cpu_still_seeds_nearest_hardware_first(data_dir):
    """Records tuned on AVX-512 Zen 5, on 4-core Zen 3 and on 2-core Zen 3 all seed a 2-core Zen 3 task, the
    2-core Zen 3 one first though slowest; a task of a CPU no record was tuned on is still seeded."""
    targets = ({"kind": "llvm", "mcpu": "znver5", "num-cores": 2}, {**AVX2, "num-cores": 4}, AVX2)
    log = data_dir / "cpu.schedules.json"
    with RecordWriter(log) as writer:
        for target, (a, b), cost in zip(targets, ((8, 16), (4, 32), (2, 16)), (1e-5, 2e-5, 3e-5)):
            task = ansor.SearchTask.from_workload("matmul-64", target)
            writer.write([MeasureInput(task, tiled(task, a, b))], [ok(cost)])
    ScheduleDatabase.write_index(load_records(log), log)
    tiles = lambda states: [tuple(s.steps[i].lengths[0] for i in (0, 1)) for s in states]  # noqa: E731
    assert tiles(seed_states(ansor.SearchTask.from_workload("matmul-64", AVX2))) == [(2, 16), (4, 32), (8, 16)]
    skylake = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
    assert tiles(seed_states(ansor.SearchTask.from_workload("matmul-64", skylake))) == [(8, 16), (2, 16), (4, 32)]
    other = seed_states(ansor.SearchTask.from_workload("matmul-96", AVX2), limit=1)
    assert tiles(other) == [(2, 16)]  # another size: the best record of the nearest hardware, re-fitted


def test_of_two_records_for_one_target_the_one_measured_on_this_machine_seeds_first(data_dir):
    """The AVX2 training logs ran AVX2 code on a Zen 5: the same target as a Zen 3's, another machine. Both
    stay in the database (their times do not compare), and this machine's record seeds first."""
    other = MachineFacts("AMD EPYC 9B45", ("fma", "avx2", "avx512f"), 2, (48, 1024, 32768))
    task = ansor.SearchTask.from_workload("matmul-64", AVX2)
    log = data_dir / "cpu.schedules.json"
    for machine, (a, b), cost in ((other, (8, 16), 1e-5), (host_machine(physical_cores()), (2, 16), 3e-5)):
        with RecordWriter(data_dir / "part.json", machine=machine) as writer:
            writer.write([MeasureInput(task, tiled(task, a, b))], [ok(cost)])
    distill(data_dir / "part.json", log, top_k=1)
    ScheduleDatabase.write_index(load_records(log), log)
    assert len(load_records(log)) == 2
    assert [tuple(s.steps[i].lengths[0] for i in (0, 1)) for s in seed_states(task)] == [(2, 16), (8, 16)]


def test_a_new_cpu_kinds_log_is_added_to_the_database_keeping_its_records_and_model(data_dir, tmp_path):
    task = ansor.SearchTask.from_workload("matmul-64", {"kind": "llvm", "mcpu": "znver5", "num-cores": 2})
    log = data_dir / "cpu.schedules.json"
    with RecordWriter(log) as writer:
        writer.write([MeasureInput(task, tiled(task, 8, 16))], [ok(1e-5)])
    ScheduleDatabase.write_index(load_records(log), log)
    (data_dir / "cpu.model.npz").write_bytes(b"the model stays as it is")
    zen3 = ansor.SearchTask.from_workload("matmul-64", AVX2)
    with RecordWriter(tmp_path / "zen3.json") as writer:
        writer.write([MeasureInput(zen3, tiled(zen3, a, b)) for a, b in ((2, 16), (4, 32))], [ok(3e-5), ok(2e-5)])
    assert add_to_database([tmp_path / "zen3.json"], data_dir, top_k=1) == 2
    assert (data_dir / "cpu.model.npz").read_bytes() == b"the model stays as it is"
    assert sorted(r.task.target.attrs["mcpu"] for r in load_records(log)) == ["znver3", "znver5"]
    seeds = seed_states(zen3)
    assert [tuple(s.steps[i].lengths[0] for i in (0, 1)) for s in seeds] == [(4, 32), (8, 16)]
    with pytest.raises(RecordError, match="no schedule database to add to"):
        add_to_database([tmp_path / "zen3.json"], tmp_path, top_k=1)


def test_a_damaged_schedule_index_means_no_seeds(data_dir, caplog):
    (data_dir / "cpu.schedules.json").write_text("")
    (data_dir / "cpu.schedules.json.index").write_text("{not json")
    assert seed_states(ansor.SearchTask.from_workload("matmul-64", AVX2)) == []
    assert "shipped schedule database not used" in caplog.text


@pytest.mark.timing
@pytest.mark.usefixtures("local_ray")
@pytest.mark.slow
def test_a_seeded_search_is_not_worse_than_a_cold_one(data_dir, tmp_path):
    """Tuned cold, the task's log becomes the shipped database; tuned again with the same budget, the
    database's best states are measured first, so the seeded search ends with a program at least as fast:
    the two runs' best programs, timed in turn (each run's own figures are seconds apart, and a burst of
    load on this shared machine once read the cold best's state 37 % slower in the seeded run)."""
    task = ansor.SearchTask.from_workload("matmul-256")
    options = TuningOptions(num_measure_trials=8, num_measures_per_round=8, pretrained=False)
    cold = ansor.tune_task(task, options, tmp_path / "cold.json")
    pretrain([tmp_path / "cold.json"], data_dir, top_k=3)
    seeded = ansor.tune_task(task, TuningOptions(num_measure_trials=8, num_measures_per_round=8),
                             tmp_path / "seeded.json")
    seeds = {r.steps for r in load_records(data_dir / "cpu.schedules.json")}
    assert seeds and seeds <= {r.steps for r in load_records(tmp_path / "seeded.json")}
    with ProgramMeasurer(min_repeat_ms=50) as measurer:
        timed = measurer.measure([MeasureInput(task, s) for s in (seeded.best_state, cold.best_state) * 3])
    assert all(r.ok for r in timed), [r.error_msg for r in timed]
    seeded_s, cold_s = min(r.mean_cost for r in timed[0::2]), min(r.mean_cost for r in timed[1::2])
    assert seeded_s <= cold_s * 1.25, (seeded_s, cold_s, seeded.best_cost, cold.best_cost)


@pytest.mark.slow
def test_pretrain_command_writes_both_files_and_reports_held_out_ranking(tmp_path):
    out = tmp_path / "data"
    proc = subprocess.run([sys.executable, "-m", "ansor", "pretrain", str(HELD_OUT), "--held-out", str(HELD_OUT),
                           "--out-dir", str(out), "--top-k", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pairwise accuracy" in proc.stdout and "schedule database: 4 records" in proc.stdout, proc.stdout
    assert isinstance(load_model(out / "cpu.model.npz"), XGBModel)
    assert len(ScheduleDatabase.read(out / "cpu.schedules.json").index) == 2
    bad = tmp_path / "failed.json"
    bad.write_text("")
    proc = subprocess.run([sys.executable, "-m", "ansor", "pretrain", str(bad), "--out-dir", str(out)],
                          capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "no valid record" in errors[0], proc.stderr


def _linear(name: str, epilogue: bool):
    """``X @ W + b``, and with ``epilogue`` then ``* scale + residual`` (ConvNeXt's layer scale), as one
    task whose output stage is ``out`` either way."""
    def make():
        x = te.placeholder((64, 48), "float32", name="X")
        w = te.placeholder((48, 32), "float32", name="W")
        b = te.placeholder((32,), "float32", name="b")
        r = te.reduce_axis((0, 48), name="k")
        c = te.compute((64, 32), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="matmul")
        if not epilogue:
            return [x, w, b, te.compute((64, 32), lambda i, j: c[i, j] + b[j], name="out")]
        s = te.placeholder((32,), "float32", name="s")
        res = te.placeholder((64, 32), "float32", name="res")
        biased = te.compute((64, 32), lambda i, j: c[i, j] + b[j], name="biased")
        scaled = te.compute((64, 32), lambda i, j: biased[i, j] * s[j], name="scaled")
        return [x, w, b, s, res, te.compute((64, 32), lambda i, j: scaled[i, j] + res[i, j], name="out")]

    def ref(ins):
        y = ins[0] @ ins[1] + ins[2]
        return [y * ins[3] + ins[4]] if epilogue else [y]

    register_workload(name, make, ref)
    return ansor.SearchTask.from_workload(name, AVX2)


@pytest.mark.slow
def test_refit_takes_the_steps_of_the_same_operator_with_another_epilogue():
    """Programs tuned for ``matmul + bias`` replay on ``matmul + bias, * scale + residual`` (the extra
    stages inlined, the steps moved to the stages they name), compute_at included; TVM replays
    every one and it computes the right values."""
    plain, scaled = _linear("linear-bias-refit", False), _linear("linear-scale-residual-refit", True)
    assert signature(plain) != signature(scaled)
    assert core_signature(signature(plain)) == core_signature(signature(scaled))
    assert core_signature(signature(plain)) == signature(plain)
    sketches = generate_sketches(plain)
    programs = sample_initial_population(plain, sketches, 12, random.Random(0))
    assert any(any(isinstance(s, ComputeAtStep) for s in p.steps) for p in programs)
    space = space_of(scaled.target)
    rng = np.random.default_rng(0)
    x, w, b, s, res = (rng.standard_normal(shape).astype("float32")
                       for shape in ((64, 48), (48, 32), (32,), (32,), (64, 32)))
    for program in programs:
        state = refit(scaled, program.steps, plain)
        assert space.check(scaled, state) is None
        assert [(it.extent, it.annotation) for it in state.stages[-1].iters] == \
            [(it.extent, it.annotation) for it in program.stages[-1].iters]  # the output's loops, as recorded
        assert all(state.stages[k].compute_at == AttachKind.INLINED for k in (1, 2))  # bias, scale
        lib = tvm.compile(scaled.compute_dag.replay(state).mod, target="llvm")  # runs on any CPU
        out = tvm.runtime.tensor(np.zeros((64, 32), "float32"))
        lib["main"](*(tvm.runtime.tensor(a) for a in (x, w, b, s, res)), out)
        np.testing.assert_allclose(out.numpy(), (x @ w + b) * s + res, rtol=1e-4, atol=1e-4)


def test_seeds_of_another_epilogue_only_when_no_record_has_the_same_stages(data_dir):
    plain, scaled = _linear("linear-bias-seed", False), _linear("linear-scale-residual-seed", True)
    log = data_dir / "cpu.schedules.json"
    with RecordWriter(log) as writer:
        writer.write([MeasureInput(plain, p) for p in sample_initial_population(
            plain, generate_sketches(plain), 2, random.Random(1))], [ok(2e-5), ok(1e-5)])
    ScheduleDatabase.write_index(load_records(log), log)
    seeds = seed_states(scaled)
    assert seeds and all(s.stages[-1].name == "out" for s in seeds)
    assert seed_states(ansor.SearchTask.from_workload("matmul-64", AVX2)) == []  # another output stage


def _matmul_only(name: str):
    """A matmul whose output is its reduction (no epilogue), named as :func:`_linear`'s."""
    def make():
        x, w = te.placeholder((64, 48), "float32", name="x"), te.placeholder((48, 32), "float32", name="w")
        r = te.reduce_axis((0, 48), name="r")
        return [x, w, te.compute((64, 32), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="matmul")]

    register_workload(name, make, lambda ins: [ins[0] @ ins[1]])
    return ansor.SearchTask.from_workload(name, AVX2)


def test_refit_gives_a_reduction_without_epilogue_the_steps_of_one_with_a_cache_write():
    """DenseNet-121's transition convolutions (no epilogue) take the steps of its fused ones: a cache write
    of the reduction stands for the epilogue, as the sketch of an epilogue-free reduction tiles it."""
    linear, bare = _linear("linear-bias-cw", False), _matmul_only("matmul-only-cw")
    assert Kinship.of(signature(linear), signature(bare)) == Kinship.CACHE_WRITE
    assert Kinship.of(signature(bare), signature(linear)) is None  # the other way round is not supported
    programs = sample_initial_population(linear, generate_sketches(linear), 8, random.Random(2))
    space = space_of(bare.target)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 48)).astype("float32"), rng.standard_normal((48, 32)).astype("float32")
    for program in programs:
        state = refit(bare, program.steps, linear)
        assert isinstance(state.steps[0], CacheWriteStep) and space.check(bare, state) is None
        assert [(it.extent, it.annotation) for it in state.stages[-1].iters] == \
            [(it.extent, it.annotation) for it in program.stages[-1].iters]  # the output's loops, as recorded
        lib = tvm.compile(bare.compute_dag.replay(state).mod, target="llvm")
        out = tvm.runtime.tensor(np.zeros((64, 32), "float32"))
        lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
        np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-4, atol=1e-4)


def test_a_reduction_without_epilogue_is_seeded_from_fused_records_only_when_it_has_none_of_its_own(data_dir):
    linear, bare = _linear("linear-bias-cw-seed", False), _matmul_only("matmul-only-cw-seed")
    log = data_dir / "cpu.schedules.json"
    fused = sample_initial_population(linear, generate_sketches(linear), 2, random.Random(3))
    with RecordWriter(log) as writer:
        writer.write([MeasureInput(linear, p) for p in fused], [ok(2e-5), ok(1e-5)])
    ScheduleDatabase.write_index(load_records(log), log)
    seeds = seed_states(bare)
    assert seeds and all(isinstance(s.steps[0], CacheWriteStep) for s in seeds)
    own = sample_initial_population(bare, generate_sketches(bare), 1, random.Random(4))[0]
    with RecordWriter(log) as writer:
        writer.write([MeasureInput(bare, own)], [ok(3e-5)])
    ScheduleDatabase.write_index(load_records(log), log)
    assert [s.key() for s in ScheduleDatabase.read(log).seeds(bare)] == [own.key()]
