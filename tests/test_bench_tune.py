"""scripts/bench/bench_tune.py's bf16 comparison where it cannot run: a CPU without a bf16 unit, PyTorch not
installed. (Its timings are benchmarks, run by hand: docs/benchmarking.md.)"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from ansor.host_cpu import host_cpu

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "bench_tune.py"


def bench_tune():
    spec = importlib.util.spec_from_file_location("bench_tune", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_bf16_on_a_cpu_without_the_unit_is_one_error_line():
    if "avx512_bf16" in host_cpu().flags:
        pytest.skip(f"this CPU ({host_cpu().model}) has AVX512_BF16: the comparison would run (a benchmark)")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--precision", "bf16", "--trials", "8"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: --precision bf16 needs the CPU's bf16 dot product") and "this CPU" in line


def test_pytorch_bf16_row_says_why_without_pytorch():
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed: the row would time it (a benchmark)")
    row = bench_tune().time_torch_bf16("matmul-512", 1)
    assert row.gflops != row.gflops and "PyTorch is not installed" in row.note  # NaN: not timed
