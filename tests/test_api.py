"""The Python API for one program: ansor.tune, tune_task, apply_best/print_best (also as SearchTask methods),
options, database.

Real tuning on one local Ray shared by the module, with a 32x32x32 matmul and a handful of trials.
"""

import argparse
import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te

import ansor
from ansor.log.records import load_records

TARGET = {"kind": "llvm", "num-cores": 2}
FAST = ansor.TuningOptions(num_measures_per_round=4, cost_model="random")


def matmul(n: int = 32):
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return [a, b, c]


@pytest.fixture(scope="module")
def tuned(local_ray, tmp_path_factory):
    """``ansor.tune`` of a TE matmul: 4 trials into a fresh log, with a callback counting results."""
    log = tmp_path_factory.mktemp("api") / "mm.json"
    seen = []
    options = ansor.TuningOptions(num_measures_per_round=4, cost_model="random",
                                  measure_callbacks=[lambda inputs, results: seen.extend(results)])
    result = ansor.tune(matmul(), TARGET, trials=4, log_file=log, options=options)
    return log, result, seen


@pytest.mark.slow
def test_tune_te_compute_in_one_call(tuned):
    log, result, seen = tuned
    assert result.trials == 4 and result.resumed == 0 and result.measured == 4
    assert len(seen) == 4  # the user's callback saw every result
    assert len(load_records(log)) == 4
    assert result.best_state is not None and 0 < result.best_cost < float("inf")
    assert result.log_file == log and result.best_gflops > 0
    assert str(result).startswith(f"{result.task.workload_key}: best ")


@pytest.mark.slow
def test_apply_best_and_print_best(tuned):
    log, result, _ = tuned
    task = result.task
    mod = ansor.apply_best(task, log)
    assert isinstance(mod, tvm.IRModule)
    fn = tvm.compile(mod, target=task.target)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((32, 32)).astype("float32") for _ in range(2))
    out = tvm.runtime.tensor(np.zeros((32, 32), "float32"))
    fn["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    code = ansor.print_best(task, log)
    assert "sch.get_sblock" in code or "sch.split" in code, code
    assert "T.prim_func" in ansor.print_best(task, log, print_mode="tir")
    with pytest.raises(ansor.AnsorError, match="valid: 'schedule', 'tir'"):
        ansor.print_best(task, log, print_mode="te")


@pytest.mark.slow
def test_rerun_resumes_and_a_spent_budget_measures_nothing(tuned, tmp_path):
    log, result, _ = tuned
    again = ansor.tune(matmul(), TARGET, trials=4, log_file=log, options=FAST)
    assert again.measured == 0 and again.resumed == 4 and again.best_cost == result.best_cost
    # A database holding the log: a fresh log elsewhere starts from its records.
    db = ansor.Database(tmp_path / "db")
    ansor.log.records.distill(log, db.log_path("earlier"), top_k=4)
    from_db = ansor.tune(matmul(), TARGET, trials=6, log_file=tmp_path / "new.json", options=FAST, database=db)
    assert from_db.resumed == 4 and from_db.measured == 2
    assert len(load_records(tmp_path / "new.json")) == 2  # only the new measurements
    assert {r.steps for r in load_records(tmp_path / "new.json")}.isdisjoint({r.steps for r in load_records(log)})


@pytest.mark.slow
def test_search_task_tune_in_auto_scheduler_vocabulary(tuned):
    log, result, _ = tuned
    task = ansor.SearchTask(te.create_prim_func(matmul()), TARGET)
    assert task.workload_key == result.task.workload_key  # the same program is the same task
    again = ansor.tune_task(task, ansor.TuningOptions(num_measure_trials=4, early_stopping=2), log_file=log)
    assert again.task is task and again.measured == 0 and again.best_cost == result.best_cost
    assert ansor.best_record(task, log).result.mean_cost == result.best_cost
    assert tvm_ffi.structural_equal(ansor.apply_best(task, log), ansor.apply_best(again.task, log))
    assert "sch." in ansor.print_best(task, log)


@pytest.mark.slow
def test_a_task_read_from_a_log_works_with_the_workflow_in_a_fresh_process(tuned):
    """The workflow functions take a task from a log's records as much as one the user made."""
    log, result, _ = tuned
    code = ("import sys, ansor\n"
            "task = ansor.load_records(sys.argv[1])[0].task\n"
            "print(ansor.best_record(task, sys.argv[1]).result.mean_cost)\n")
    out = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) == result.best_cost


@pytest.mark.slow
def test_scripts_and_api_share_one_timing_definition(local_ray):
    from ansor.cli.options import tuning_options
    from ansor.tuning import make_measurer

    args = argparse.Namespace(n_trials=8, per_round=4, seed=0, ray_address=None, cost_model="xgb", load_model=None)
    options = tuning_options(args)
    assert options.runner == ansor.TuningOptions().runner == ansor.RunnerOptions()
    assert (options.runner.repeat, options.runner.min_repeat_ms) == (3, 15)
    with make_measurer(options) as measurer:
        config = measurer._pool.config
    assert (config.repeat, config.min_repeat_ms, config.number) == (3, 15, 1)


def test_timing_defaults_are_defined_once():
    """RunConfig's defaults are the measurer's and the options': a bare ProgramMeasurer times as tuning does."""
    import dataclasses
    import inspect

    from ansor.measure.measurer import ProgramMeasurer
    from ansor.measure.runner import RunConfig

    config, options = RunConfig(), ansor.RunnerOptions()
    measurer_defaults = inspect.signature(ProgramMeasurer).parameters
    for field in dataclasses.fields(RunConfig):
        assert measurer_defaults[field.name].default == getattr(options, field.name) == getattr(config, field.name)
    assert (config.number, config.repeat, config.min_repeat_ms, config.slow_factor) == (1, 3, 15, 5.0)


@pytest.mark.parametrize("bad, match", [
    ("matmul", "cannot tune a str"),
    ([1, 2], "list of TE tensors"),
    (tvm.IRModule({}), "exactly one PrimFunc"),
])
def test_bad_programs_name_what_is_accepted(bad, match):
    with pytest.raises(ansor.AnsorError, match=match):
        ansor.tune(bad, TARGET, trials=1)


def test_bad_options_are_one_line_errors():
    with pytest.raises(ansor.AnsorError, match="num_measure_trials must be positive"):
        ansor.TuningOptions(num_measure_trials=0)
    with pytest.raises(ansor.AnsorError, match="valid: 'xgb', 'random'"):
        ansor.TuningOptions(cost_model="gbm")
