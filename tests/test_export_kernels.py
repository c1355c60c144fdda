"""scripts/export_kernels.py as a user runs it: CPU and CUDA logs, the index, and bad input."""

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ansor.task import program
from ansor.log.measurement import ErrorNo, MeasureResult
from ansor.log.records import RecordWriter
from ansor.task.search_task import SearchTask
from ansor.sketch.search_space import generate_sketches, sample_initial_population

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "export_kernels.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "TVM_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def cpu_log(tmp_path_factory):
    """A log of three matmul-64 programs timed here (in-process), plus one failed record."""
    task = SearchTask.from_workload("matmul-64", "llvm -num-cores=1")
    states = sample_initial_population(task, generate_sketches(task), 3, random.Random(0))
    path = tmp_path_factory.mktemp("cpu") / "matmul-64.json"
    with RecordWriter(path) as writer:
        for state in states:
            args = program.random_inputs(task)
            cost = program.time_module(program.build_program(task, state), args, repeat=3, min_repeat_ms=5)
            writer.write_record(task, state.steps, MeasureResult((cost,), ErrorNo.NO_ERROR))
        writer.write_record(task, states[0].steps, MeasureResult((1e10,), ErrorNo.RUNTIME_DEVICE, "crashed"))
    return path


@pytest.mark.slow
def test_cpu_log_exports_llvm_ir_assembly_tvmscript_and_index(cpu_log, tmp_path):
    out = tmp_path / "kernels"
    proc = run(str(cpu_log), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    index = json.loads((out / "index.json").read_text())
    assert len(index) == 1
    entry = index[0]
    assert entry["workload_key"] == "matmul-64"
    from ansor.version import writer
    assert entry["writer"] == writer()  # which ansor and TVM made the files
    assert entry["args"] == [{"name": n, "shape": [64, 64], "dtype": "float32"} for n in ("A", "B", "C")]
    assert 0 < entry["latency_s"] < 1 and "launch" not in entry
    assert set(entry["files"]) == {"tvmscript", "llvm_ir", "asm"}
    assert "target triple" in (out / entry["files"]["llvm_ir"]).read_text()
    assert ".text" in (out / entry["files"]["asm"]).read_text()
    assert "T.prim_func" in (out / entry["files"]["tvmscript"]).read_text()
    costs = [json.loads(line)["r"][0][0] for line in cpu_log.read_text().splitlines() if line.startswith('{"i"')]
    assert entry["latency_s"] == min(c for c in costs if c < 1e9)  # the best valid record, not the failed one


@pytest.mark.slow
def test_cuda_log_exports_source_that_nvcc_compiles(tmp_path):
    """The record's cost is a placeholder: there is no GPU here to time it, and export only reads the cost.

    The exported .cu must compile with nvcc on its own (skipped only if nvcc is missing).
    """
    task = SearchTask.from_workload("conv2d-bias-relu", "cuda -arch=sm_80")
    state = sample_initial_population(task, generate_sketches(task), 1, random.Random(3))[0]
    log = tmp_path / "cuda.json"
    with RecordWriter(log) as writer:
        writer.write_record(task, state.steps, MeasureResult((1e-5,), ErrorNo.NO_ERROR))
    out = tmp_path / "kernels"
    proc = run(str(log), "--out", str(out), "--target", "cuda -arch=sm_80")
    assert proc.returncode == 0, proc.stderr
    entry = json.loads((out / "index.json").read_text())[0]
    assert set(entry["files"]) == {"tvmscript", "cuda"}
    launch = entry["launch"]
    assert len(launch) == 1 and launch[0]["grid"][0] >= 1 and 1 <= launch[0]["block"][0] <= 1024
    source = (out / entry["files"]["cuda"]).read_text()
    assert f"__launch_bounds__({launch[0]['block'][0]})" in source
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed: the CUDA source was exported but not compiled")
    done = subprocess.run([nvcc, "-arch=sm_80", "-c", str(out / entry["files"]["cuda"]), "-o",
                           str(tmp_path / "k.o")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _one_line_exit_2(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_log_is_exit_2(tmp_path):
    _one_line_exit_2(run(str(tmp_path / "nope.json"), "--out", str(tmp_path / "k")), "does not exist")


@pytest.mark.slow
def test_corrupt_log_is_exit_2(tmp_path):
    log = tmp_path / "bad.json"
    log.write_text("not json\n{\"i\": 3}\n")
    _one_line_exit_2(run(str(log), "--out", str(tmp_path / "k")), "no valid record")


@pytest.mark.slow
def test_log_with_only_failed_records_is_exit_2(tmp_path):
    task = SearchTask.from_workload("matmul-64", "llvm -num-cores=1")
    log = tmp_path / "failed.json"
    with RecordWriter(log) as writer:
        writer.write_record(task, [], MeasureResult((1e10,), ErrorNo.COMPILE_HOST, "did not build"))
    _one_line_exit_2(run(str(log), "--out", str(tmp_path / "k")), "no valid record")


@pytest.mark.slow
def test_unknown_workload_is_exit_2(cpu_log, tmp_path):
    _one_line_exit_2(run(str(cpu_log), "--out", str(tmp_path / "k"), "--workload", "matmul-128"), "matmul-128")


def test_out_that_is_a_file_is_exit_2(cpu_log, tmp_path):
    out = tmp_path / "file"
    out.write_text("")
    _one_line_exit_2(run(str(cpu_log), "--out", str(out)), "is not a directory")


def test_help_explains_every_flag():
    proc = run("--help")
    assert proc.returncode == 0
    for flag in ("LOG", "--out", "--target", "--workload", "--verbose"):
        assert flag in proc.stdout
