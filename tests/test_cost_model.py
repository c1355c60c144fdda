"""Cost models on both feature sets (ours from the State, TVM's C++ one): extraction, pack-sum, learning a
known cost, files, logs, the script.

The learning test uses a synthetic log: matmul-128 programs tiled i by ``a`` and j by ``b`` whose "measured"
cost is a smooth known function of (a, b) (the unroll pragma varies too and must be ignored), so the
expected ranking is known exactly and no timing noise enters the test.
"""

import importlib.util
import logging
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xgboost as xgb

from ansor.state.loop_nest import AttachKind
from ansor.cost_model import (CostModelError, FeatureExtractor, RandomModel, XGBModel, XGBParams,
                              load_model)
from ansor.cost_model.dataset import TrainingSet
from ansor.cost_model.state_features import FEATURE_NAMES, StateFeatureExtractor
from ansor.cost_model.metrics import pairwise_accuracy, spearman_by_group, top_k_recall
from ansor.cost_model.objective import Packs, PackSumPairwise, PackSumSquaredError
from ansor.cost_model.training import (evaluate, load_training_records, split_by_program,
                                       train_from_logs)
from ansor.errors import RecordError
from ansor.log.measurement import MAX_COST, ErrorNo, MeasureInput, MeasureResult
from ansor.log.records import RecordWriter
from ansor.task.search_task import SearchTask

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_cost_model.py"
SIZES = [1, 2, 4, 8, 16, 32, 64, 128]
# Features depend on the target's vector width and cores, so every task here names its CPU; no program of
# this module runs, so neither needs to be this machine's.
AVX2 = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # 32-byte vectors: 8 fp32 lanes
AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}  # 64-byte vectors: 16 lanes
UNROLL = [0, 16, 64, 512]


def tiled(task: SearchTask, a: int, b: int, unroll: int, cache_write: bool = False):
    """i -> (128/a, a), j -> (128/b, b); loops i0 j0 k i1 j1, j1 vectorized, an unroll pragma on i0."""
    s = task.compute_dag.init_state()
    if cache_write:
        s.cache_write(0, "local")
    s.split(0, 0, [a])
    s.split(0, 2, [b])
    s.reorder(0, [0, 2, 4, 1, 3])
    s.annotate(0, 4, "vectorize")
    s.pragma(0, 0, f"auto_unroll_max_step${unroll}")
    return s


def known_cost(a: int, b: int) -> float:
    """Smooth, with its optimum at a = 8, b = 32 and an interaction term (seconds, made up)."""
    x, y = math.log2(a), math.log2(b)
    return 1e-3 * (1.0 + 0.5 * (x - 3) ** 2 + 0.3 * (y - 5) ** 2 + 0.1 * (x - 3) * (y - 5))


def ok(cost: float) -> MeasureResult:
    return MeasureResult((cost,), ErrorNo.NO_ERROR)


FAILED = MeasureResult((MAX_COST,), ErrorNo.COMPILE_HOST, "synthetic failure")


@pytest.fixture(scope="module")
def task():
    return SearchTask.from_workload("matmul-128", AVX2)


@pytest.fixture(scope="module")
def synthetic(task):
    """Every (a, b, unroll) program with its known cost: 256 (input, result) pairs."""
    inputs, results = [], []
    for a in SIZES:
        for b in SIZES:
            for u in UNROLL:
                inputs.append(MeasureInput(task, tiled(task, a, b, u)))
                results.append(ok(known_cost(a, b)))
    return inputs, results


@pytest.fixture(scope="module", params=["state", "tvm"])
def extractor(request):
    return StateFeatureExtractor() if request.param == "state" else FeatureExtractor()


@pytest.fixture(scope="module")
def trained(synthetic, extractor):
    """A model trained on 80 % of the synthetic programs, and the held-out 20 %."""
    inputs, results = synthetic
    order = np.random.default_rng(0).permutation(len(inputs))
    cut = int(0.8 * len(inputs))
    train, test = order[:cut], order[cut:]
    model = XGBModel(min_train_programs=1, extractor=extractor)
    model.update([inputs[i] for i in train], [results[i] for i in train])
    return model, [inputs[i] for i in test], [results[i] for i in test]


def write_log(path: Path, task: SearchTask, states, results) -> None:
    with RecordWriter(path) as writer:
        writer.write([MeasureInput(task, s) for s in states], results)


