"""The headroom benchmark (ansor/bench/headroom.py): the ceiling arithmetic, and real in-place profiles of a
tiny CNN's two builds taken apart into its tasks."""

import pytest

from ansor.bench.headroom import Headroom, KernelTime, headroom, main, profile_in_turn
from ansor.networks import apply_schedules, build, extract, get_network

TARGET = {"kind": "llvm", "num-cores": 2}


def test_ceiling_puts_tiled_kernels_at_the_peak_and_keeps_faster_ones():
    h = Headroom("net", (KernelTime("conv", True, 1.0, 6.0, 4.0), KernelTime("pool", False, 0.01, 2.0, 1.0)),
                 default_ms=10.0, tuned_ms=5.0, ratio=2.0)
    assert h.tiled("tuned") == 4.0 and h.tiled("default") == 6.0
    assert h.fraction_of_peak("tuned", 500.0) == pytest.approx(0.5)  # 1 GFLOP in 4 ms = 250 GFLOPS
    assert h.ceiling(500.0) == pytest.approx(10.0 / (1.0 + 2.0))  # conv at 500 GFLOPS: 2 ms
    assert h.ceiling(500.0, 0.9) == pytest.approx(10.0 / (1.0 + 2.0 / 0.9))
    # A kernel already faster than the peak fraction would allow keeps its own time.
    assert h.ceiling(100.0) == pytest.approx(10.0 / 5.0)


@pytest.mark.slow
def test_headroom_of_real_profiles_covers_every_task():
    net = get_network("tiny-cnn", 1)
    ex = extract(net, TARGET)
    naive = {t.workload_key: t.task.compute_dag.init_state() for t in ex.tasks}
    builds = [build(apply_schedules(ex.mod, ex.tasks, naive, target=TARGET), TARGET),
              build(apply_schedules(ex.mod, ex.tasks, {}, target=TARGET), TARGET)]
    default, tuned = profile_in_turn(builds, ex.network, TARGET, rounds=2, repeat=2)
    assert len(default) == len(tuned) == 2
    h = headroom("tiny-cnn", ex, default, tuned)
    assert [k.name for k in h.kernels] == [t.name for t in ex.tasks]
    assert sum(k.gflop for k in h.kernels) == pytest.approx(sum(t.weight * t.task.flop_ct for t in ex.tasks) / 1e9)
    tiled = {k.name for k in h.kernels if k.tiled}
    assert tiled and all("pool" not in name for name in tiled)
    assert any("conv2d" in name for name in tiled)
    assert all(k.default_ms > 0 and k.tuned_ms > 0 for k in h.kernels)
    # The VM's own calls (allocation) count in both sums, beyond the kernels.
    assert h.default_ms > sum(k.default_ms for k in h.kernels) and h.ratio > 0
    assert h.ceiling(1e9) >= h.ceiling(1e9, 0.5) >= h.default_ms / h.tuned_ms - 1e-12


def test_a_model_that_does_not_import_is_one_error_line_before_any_timing(tmp_path, capsys):
    onnx, log = tmp_path / "broken.onnx", tmp_path / "broken.json"
    onnx.write_bytes(b"not a protobuf")
    log.write_text("")
    assert main(["--pair", str(onnx), str(log)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "broken.onnx" in err[0]
