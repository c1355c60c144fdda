"""Tests for ansor.log.records: writing, crash tolerance, self-contained replay, best-of, resume and distill;
appending to logs of another version or program, the writer's lock and sync, and resume's counting.

Everything uses real TVM programs (matmul-64 / matmul-32) and real states; the self-containedness check
replays a state in a fresh interpreter that is not allowed to look up the workload registry.
"""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import tvm
import tvm_ffi

from ansor.errors import RecordError
from ansor.host_cpu import MachineFacts
from ansor.log.measurement import MAX_COST, ErrorNo, MeasureInput, MeasureResult
from ansor.log.records import (
    RECORD_VERSION, Record, RecordWriter, best_records, distill, distinct_records, load_records, log_targets,
    other_targets_message, save_records,
)
from ansor.task.search_task import SearchTask

FACTORS = [(2, 4), (4, 2), (8, 8), (16, 4), (4, 16), (8, 2), (2, 8), (32, 1)]
OTHER_TARGET = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 4}


@pytest.fixture(scope="module")
def task():
    return SearchTask.from_workload("matmul-64")


@pytest.fixture(scope="module")
def small_task():
    return SearchTask.from_workload("matmul-32")


def make_state(task, outer, inner):
    s = task.compute_dag.init_state()
    s.split(0, 0, [outer])
    s.split(0, 2, [inner])
    s.annotate(0, 0, "parallel")
    return s


@pytest.fixture(scope="module")
def states(task):
    return [make_state(task, a, b) for a, b in FACTORS]


def ok(cost, node=""):
    return MeasureResult((cost, cost * 1.1), ErrorNo.NO_ERROR, all_cost=0.5, timestamp=1.7e9, node=node)


def failed(error_no=ErrorNo.RUNTIME_DEVICE, cost=MAX_COST):
    return MeasureResult((cost,), error_no, error_msg="boom", all_cost=0.5, timestamp=1.7e9)


def write(path, task, states, results):
    save_records(path, [MeasureInput(task, s) for s in states], results)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "ansor" and r.levelno == logging.WARNING]