# ---------------------------------------------------------------------------------------------- features
@pytest.mark.parametrize("make", [StateFeatureExtractor, lambda: FeatureExtractor(pipeline=False)],
                         ids=["state", "tvm"])
def test_features_are_deterministic_per_store_rows(task, make):
    states = [tiled(task, a, b, 16, cache_write=c) for a, b in ((4, 32), (8, 8), (1, 128)) for c in (False, True)]
    ext = make()
    first = ext.extract(task, states)
    again = make().extract(task, states[::-1])[::-1]
    for state, f, g in zip(states, first, again):
        # One row per stored buffer: C (init and update together), plus C_local after a cache write.
        assert f.dtype == np.float32 and f.shape == (len(state.stages), ext.num_features)
        np.testing.assert_array_equal(f, g)
    assert not np.array_equal(first[0], first[2])  # tile sizes show in the features


@pytest.mark.parametrize("target, lanes", [(AVX2, 8), (AVX512, 16)], ids=["avx2", "avx512"])
def test_state_features_of_a_known_nest(target, lanes):
    """Loops i0(16) j0(4) k(128) i1(8) j1(32, vectorized), unroll pragma 16: values worked out by hand, for
    an AVX2 and an AVX-512 target (what depends on the lanes differs between them)."""
    task = SearchTask.from_workload("matmul-128", target)
    assert task.hardware_params.vector_unit_bytes == 4 * lanes
    row = dict(zip(FEATURE_NAMES, StateFeatureExtractor().extract(task, [tiled(task, 8, 32, 16)])[0][0]))
    lg = lambda x: np.float32(np.log2(1 + x))  # noqa: E731
    assert row["iterations"] == lg(128 ** 3) and row["flops"] == lg(2 * 128 ** 3) and row["loops"] == 5
    assert row["vector_len"] == lg(32) and row["vector_innermost"] == 1
    assert row["vector_lanes_ratio"] == 32 / lanes and row["vector_whole_lanes"] == 1
    assert row["auto_unroll_max"] == lg(16) and row["auto_unroll_body"] == lg(8)  # i1 fits, k does not
    assert row["parallel_extent"] == 0 and row["is_reduction"] == 1
    buffers = [{k.split("_", 1)[1]: v for k, v in row.items() if k.startswith(f"b{b}_")} for b in range(5)]
    assert all(b["footprint"] == lg(128 * 128 * 4) for b in buffers[:3]) and buffers[3]["footprint"] == 0
    # Reuse: A[i, k] across j1 (32) with nothing else varying (12 bytes: one element of each buffer);
    # B[k, j] across i1 (8) with j1 varying (4 + 128 + 128 bytes); C[i, j] across k (128) with i1, j1
    # varying (A: 8 elements, B: 32, C: 256, 4 bytes each).
    reuse = {(b["reuse_count"], b["reuse_distance"]) for b in buffers[:3]}
    assert reuse == {(lg(32), lg(12)), (lg(8), lg(260)), (lg(128), lg(4 * (8 + 32 + 256)))}
    assert sorted(b["stride_innermost"] for b in buffers[:3]) == [0, lg(1), lg(1)]
    # An 8-wide vector loop fills a ymm register exactly and half a zmm register.
    narrow = dict(zip(FEATURE_NAMES, StateFeatureExtractor().extract(task, [tiled(task, 8, 8, 16)])[0][0]))
    assert narrow["vector_lanes_ratio"] == 8 / lanes and narrow["vector_whole_lanes"] == float(lanes == 8)


def test_state_features_of_gpu_programs_show_thread_bindings():
    import random
    from ansor.sketch.search_space import generate_sketches, sample_initial_population
    gpu = SearchTask.from_workload("matmul-512", target="cuda -arch=sm_80")
    states = sample_initial_population(gpu, generate_sketches(gpu), 20, random.Random(0), exclude=set())
    feats = StateFeatureExtractor().extract(gpu, states)
    col = FEATURE_NAMES.index("thread_idx")
    for state, f in zip(states, feats):
        assert f.shape[0] == sum(s.compute_at != AttachKind.INLINED for s in state.stages) and np.isfinite(f).all()
        assert f[:, col].max() > 0  # some store runs under threadIdx.x


