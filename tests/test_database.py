"""ansor.Database: a directory of logs looked up by workload key and target; distill keeps the best."""

import pytest

import ansor
from ansor.errors import RecordError
from ansor.log.measurement import MAX_COST, ErrorNo, MeasureInput, MeasureResult
from ansor.log.records import RecordWriter, load_records

CPU2 = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # explicit: records are keyed by the target string
CPU4 = {"kind": "llvm", "mcpu": "znver3", "num-cores": 4}


def ok(cost: float) -> MeasureResult:
    return MeasureResult((cost,), ErrorNo.NO_ERROR, all_cost=0.1, timestamp=1.7e9)


def states(task, n: int) -> list:
    out = []
    for f in (2, 4, 8, 16, 32)[:n]:
        s = task.compute_dag.init_state()
        s.split(0, 0, [f])
        out.append(s)
    return out


def write(path, task, costs) -> None:
    with RecordWriter(path) as writer:
        for state, cost in zip(states(task, len(costs)), costs):
            result = ok(cost) if cost is not None else MeasureResult((MAX_COST,), ErrorNo.RUNTIME_DEVICE)
            writer.write([MeasureInput(task, state)], [result])


@pytest.fixture
def db(tmp_path):
    mm = ansor.SearchTask.from_workload("matmul-64", CPU2)
    sm = ansor.SearchTask.from_workload("matmul-32", CPU2)
    database = ansor.Database(tmp_path / "db")
    write(database.log_path("run-1"), mm, [3e-3, 1e-3, None])
    write(database.log_path("run-2"), mm, [2e-3, 5e-4])
    write(database.log_path("run-2"), sm, [1e-4])
    write(database.log_path("other-target"), ansor.SearchTask.from_workload("matmul-64", CPU4), [1e-5])
    (database.path / ".tmp-half-written.json").write_text("{")  # ignored: a temporary file
    return database


def test_lookup_by_workload_key_and_target(db):
    assert [p.name for p in db.logs()] == ["other-target.json", "run-1.json", "run-2.json"]
    assert len(db.records("matmul-64", CPU2)) == 5
    assert len(db.records("matmul-64")) == 6  # any target
    assert db.best("matmul-64", CPU2).result.mean_cost == 5e-4
    assert db.best("matmul-64", CPU4).result.mean_cost == 1e-5
    assert db.best("matmul-128", CPU2) is None
    history = db.history(["matmul-64", "matmul-32"], CPU2, exclude=[db.log_path("run-2")])
    assert {k: len(v) for k, v in history.items()} == {"matmul-64": 3}


def test_distill_keeps_the_best_per_task_and_target(db, tmp_path):
    assert db.distill(tmp_path / "best.json") == 3  # matmul-64 on two targets, matmul-32
    assert len(db.logs()) == 3  # with out=, the database is left as it is
    assert db.distill() == 3
    assert [p.name for p in db.logs()] == ["distilled.json"]
    best = {(r.workload_key, r.task.target_str): r.result.mean_cost for r in load_records(db.logs())}
    assert sorted(best.values()) == [1e-5, 1e-4, 5e-4]


def test_search_task_reads_a_database(db):
    task = ansor.SearchTask.from_workload("matmul-64", CPU2)
    assert ansor.best_record(task, db).result.mean_cost == 5e-4
    assert "T.prim_func" in ansor.print_best(task, db, print_mode="tir")
    with pytest.raises(RecordError, match="no valid record of matmul-32 for target"):
        ansor.best_record(ansor.SearchTask.from_workload("matmul-32", CPU4), db)


def test_a_file_is_not_a_database(tmp_path):
    path = tmp_path / "log.json"
    path.write_text("")
    with pytest.raises(RecordError, match="is a file; give a directory"):
        ansor.Database(path)
