"""``ansor bench --target cuda`` (ansor/bench/gpu.py) without a GPU: its refusals are one ``error:`` line and exit
status 2 (a machine without a GPU, the CPU benchmarks' flags); its model run, on this CPU, with the log of a
real ``ansor tune --no-eval`` run (what it tunes with)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tvm

from ansor.bench.gpu import DEFAULT, OURS, TORCH_ROWS
from ansor.log.records import load_records

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "bench" / "bench_network.py"  # = ansor bench
#: The model run on a log, in a process of its own: timing TVM in the test's process would pin it to TVM's
#: first cores, and later runs from it would see a 1-core host.
GPU_FLOW = """
import argparse, dataclasses, json, sys
from pathlib import Path
from ansor.bench.gpu import bench_gpu_model
from ansor.target import host_target
args = argparse.Namespace(log=sys.argv[1], repeat=2, rounds=2, pause=0.0)
print(json.dumps(dataclasses.asdict(bench_gpu_model("tiny-cnn", args, host_target(), Path(sys.argv[1]).parent))))
"""


def env(**extra: str) -> dict:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, **extra}


@pytest.fixture(scope="module")
def no_eval_run(tmp_path_factory):
    log = tmp_path_factory.mktemp("no-eval") / "tiny.json"
    proc = subprocess.run([sys.executable, "-m", "ansor", "tune", "--network", "tiny-cnn", "--n-trials", "2",
                           "--per-round", "2", "--no-eval", "--log-file", str(log)],
                          capture_output=True, text=True, timeout=300, env=env(), cwd=ROOT)
    return log, proc


@pytest.mark.slow
def test_no_eval_tunes_and_stops(no_eval_run):
    """``ansor tune --no-eval``: the log and the tasks' table, no final builds."""
    log, proc = no_eval_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(load_records(log)) == 2 and re.search(r"^tuning: 2 new trials", proc.stderr, re.M), proc.stderr
    assert "building the default and the tuned network" not in proc.stderr
    assert "Mean inference time" not in proc.stdout and "Estimated total latency" in proc.stdout


@pytest.mark.slow
def test_the_model_run_on_the_cpu(no_eval_run):
    """The same code as on a GPU up to the device: each contender timed every round, PyTorch's rows timed or
    said missing (tiny-cnn has no PyTorch definition)."""
    log, proc = no_eval_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    flow = subprocess.run([sys.executable, "-c", GPU_FLOW, str(log)], capture_output=True, text=True, timeout=300,
                          env=env(TVM_NUM_THREADS=str(os.cpu_count())), cwd=ROOT)
    assert flow.returncode == 0, flow.stderr[-3000:]
    report = json.loads(flow.stdout.splitlines()[-1])
    assert (report["trials"], report["failed"]) == (2, 0) and report["tuning_s"] > 0
    assert report["outputs_agree"].startswith("equal"), report["outputs_agree"]
    assert [len(report["rounds"][name]) for name in (OURS, DEFAULT)] == [2, 2]
    assert all(ms > 0 for times in report["rounds"].values() for ms in times)
    for row in TORCH_ROWS.values():
        assert row not in report["rounds"] and report["missing"][row], report["missing"]
NO_GPU = ("error: --target cuda times the tuned network on this machine's GPU, and TVM finds no CUDA device "
          "here; run it on the GPU machine")
CASES = [
    (["--zoo"], "--zoo is for CPU benchmarks"),
    (["--metaschedule"], "--metaschedule is for CPU benchmarks"),
    (["--precision", "bf16"], "float32 only"),
    (["--models", "tiny-cnn"], "no PyTorch definition of tiny-cnn (choose from resnet-50"),
    (["--models", "resnet-50", "bert", "--log", __file__], "--log evaluates one model"),
]


@pytest.fixture(scope="module")
def refusals(run_main_per_case, tmp_path_factory):
    """Every case, the machine without a GPU last, in one process."""
    cases = [["--target", "cuda", *flags] for flags, _ in CASES]
    cases.append(["--target", "cuda", "--models", "resnet-50", "--minutes", "1"])
    return run_main_per_case(BENCH, cases, tmp_path_factory.mktemp("bench-gpu"))


@pytest.mark.parametrize("case", range(len(CASES)), ids=[" ".join(flags) for flags, _ in CASES])
def test_flags_it_cannot_honour_are_one_error_line(refusals, case):
    code, stderr = refusals[case]
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and CASES[case][1] in lines[0], stderr


@pytest.mark.skipif(tvm.cuda(0).exist, reason="this machine has a GPU: the benchmark would run")
def test_without_a_gpu_it_is_one_error_line(refusals):
    code, stderr = refusals[-1]
    assert code == 2 and stderr.strip().splitlines() == [NO_GPU], stderr