def test_pipelined_batch_equals_serial_and_cache_hits(task, synthetic):
    states = [inp.state for inp in synthetic[0][:80]]  # more than one pipeline chunk
    serial = FeatureExtractor(pipeline=False).extract(task, states)
    ext = FeatureExtractor()
    piped = ext.extract(task, states)
    for f, g in zip(serial, piped):
        np.testing.assert_array_equal(f, g)
    ext.extract(task, states[:10])
    assert ext.stats.cache_hits == 10 and ext.stats.states == 90


def test_unreplayable_state_has_no_tvm_features_and_scores_minus_inf(task, synthetic):
    model = XGBModel(min_train_programs=1, features="tvm")
    model.update(*synthetic)
    bad = task.compute_dag.init_state()
    bad.annotate(0, 2, "vectorize")  # k is a reduction loop: TVM refuses
    good = tiled(task, 8, 32, 0)
    assert FeatureExtractor().extract(task, [bad])[0] is None
    scores = model.predict(task, [bad, good])
    assert scores[0] == -np.inf and np.isfinite(scores[1])
    n = len(model.data)
    model.update([MeasureInput(task, bad)], [FAILED])  # dropped, not a crash
    assert len(model.data) == n


def test_search_never_proposes_an_unreplayable_state(task):
    """State features describe any State, so the policy itself replays what it is about to measure."""
    from ansor.sketch.policy import SketchPolicy
    bad = task.compute_dag.init_state()
    bad.annotate(0, 2, "vectorize")
    good = tiled(task, 8, 32, 0)
    policy = SketchPolicy(task, RandomModel(), first=[bad, good])
    assert [s.key() for s in policy.next_batch(4)] == [good.key()]  # the first programs: a batch of their own
    assert bad.key() in policy.measured  # and never again
    batch = policy.next_batch(4)  # then the search
    assert len(batch) == 4 and bad.key() not in {s.key() for s in batch}


# ---------------------------------------------------------------------------------------------- objective
def test_pack_sum_score_is_the_sum_of_per_store_predictions(task, trained, extractor):
    model, test_inputs, _ = trained
    states = [inp.state for inp in test_inputs]
    scores = model.predict(task, states)
    parts = model.predict_stores(task, states)
    feats = extractor.extract(task, states)
    for score, part, feat in zip(scores, parts, feats):
        rows = model.booster.predict(xgb.DMatrix(feat), output_margin=True)
        np.testing.assert_allclose(part, rows, rtol=1e-6)
        assert len(part) == len(feat)
        assert score == pytest.approx(float(np.sum(rows)), rel=1e-5, abs=1e-6)


def test_pack_sum_gradients_match_finite_differences():
    packs = Packs(np.array([0, 0, 1, 2, 2, 2]), np.array([0, 0, 0]), np.array([1.0, 0.5, 0.0]))
    sums = np.array([0.3, 0.9, -0.2])
    mse = PackSumSquaredError(packs)
    grad, hess = mse.gradient(sums)
    eps = 1e-6
    loss = lambda s: 0.5 * np.sum(packs.labels * (s - packs.labels) ** 2)  # noqa: E731
    numeric = [(loss(sums + eps * np.eye(3)[k]) - loss(sums - eps * np.eye(3)[k])) / (2 * eps) for k in range(3)]
    np.testing.assert_allclose(grad, numeric, atol=1e-6)
    row_grad, row_hess = packs.to_rows(grad, hess)
    np.testing.assert_array_equal(row_grad, grad[packs.row_program])  # every row gets its program's gradient
    assert np.sum(row_hess[packs.row_program == 1]) == 0.5  # weights are labels (Ansor)

    rank = PackSumPairwise(packs, pairs_per_program=64, seed=1)
    grad, hess = rank.gradient(sums)
    assert grad[0] < 0 and grad[2] > 0 and np.all(hess > 0)  # push the best up, the failed one down
    assert rank.loss(sums + np.array([1.0, 0.0, -1.0])) < rank.loss(sums)