def test_thousand_records_with_corrupt_and_truncated_lines(tmp_path, task, states, caplog):
    path = tmp_path / "logs" / "tune.json"  # parent folder is created by the writer
    costs = [1e-3 * (1 + (i * 37) % 1000) for i in range(1000)]
    with RecordWriter(path) as writer:
        for i, cost in enumerate(costs):
            writer.write([MeasureInput(task, states[i % 8])], [ok(cost, node=f"n{i % 3}")])
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 1001 and json.loads(lines[0])["workload"] == "matmul-64"
    lines[500] = "#@!garbage{{\n"  # line 501: record index 499
    lines[-1] = lines[-1][: len(lines[-1]) // 2]  # line 1001, torn mid-way, no newline
    path.write_text("".join(lines))

    with caplog.at_level(logging.WARNING, logger="ansor"):
        records = load_records(path)
    assert len(records) == 998
    messages = warnings_of(caplog)
    assert len(messages) == 2
    assert messages[0].startswith(f"{path}:501: skipped corrupt record (not JSON")
    assert messages[1] == f"{path}:1001: skipped corrupt record (truncated line)"

    kept = [i for i in range(1000) if i not in (499, 999)]
    assert [r.result.costs[0] for r in records] == [costs[i] for i in kept]
    for rec, i in zip(records[:16], kept):
        assert rec.steps == tuple(states[i % 8].steps)
        assert rec.result.node == f"n{i % 3}" and rec.result.all_cost == 0.5
    assert len({id(r.task) for r in records}) == 1  # one task per workload per load call
    assert records[3].task.target_str == task.target_str
    assert records[3].task.hardware_params == task.hardware_params
    assert str(records[3].state) == str(states[3])


def test_best_records_ignores_errors_and_uses_mean(tmp_path, task, small_task, states):
    path = tmp_path / "best.json"
    results = [
        MeasureResult((1.0, 3.0), 0),  # mean 2.0, min 1.0
        MeasureResult((1.5, 1.5), 0),  # mean 1.5: the best
        failed(),
        failed(ErrorNo.WRONG_ANSWER, cost=1e-9),  # fast but wrong
        MeasureResult((1.6,), 0),
    ]
    write(path, task, states[:5], results)
    write(path, small_task, [make_state(small_task, 4, 4)], [failed(ErrorNo.BUILD_TIMEOUT)])
    best = best_records(load_records(path))
    assert set(best) == {"matmul-64"}  # no valid record for matmul-32
    assert best["matmul-64"].steps == tuple(states[1].steps)
    assert best["matmul-64"].result.mean_cost == 1.5
    assert best_records(load_records(path, workload_key="matmul-32")) == {}


@pytest.mark.slow
def test_fresh_process_replays_best_state_without_registry(tmp_path, task, states):
    path = tmp_path / "replay.json"
    write(path, task, states, [ok(1e-3 * (8 - i)) for i in range(8)])
    best = states[7]
    mod = task.compute_dag.replay(best).mod
    expect = {"hash": tvm_ffi.structural_hash(mod["main"]), "script": mod.script()}

    code = textwrap.dedent(f"""
        import json, sys
        import ansor.task.workloads
        def forbidden(*args, **kwargs):
            raise AssertionError("the log must be self-contained")
        ansor.task.workloads.get_workload = forbidden
        import tvm_ffi
        from ansor.log.records import best_records, load_records
        rec = best_records(load_records({str(path)!r}))["matmul-64"]
        mod = rec.task.compute_dag.replay(rec.state).mod
        json.dump({{"hash": tvm_ffi.structural_hash(mod["main"]), "script": mod.script()}}, sys.stdout)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == expect


def test_missing_and_unreadable_files_raise(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(RecordError, match=str(missing)):
        load_records(missing)
    with pytest.raises(RecordError, match=str(tmp_path)):
        load_records([tmp_path])  # a directory


def test_empty_file_gives_no_records(tmp_path, caplog):
    path = tmp_path / "empty.json"
    path.write_text("")
    with caplog.at_level(logging.WARNING, logger="ansor"):
        assert load_records(path) == []
        assert load_records([]) == []
    assert warnings_of(caplog) == []


def test_unknown_step_tag_wrong_shape_version_and_missing_workload(tmp_path, task, states, caplog):
    path = tmp_path / "bad.json"
    write(path, task, states[:5], [ok(1.0 + i) for i in range(5)])
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"SP"', '"XX"')
    lines[2] = json.dumps({"i": [["matmul-64"]], "r": [], "v": RECORD_VERSION})
    lines[3] = lines[3].replace(RECORD_VERSION, "v0.6")
    orphan = json.loads(lines[4])
    orphan["i"][0][0] = "matmul-128"  # a key with no workload line in this file
    lines[4] = json.dumps(orphan)
    path.write_text("\n".join(lines) + "\n\n")  # a trailing blank line is not an error
    with caplog.at_level(logging.WARNING, logger="ansor"):
        records = load_records(path)
    assert [r.result.costs[0] for r in records] == [5.0]
    messages = warnings_of(caplog)
    assert len(messages) == 4
    assert messages[0].startswith(f"{path}:2: skipped corrupt record (") and "XX" in messages[0]
    assert messages[1].startswith(f"{path}:3: skipped corrupt record (wrong shape")
    assert messages[2].startswith(f"{path}:4: skipped corrupt record (version 'v0.6'")
    assert messages[3] == f"{path}:5: skipped corrupt record (no usable workload line for 'matmul-128' in this file)"


def test_filter_by_workload_key_and_target(tmp_path, task, small_task, states):
    other = SearchTask.from_workload("matmul-64", target=OTHER_TARGET)
    path_a, path_b = tmp_path / "a.json", tmp_path / "b.json"
    write(path_a, task, states[:3], [ok(1.0)] * 3)
    write(path_a, small_task, [make_state(small_task, 2, 2)], [ok(1.0)])
    write(path_b, other, states[:2], [ok(2.0)] * 2)
    write(path_b, task, states[3:4], [ok(3.0)])

    both = load_records([path_a, path_b])
    assert len(both) == 7
    tasks = {(r.workload_key, r.task.target_str): id(r.task) for r in both}
    assert len(tasks) == 3 and len({id(r.task) for r in both}) == 3  # shared across files
    assert {r.workload_key for r in load_records([path_a, path_b], workload_key="matmul-32")} == {"matmul-32"}
    mine = load_records([path_a, path_b], workload_key="matmul-64", target=task.target)
    assert [r.result.costs[0] for r in mine] == [1.0, 1.0, 1.0, 3.0]
    theirs = load_records([path_a, path_b], target="llvm -mcpu=skylake-avx512 -num-cores=4")
    assert [r.result.costs[0] for r in theirs] == [2.0, 2.0]
    assert theirs[0].task.hardware_params == other.hardware_params
    assert theirs[0].task.hardware_params != task.hardware_params


def test_logged_states_keep_their_identity(tmp_path, task, small_task, states):
    """What resume relies on: a record's steps are its state's key (``State.key``), failed ones included."""
    path = tmp_path / "resume.json"
    write(path, task, states[:4], [ok(1.0), failed(), ok(2.0), ok(3.0)])
    seen = {(r.workload_key, r.steps) for r in load_records(path)}
    assert len(seen) == 4
    for s in states[:4]:
        assert ("matmul-64", s.key()) in seen
        assert ("matmul-64", s.with_steps(s.steps).key()) in seen  # equal steps, new object
    assert ("matmul-64", states[4].key()) not in seen
    assert ("matmul-32", tuple(states[0].steps)) not in seen


def test_distill_keeps_best_distinct_states(tmp_path, task, small_task, states):
    path_a, path_b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "out" / "best.json"
    write(path_a, task, states, [ok(1e-3 * (8 - i)) for i in range(8)])
    small = [make_state(small_task, a, b) for a, b in ((2, 2), (4, 4), (8, 8))]
    write(path_b, small_task, small, [ok(3.0), failed(ErrorNo.WRONG_ANSWER, 1e-9), ok(1.0)])
    write(path_b, task, [states[7]], [ok(5e-4)])  # same state as the best of a.json, measured again

    assert distill([path_a, path_b], out) == 2
    lines = out.read_text().splitlines()
    assert sum('"workload"' in line[:12] for line in lines) == 2
    best = best_records(load_records(out))
    assert best["matmul-64"].steps == tuple(states[7].steps) and best["matmul-64"].result.costs[0] == 5e-4
    assert best["matmul-32"].steps == tuple(small[2].steps)

    assert distill([path_a, path_b], out, top_k=2) == 4  # states[7] counted once, then states[6]
    kept = load_records(out)
    assert [r.steps for r in kept if r.workload_key == "matmul-64"] == [tuple(states[7].steps),
                                                                        tuple(states[6].steps)]
    distill(out, out)  # in place
    assert len(load_records(out)) == 2
    with pytest.raises(ValueError):
        distill(out, out, top_k=0)


def test_writer_appends_without_duplicating_workload_line(tmp_path, task, small_task, states, caplog):
    path = tmp_path / "append.json"
    write(path, task, states[:3], [ok(1.0)] * 3)
    with RecordWriter(path) as writer:
        writer.write([MeasureInput(task, s) for s in states[3:6]], [ok(2.0)] * 3)
        writer.write([MeasureInput(small_task, make_state(small_task, 2, 2))], [ok(3.0)])
    keys = [json.loads(line).get("workload") for line in path.read_text().splitlines()]
    assert [k for k in keys if k] == ["matmul-64", "matmul-32"]
    assert len(load_records(path)) == 7

    with open(path, "a") as f:  # a crash mid-write leaves a torn last line
        f.write('{"i": [["matmul-64"')
    write(path, task, states[6:7], [ok(4.0)])
    with caplog.at_level(logging.WARNING, logger="ansor"):
        records = load_records(path)
    assert len(records) == 8 and records[-1].result.costs[0] == 4.0
    assert len(warnings_of(caplog)) == 1  # only the torn line is lost


def test_writer_checks_arguments_and_close(tmp_path, task, states):
    writer = RecordWriter(tmp_path / "w.json", fsync=True)
    with pytest.raises(RecordError, match="w.json"):
        writer.write([MeasureInput(task, states[0])], [])
    writer.write([MeasureInput(task, states[0])], [ok(1.0)])
    writer.close()
    writer.close()
    with pytest.raises(RecordError, match="closed"):
        writer.write([MeasureInput(task, states[0])], [ok(1.0)])
    (rec,) = load_records(tmp_path / "w.json")
    assert rec.result.error_no is ErrorNo.NO_ERROR
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RecordError, match=str(blocker)):
        RecordWriter(blocker / "log.json")  # parent is a file


def test_record_state_is_rebuilt_lazily(tmp_path, task, states):
    path = tmp_path / "lazy.json"
    write(path, task, states[:1], [ok(1.0)])
    (rec,) = load_records(path)
    assert isinstance(rec, Record) and "state" not in vars(rec)
    assert rec.state is rec.state and rec.state.key() == states[0].key()
    tvm.ir.assert_structural_equal(rec.task.func, task.func)


def test_bad_workload_line_and_same_key_with_another_program(tmp_path, task, small_task, states, caplog):
    bad, path_a, path_b = tmp_path / "bad.json", tmp_path / "a.json", tmp_path / "b.json"
    write(bad, task, states[:1], [ok(1.0)])
    lines = bad.read_text().splitlines()
    head = json.loads(lines[0])
    head["prim_func"] = "{not a graph"
    bad.write_text(json.dumps(head) + "\n" + lines[1] + "\n")
    with caplog.at_level(logging.WARNING, logger="ansor"):
        assert load_records(bad) == []
    messages = warnings_of(caplog)
    assert len(messages) == 2 and "cannot load prim_func" in messages[0]
    assert messages[1].endswith("(no usable workload line for 'matmul-64' in this file)")

    caplog.clear()
    impostor = SearchTask(small_task.func, task.target, workload_key="matmul-64")  # same key, other program
    write(path_a, task, states[:1], [ok(1.0)])
    write(path_b, impostor, [make_state(impostor, 2, 2)], [ok(2.0)])
    with caplog.at_level(logging.WARNING, logger="ansor"):
        first, second = load_records([path_a, path_b])
    assert first.task is not second.task
    tvm.ir.assert_structural_equal(second.task.func, small_task.func)
    (message,) = warnings_of(caplog)
    assert message.startswith(f"{path_b}:1: workload 'matmul-64' is a different program")


# --------------------------------------------------------------------------------- appending to old logs
def _rewrite_workload_line(path, change):
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    change(head)
    path.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")


@pytest.mark.parametrize("damage", [
    lambda head: head.update(v="ansor-0.0"),  # written by another version of the format
    lambda head: head.update(prim_func=head["prim_func"].replace('"ir.IntImm"', '"ir.NoSuchImm"')),  # another TVM
], ids=["other version", "unloadable prim_func"])
def test_appending_after_a_version_change_keeps_new_records_readable(tmp_path, task, states, damage, caplog):
    path = tmp_path / "old.json"
    write(path, task, states[:2], [ok(1.0), ok(2.0)])
    _rewrite_workload_line(path, damage)
    write(path, task, states[2:4], [ok(3.0), ok(4.0)])
    workload_lines = [line for line in path.read_text().splitlines() if line.startswith('{"workload"')]
    assert len(workload_lines) == 2  # a fresh, loadable one before the new records
    with caplog.at_level(logging.WARNING, logger="ansor"):
        records = load_records(path)
    costs = [r.result.costs[0] for r in records]
    assert costs[-2:] == [3.0, 4.0] and [r.steps for r in records[-2:]] == [tuple(s.steps) for s in states[2:4]]
    assert warnings_of(caplog)[0].startswith(f"{path}:1: skipped corrupt record")
    write(path, task, states[4:5], [ok(5.0)])  # the fresh line is now the usable one: not written again
    assert sum(line.startswith('{"workload"') for line in path.read_text().splitlines()) == 2


def test_same_key_now_another_program_gets_its_own_workload_line(tmp_path, task, small_task, states):
    path = tmp_path / "redefined.json"
    write(path, task, states[:2], [ok(1.0), ok(2.0)])
    impostor = SearchTask(small_task.func, task.target, workload_key="matmul-64")  # the key's program changed
    write(path, impostor, [make_state(impostor, 2, 2)], [ok(3.0)])
    write(path, impostor, [make_state(impostor, 4, 4)], [ok(4.0)])  # its line is now the key's last one
    assert sum(line.startswith('{"workload"') for line in path.read_text().splitlines()) == 2
    records = load_records(path)
    assert [r.result.costs[0] for r in records] == [1.0, 2.0, 3.0, 4.0]
    for rec, func in zip(records, [task.func, task.func, small_task.func, small_task.func]):
        tvm.ir.assert_structural_equal(rec.task.func, func)  # each record read with the program it measured
    assert str(records[3].state) == str(make_state(impostor, 4, 4))


def test_unchecked_results_round_trip(tmp_path, task, states):
    path = tmp_path / "unchecked.json"
    unchecked = MeasureResult((1e-3,), ErrorNo.NO_ERROR, checked=False)
    write(path, task, states[:2], [ok(2e-3), unchecked])
    lines = path.read_text().splitlines()
    assert "unchecked" not in lines[1] and json.loads(lines[2])["unchecked"] == 1
    assert [r.result.checked for r in load_records(path)] == [True, False]


# ------------------------------------------------------------------------------------ locking and sync
@pytest.mark.slow
def test_second_writer_is_refused_across_processes(tmp_path, task, states):
    path = tmp_path / "locked.json"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from ansor.log.records import RecordWriter
        with RecordWriter({str(path)!r}):
            print("open", flush=True)
            sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(RecordError, match=rf"^{path} is being written by another tuner \(pid {holder.pid}\); "
                                              "use another --log-file"):
            RecordWriter(path)
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    write(path, task, states[:1], [ok(1.0)])  # the lock went with the other process
    assert len(load_records(path)) == 1


def test_sync_fsyncs_only_what_is_new(tmp_path, task, states, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    with RecordWriter(tmp_path / "sync.json") as writer:
        writer.write([MeasureInput(task, s) for s in states[:3]], [ok(1.0)] * 3)
        assert synced == []
        writer.sync()
        writer.sync()  # nothing new: no second fsync
        assert len(synced) == 1
        writer.write([MeasureInput(task, states[3])], [ok(1.0)])
    assert len(synced) == 2  # close syncs the last record
    with RecordWriter(tmp_path / "each.json", fsync=True) as writer:
        writer.write([MeasureInput(task, s) for s in states[:3]], [ok(1.0)] * 3)
    assert len(synced) == 5


# ------------------------------------------------------------------------------------------ resuming
def test_resume_counts_each_state_once(tmp_path, task, states):
    from ansor.cost_model import RandomModel
    from ansor.tuning import TuningOptions, auto_schedule

    path = tmp_path / "twice.json"
    write(path, task, states[:4], [ok(1.0), ok(2.0), failed(), ok(3.0)])
    write(path, task, states[:4], [ok(1.5), ok(0.5), ok(2.5), failed()])  # a second tuner measured them again
    records = load_records(path)
    distinct = distinct_records(records)
    assert len(records) == 8 and len(distinct) == 4
    assert [r.result.mean_cost for r in distinct] == pytest.approx([1.05, 0.525, 2.625, 3.15])  # best valid each
    # Four distinct states meet a budget of four: nothing is measured (no measurer is even needed).
    result = auto_schedule(task, TuningOptions(num_measure_trials=4), measurer=None, model=RandomModel(),
                           resume_from=str(path))
    assert result.resumed == result.trials == 4 and result.rounds == []
    assert result.best_state.steps == states[1].steps and result.best_cost == pytest.approx(0.525)


@pytest.mark.slow
def test_resume_for_another_target_names_the_targets_the_log_holds(tmp_path, task, states, caplog, local_ray):
    from ansor.cost_model import RandomModel
    from ansor.measure import ProgramMeasurer
    from ansor.tuning import TuningOptions, auto_schedule, log_history

    other = SearchTask.from_workload("matmul-64", target=OTHER_TARGET)
    path = tmp_path / "other.json"
    write(path, other, states[:3], [ok(1.0)] * 3)
    assert log_targets(path) == {other.target_str: 3}
    assert log_targets(path, {"matmul-32"}) == {}
    with caplog.at_level(logging.WARNING, logger="ansor"):
        with ProgramMeasurer(min_repeat_ms=1) as measurer:  # one real trial: the resume found nothing
            result = auto_schedule(task, TuningOptions(num_measure_trials=1, num_measures_per_round=1), measurer,
                                   model=RandomModel(), resume_from=str(path))
        # A network's resume (ansor.relax.tune_tasks) reads its log the same way, for all its tasks at once.
        assert log_history(path, [task, SearchTask.from_workload("matmul-32", target=task.target)]) == []
    assert result.resumed == 0
    notes = warnings_of(caplog)
    assert len(notes) == 2
    for note in notes:
        assert note.startswith(f"resuming nothing: {path} holds no record of these tasks for target "
                               f"{task.target_str}, but 3 for {other.target_str}")
        assert note.endswith(f"tune with --target '{other.target_str}'")
    assert other_targets_message(path, other.target) is None  # records of the target asked for: no note


def test_a_log_names_its_writer_and_another_writers_log_loads_with_one_note(tmp_path, task, states, caplog):
    """Workload lines record the ansor and TVM versions; a log of other versions loads, noted once per log."""
    from ansor.version import writer
    log = tmp_path / "old.json"
    write(log, task, states, [ok(1e-3 * (i + 1)) for i in range(len(states))])
    lines = log.read_text().splitlines()
    workload = json.loads(lines[0])
    assert workload["writer"] == writer() and "ansor " in writer() and ", tvm " in writer()
    workload["writer"] = "ansor 0.0.1, tvm 0.20.0"
    # The same workload line again, later in the file, as an append by that older version would leave it.
    log.write_text("\n".join([json.dumps(workload), *lines[1:], json.dumps(workload), *lines[1:]]) + "\n")
    caplog.set_level(logging.WARNING, logger="ansor")
    for _ in range(2):
        assert len(load_records(log)) == 2 * len(states)
    notes = [m for m in warnings_of(caplog) if "written by" in m]
    assert notes == [f"{log} was written by ansor 0.0.1, tvm 0.20.0 (this is {writer()}); its records are read "
                     "as they are"]
    del workload["writer"]  # logs older than the field: no note, they load as before
    log.write_text("\n".join([json.dumps(workload), *lines[1:]]) + "\n")
    caplog.clear()
    assert len(load_records(log)) == len(states) and not warnings_of(caplog)


ZEN3 = MachineFacts("AMD EPYC", ("fma", "avx2"), 2, (32, 512, 32768))
XEON = MachineFacts("Intel Xeon", ("fma", "avx2", "avx512f", "amx_tile"), 2, (48, 2048, 107520))


def test_records_keep_the_machine_they_were_measured_on(tmp_path, task, states):
    """The writer's machine goes on the workload line once; appending from another machine writes a new
    workload line, so each record loads with its own machine; a copied record keeps its machine."""
    path = tmp_path / "machines.json"
    with RecordWriter(path, machine=ZEN3) as writer:
        writer.write([MeasureInput(task, s) for s in states[:2]], [ok(1.0)] * 2)
    with RecordWriter(path, machine=ZEN3) as writer:  # the same machine resuming: no new workload line
        writer.write([MeasureInput(task, states[2])], [ok(1.0)])
    with RecordWriter(path, machine=XEON) as writer:
        writer.write([MeasureInput(task, states[3])], [ok(0.5)])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["machine"]["cpu"] for line in lines if "workload" in line] == ["AMD EPYC", "Intel Xeon"]
    records = load_records(path)
    assert [r.machine for r in records] == [ZEN3, ZEN3, ZEN3, XEON]
    distill(path, tmp_path / "best.json", top_k=4)
    copied = load_records(tmp_path / "best.json")
    assert {(r.steps, r.machine) for r in copied} == {(r.steps, r.machine) for r in records}


@pytest.mark.parametrize("machine", [None, "x86", {"cpu": "Zen", "isa": 3}, {"cpu": "Zen", "isa": [], "cores": -1,
                                                                              "caches_kib": [1, 2, 3]}])
def test_a_missing_or_damaged_machine_field_never_stops_a_record_loading(tmp_path, task, states, machine):
    path = tmp_path / "old.json"
    write(path, task, states[:2], [ok(1.0)] * 2)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert "machine" not in lines[0]  # no machine given to the writer: it says nothing
    if machine is not None:
        lines[0]["machine"] = machine
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = load_records(path)
    assert len(records) == 2 and all(r.machine is None for r in records)
    assert MachineFacts.from_json(ZEN3.to_json()) == ZEN3
