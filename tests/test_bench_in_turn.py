"""ansor.bench.in_turn: builds of tuning logs timed in turn, in fresh processes, on a tiny real network."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx package is not installed (pip install 'ansor[onnx]')")
from onnx import TensorProto as TP, helper as h, numpy_helper as nh  # noqa: E402

from ansor.bench.in_turn import in_turn, time_in_processes  # noqa: E402


@pytest.fixture
def tiny_onnx(tmp_path):
    weight = nh.from_array(np.random.default_rng(0).standard_normal((64, 32)).astype("float32"), "w")
    graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("Relu", ["y"], ["z"])], "tiny",
                         [h.make_tensor_value_info("x", TP.FLOAT, [8, 64])],
                         [h.make_tensor_value_info("z", TP.FLOAT, [8, 32])], [weight])
    path = tmp_path / "tiny.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.slow
def test_each_process_times_every_log_in_every_round(tiny_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    log = tmp_path / "empty.json"  # no records: the default schedules
    log.write_text("")
    per_process = time_in_processes(tiny_onnx, [log, log], processes=2, rounds=2, repeat=1)
    assert len(per_process) == 2
    for rounds in per_process:
        assert len(rounds) == 2
        assert all(len(times) == 2 and all(0 < t < 1000 for t in times) for times in rounds)


@pytest.mark.slow
def test_a_failing_process_names_its_error(tiny_onnx, tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(RuntimeError, match="missing.json"):
        time_in_processes(tiny_onnx, [missing], processes=1, rounds=1, repeat=1)


def test_rounds_start_with_each_contender_in_turn():
    order = []
    timed = in_turn({name: (lambda n=name: order.append(n) or float(len(order))) for name in "abc"}, 4, 0.0)
    assert order == list("abc" "bca" "cab" "abc")
    assert timed == {"a": [1.0, 6.0, 8.0, 10.0], "b": [2.0, 4.0, 9.0, 11.0], "c": [3.0, 5.0, 7.0, 12.0]}