def test_ranking_metrics():
    costs = np.array([1.0, 2.0, 3.0, MAX_COST, 5.0, 1.0])
    groups = ["a", "a", "a", "a", "b", "b"]
    perfect = -costs
    assert pairwise_accuracy(perfect, costs, groups) == 1.0
    assert pairwise_accuracy(-perfect, costs, groups) == 0.0
    assert pairwise_accuracy(np.zeros(6), costs, groups) == 0.5
    assert top_k_recall(perfect, costs, groups, 1) == 1.0
    assert top_k_recall(np.array([0, 1, 2, 3, 0, 1]), costs, groups, 1) == 0.5
    assert spearman_by_group(perfect, costs, groups)["a"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------- learning
def test_learns_a_known_tile_size_cost(task, trained):
    model, test_inputs, test_results = trained
    report = evaluate(model, test_inputs, test_results)
    assert report.pairwise_accuracy >= 0.9, report
    assert report.spearman["matmul-128"] >= 0.9, report


def test_incremental_updates_retrain_on_everything(task, synthetic, extractor):
    inputs, results = synthetic
    model = XGBModel(min_train_programs=4, max_programs_per_task=64, extractor=extractor)
    model.update(inputs[:2], results[:2])
    assert model.booster is None and len(model.predict(task, [inputs[0].state])) == 1  # random warm-up
    for start in range(2, 130, 32):
        model.update(inputs[start:start + 32], results[start:start + 32])
    assert model.booster is not None
    assert len(model.data) == 64 and model.last_train.programs == 64  # capped per task


def test_updates_between_two_predictions_cost_one_training(task, synthetic, extractor, monkeypatch):
    inputs, results = synthetic
    trainings = []
    real_train = xgb.train
    monkeypatch.setattr(xgb, "train", lambda *a, **kw: trainings.append(1) or real_train(*a, **kw))
    model = XGBModel(min_train_programs=4, extractor=extractor)
    for start in range(0, 40, 4):  # ten warm-up-sized rounds, nothing predicted
        model.update(inputs[start:start + 4], results[start:start + 4])
    assert trainings == []
    first = model.predict(task, [inputs[50].state, inputs[51].state])
    assert len(trainings) == 1 and model.last_train.programs == 40  # one training, on all ten rounds
    np.testing.assert_array_equal(model.predict(task, [inputs[50].state, inputs[51].state]), first)
    assert len(trainings) == 1  # nothing new: no retraining
    model.update(inputs[40:44], results[40:44])
    model.predict(task, [inputs[50].state])
    assert len(trainings) == 2 and model.last_train.programs == 44


def test_training_set_cap_keeps_best_half_and_most_recent():
    data = TrainingSet(max_programs_per_task=4)
    for i, cost in enumerate([1.0, 9.0, 2.0, 8.0, 7.0, 6.0]):
        data.add("t", np.full((1, 3), i, np.float32), cost)
    arrays = data.arrays()
    assert sorted(arrays.costs) == [1.0, 2.0, 6.0, 7.0]  # best two, then the two most recent
    np.testing.assert_allclose(sorted(arrays.packs.labels), [1 / 7, 1 / 6, 0.5, 1.0])


@pytest.mark.parametrize("n", [0, 1, 2])
def test_zero_one_or_two_records_never_crash(task, synthetic, extractor, n):
    inputs, results = synthetic
    picked = [inputs[0], inputs[100]][:n]
    outcome = [results[0], FAILED][:n]
    for model in (XGBModel(min_train_programs=0, extractor=extractor), XGBModel(extractor=extractor),
                  RandomModel()):
        model.update(picked, outcome)
        scores = model.predict(task, [inputs[5].state, inputs[6].state])
        assert scores.shape == (2,) and np.all(np.isfinite(scores))


def test_save_load_gives_identical_predictions(task, trained, synthetic, tmp_path):
    model, test_inputs, _ = trained
    states = [inp.state for inp in test_inputs]
    model.save(tmp_path / "m.npz")
    loaded = load_model(tmp_path / "m.npz")
    assert isinstance(loaded, XGBModel) and len(loaded.data) == len(model.data)
    assert loaded.extractor.name == model.extractor.name
    np.testing.assert_array_equal(loaded.predict(task, states), model.predict(task, states))
    loaded.update(synthetic[0][:3], synthetic[1][:3])  # training goes on from the saved data
    assert loaded.last_train.programs == len(model.data) + 3

    RandomModel(seed=7).save(tmp_path / "r.npz")
    np.testing.assert_array_equal(load_model(tmp_path / "r.npz").predict(task, states),
                                  RandomModel(seed=7).predict(task, states))


def test_bad_model_files_are_clear_errors(tmp_path):
    (tmp_path / "junk.npz").write_text("not a model")
    for path, needle in ((tmp_path / "missing.npz", "cannot read model"),
                         (tmp_path / "junk.npz", "not a cost model file")):
        with pytest.raises(CostModelError, match=needle):
            load_model(path)
    with pytest.raises(CostModelError, match="unknown objective"):
        XGBParams(objective="nope")


# ---------------------------------------------------------------------------------------------- logs
def test_logs_of_other_targets_and_workloads_are_filtered(task, synthetic, tmp_path, caplog):
    inputs, results = synthetic
    log = tmp_path / "mixed.json"
    other_target = SearchTask(task.func, {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 4},
                              workload_key=task.workload_key)
    other_workload = SearchTask.from_workload("matmul-64", task.target)
    write_log(log, task, [inp.state for inp in inputs[:6]], results[:6])
    write_log(log, other_target, [inp.state for inp in inputs[:3]], results[:3])
    write_log(log, other_workload, [other_workload.compute_dag.init_state()], [ok(1e-3)])
    with caplog.at_level(logging.WARNING, logger="ansor"):
        records = load_training_records([log], target=task.target, workloads=["matmul-128"])
    assert len(records) == 6 and {r.task.target_str for r in records} == {task.target_str}
    assert "skipped 3 records measured for another target" in caplog.text
    assert "skipped 1 records of other workloads (matmul-64: 1)" in caplog.text
    with pytest.raises(RecordError, match="no records .* for target"):
        load_training_records([log], target=task.target, workloads=["matmul-999"])


def test_empty_or_missing_log_is_a_clear_error(tmp_path):
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(RecordError, match="no records in"):
        train_from_logs([tmp_path / "empty.json"])
    with pytest.raises(RecordError, match="cannot read log"):
        train_from_logs([tmp_path / "missing.json"])


def test_split_is_by_program_and_seeded(task, synthetic, tmp_path):
    inputs, results = synthetic
    log = tmp_path / "dup.json"
    write_log(log, task, [inp.state for inp in inputs[:20]] * 2, results[:20] * 2)  # every program twice
    records = load_training_records([log])
    train, test = split_by_program(records, 0.2, seed=3)
    assert len(test) == 8 and not {r.steps for r in train} & {r.steps for r in test}
    assert [r.steps for r in split_by_program(records, 0.2, seed=3)[1]] == [r.steps for r in test]


# ---------------------------------------------------------------------------------------------- script
def _script_main():
    spec = importlib.util.spec_from_file_location("train_cost_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    ("", "no records in"),
    ("\x00\x01garbage\n{not json\n" * 20, "no records in"),
])
def test_script_bad_log_is_one_line_error_exit_2(tmp_path, capsys, content, needle):
    log = tmp_path / "log.json"
    if content is not None:
        log.write_text(content)
    assert _script_main()([str(log), "--out", str(tmp_path / "m.npz")]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "m.npz").exists()


