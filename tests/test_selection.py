"""Network-level selection on tiny-cnn with real builds and timings, and the selection records in the log.

The logs here lie on purpose (a fault injected into the data): a naive single-threaded program is logged
as its task's fastest state. Timed alone it would win the ranking; inside the network it is several times
slower than the default schedule, and the selection must see that, and keep only what is faster there.
"""

import json
import os

import pytest
import tvm_ffi
from tvm import te

from ansor.log.measurement import ErrorNo, MeasureResult
from ansor.log.records import RecordWriter, best_records, load_records
from ansor.networks import apply_history_best, apply_schedules, build, default_state, extract, get_network
from ansor.networks.selection import compare_builds, select_in_network
from ansor.state.transform_steps import SplitStep
from ansor.task.search_task import SearchTask
from ansor.target import host_target


@pytest.fixture(scope="module")
def tiny():
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    target = host_target()
    # Its larger convolution kept direct: 2.4 MFLOP, where a naive scalar program loses to the default
    # schedule by several times on any machine (the 0.9 MFLOP stem's naive program beat it on a Zen 3).
    ex = extract(get_network("tiny-cnn", 1), target, winograd=False)
    conv = max((t for t in ex.tasks if t.name.startswith("fused_conv2d_add_relu")), key=lambda t: t.task.flop_ct)
    return ex, conv, target


def write(log, task, entries):
    """Records of ``task``: (steps, cost in seconds, timestamp, in_network) each."""
    with RecordWriter(log) as writer:
        for steps, cost, stamp, net in entries:
            writer.write_record(task, steps, MeasureResult((cost,), ErrorNo.NO_ERROR, timestamp=stamp, in_network=net))


@pytest.mark.timing
@pytest.mark.slow
def test_the_state_fastest_in_the_network_is_selected_and_applied(tiny, tmp_path):
    ex, conv, target = tiny
    naive, good = (), tuple(default_state(conv.task).steps)
    log = tmp_path / "lying.json"
    write(log, conv.task, [(naive, 1e-6, 100.0, False), (good, 2e-6, 101.0, False)])
    assert best_records(load_records(log))[conv.workload_key].steps == naive  # what tuning alone would run

    selection = select_in_network(ex, [log], log, target, candidates=2)
    assert selection.tasks == 1 and selection.variants == 2
    assert selection.changed == (conv.name,)
    assert selection.kept and selection.selected_ms < selection.best_ms, selection
    assert len(load_records(log)) == 2  # selection records are not measurements
    chosen = best_records(load_records(log, selections=True))[conv.workload_key]
    assert chosen.result.in_network and chosen.steps == good
    # apply_history_best (and so ansor tune, evaluate, export) runs the selected state.
    applied = apply_history_best(ex.mod, ex.tasks, log, target=target)
    expected = apply_schedules(ex.mod, ex.tasks, {conv.workload_key: default_state(conv.task)}, target=target)
    for name in conv.global_vars:
        assert tvm_ffi.structural_equal(applied[name], expected[name])


@pytest.mark.timing
@pytest.mark.slow
def test_a_slower_state_is_never_selected(tiny, tmp_path):
    ex, conv, target = tiny
    naive, good = (), tuple(default_state(conv.task).steps)
    log = tmp_path / "honest.json"
    write(log, conv.task, [(good, 1e-6, 100.0, False), (naive, 2e-6, 101.0, False)])
    selection = select_in_network(ex, [log], log, target, candidates=2)
    assert selection.changed == () and not selection.kept, selection
    assert best_records(load_records(log, selections=True))[conv.workload_key].steps == good


@pytest.mark.timing
@pytest.mark.slow
def test_a_record_that_does_not_replay_is_skipped_with_a_warning(tiny, tmp_path, caplog):
    """Its steps name a stage the task lacks: the selection warns and ranks the other records."""
    ex, conv, target = tiny
    naive, good = (), tuple(default_state(conv.task).steps)
    bad = (SplitStep(len(conv.task.compute_dag.stages) + 5, 0, 4, (2,)),)
    log = tmp_path / "foreign.json"
    write(log, conv.task, [(bad, 0.5e-6, 99.0, False), (naive, 1e-6, 100.0, False), (good, 2e-6, 101.0, False)])
    with caplog.at_level("WARNING", logger="ansor"):
        selection = select_in_network(ex, [log], log, target, candidates=2)
    assert "does not replay" in caplog.text
    assert selection.variants == 2 and selection.changed == (conv.name,), selection


@pytest.mark.timing
@pytest.mark.slow
def test_a_combination_slower_end_to_end_is_not_kept(tiny):
    ex, conv, target = tiny
    fast = build(apply_schedules(ex.mod, ex.tasks, {}, target=target), target)
    slow = build(apply_schedules(ex.mod, ex.tasks, {conv.workload_key: ()}, target=target), target)
    best_ms, selected_ms, kept = compare_builds(fast, slow, ex.network, target, rounds=3)
    assert selected_ms > best_ms and not kept
    best_ms, selected_ms, kept = compare_builds(slow, fast, ex.network, target, rounds=3)
    assert selected_ms < best_ms and kept


def matmul_task() -> SearchTask:
    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return SearchTask(te.create_prim_func([a, b, c]), "llvm -num-cores=2")


def split(task: SearchTask, factor: int) -> tuple:
    s = task.compute_dag.init_state()
    s.split(0, 0, [factor])
    return tuple(s.steps)


def test_a_selection_stands_until_a_faster_state_is_measured_after_it(tmp_path):
    task = matmul_task()
    a, b, c = split(task, 2), split(task, 4), split(task, 8)
    log = tmp_path / "log.json"
    write(log, task, [(a, 1e-3, 100.0, False), (b, 2e-3, 101.0, False), (b, 2.5e-3, 200.0, True)])
    assert best_records(load_records(log, selections=True))[task.workload_key].steps == b
    write(log, task, [(c, 3e-3, 300.0, False)])  # measured later but slower: the selection stands
    assert best_records(load_records(log, selections=True))[task.workload_key].steps == b
    write(log, task, [(c, 0.5e-3, 400.0, False)])  # faster, never seen in the network: measurements decide
    assert best_records(load_records(log, selections=True))[task.workload_key].steps == c
    write(log, task, [(a, 1.1e-3, 500.0, True)])  # a later selection wins again
    best = best_records(load_records(log, selections=True))[task.workload_key]
    assert best.steps == a and best.result.in_network
    assert best_records(load_records(log))[task.workload_key].steps == c  # measurements alone


@pytest.mark.parametrize("net, error_no, reason", [(2, 0, "net must be 0 or 1"), ("1", 0, "net must be 0 or 1"),
                                                   (1, 4, "0 for a failure")])
def test_a_bad_selection_flag_is_skipped_with_a_warning(tmp_path, caplog, net, error_no, reason):
    task = matmul_task()
    log = tmp_path / "log.json"
    write(log, task, [(split(task, 2), 1e-3, 100.0, True)])
    lines = log.read_text().splitlines()
    obj = json.loads(lines[-1])
    obj["net"], obj["r"][1] = net, error_no
    log.write_text("\n".join([*lines[:-1], json.dumps(obj)]) + "\n")
    assert load_records(log, selections=True) == []
    assert reason in caplog.text and "log.json:2" in caplog.text
