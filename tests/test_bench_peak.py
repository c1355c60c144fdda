"""The machine-peak probe the benchmarks divide by (ansor/bench/peak.py): it must run on any CPU."""

import shutil

import pytest

from ansor.bench import peak

# Slow tier: each probe compiles C or tries OpenBLAS's kernel families in processes of their own.
pytestmark = pytest.mark.slow


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="needs a C compiler")
def test_fma_probe_builds_for_this_cpu_and_measures_work():
    gflops, config = peak.fma_gflops(threads=1, seconds=0.02)
    assert gflops > 0.1 and "-byte vectors" in config
    nacc = int(config.split(" x ")[0])
    assert nacc in peak.ACCUMULATORS


def test_numpy_runs_the_fastest_openblas_kernels_it_found():
    kernels = peak.openblas_kernels(threads=1)
    assert kernels == "" or kernels.isidentifier()  # OpenBLAS's own name for them, e.g. "Haswell"
    assert peak.numpy_gemm_gflops(128, 128, 128, threads=1, seconds=0.05, kernels=kernels) > 0.1
    assert peak.sgemm_gflops(threads=1, n=128)[1].endswith(f"{kernels or 'its own choice of'} kernels")


def test_sgemm_probe_and_summary():
    gflops, note = peak.sgemm_gflops(threads=1, n=256)
    assert gflops > 0.1 and "n=256" in note
    report = peak.Peak(1, 50.0, "12 x 32-byte vectors", gflops, note)
    assert report.gflops == max(50.0, gflops) and "peak" in report.summary()
    assert peak.cpu_description().startswith("CPU: ")