def test_script_on_a_log_of_failed_measurements_only_is_exit_2(task, tmp_path, capsys):
    """Records that all failed teach a model nothing: training on them is bad input, and nothing is saved."""
    log = tmp_path / "failed.json"
    write_log(log, task, [tiled(task, a, 32, 0) for a in (1, 2, 4, 8)],
              [MeasureResult((MAX_COST,), ErrorNo.RUNTIME_DEVICE, all_cost=0.1, timestamp=1.7e9)] * 4)
    assert _script_main()([str(log), "--out", str(tmp_path / "m.npz")]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error:")] == \
        ["error: no valid record to train on: all 3 records are failed measurements (a model learns from measured "
         "times; tune first, or give other logs)"], err
    assert not (tmp_path / "m.npz").exists()


@pytest.mark.slow
def test_script_trains_reports_and_saves(task, synthetic, tmp_path):
    inputs, results = synthetic
    log = tmp_path / "synthetic.json"
    write_log(log, task, [inp.state for inp in inputs[::2]], results[::2])
    out = tmp_path / "model.npz"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(log), "--out", str(out), "--test-fraction", "0.25"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for needle in ("pairwise accuracy:", "top-1 recall:", "top-5 recall:", "Spearman per task:", "matmul-128"):
        assert needle in proc.stdout, proc.stdout
    accuracy = float(proc.stdout.split("pairwise accuracy:")[1].split()[0])
    assert accuracy >= 0.85, proc.stdout
    assert isinstance(load_model(out), XGBModel)
    help_text = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    for flag in ("--out", "--test-fraction", "--seed", "--target", "--workload", "--objective", "--features",
                 "--max-rounds", "--verbose"):
        assert flag in help_text
