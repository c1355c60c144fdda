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
    kernels = peak.openblas_kernels(1)
    assert kernels == "" or kernels.isidentifier()  # OpenBLAS's own name for them, e.g. "Haswell"
    assert peak.numpy_gemm_gflops(128, 128, 128, threads=1, seconds=0.05, kernels=kernels) > 0.1
    assert peak.sgemm_gflops(threads=1, n=128)[1].endswith(f"{kernels or 'its own choice of'} kernels")


def test_sgemm_probe_and_summary():
    gflops, note = peak.sgemm_gflops(threads=1, n=256)
    assert gflops > 0.1 and "n=256" in note
    report = peak.Peak(1, 50.0, "12 x 32-byte vectors", gflops, note)
    assert report.gflops == max(50.0, gflops) and "peak" in report.summary()
    assert peak.cpu_description().startswith("CPU: ")


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objdump") is None, reason="needs gcc and objdump")
def test_bf16_probes_compile_for_a_cpu_with_both_units(tmp_path):
    """Compiled for a Sapphire Rapids on any machine: each variant's binary holds its instruction."""
    import subprocess
    src = tmp_path / "bf16.c"
    src.write_text(peak._BF16_SOURCE)
    variants = peak.bf16_probe_commands(shutil.which("gcc"), src, tmp_path, march="sapphirerapids")
    assert len(variants) == len(peak.BF16_ACCUMULATORS) + 1
    for name, (command, flops) in variants.items():
        subprocess.run(command, check=True, capture_output=True)
        asm = subprocess.run(["objdump", "-d", command[command.index("-o") + 1]], capture_output=True,
                             text=True, check=True).stdout
        assert ("tdpbf16ps" if name.startswith("AMX") else "vdpbf16ps") in asm, name
        assert flops == (16384 * 4.0 if name.startswith("AMX") else int(name.split(" x ")[1]) * 64.0)


def test_bf16_peak_where_the_cpu_has_the_unit():
    from ansor.host_cpu import MatrixUnit, host_cpu
    gflops, config = peak.bf16_gflops(threads=1, seconds=0.02)
    if MatrixUnit.AVX512_BF16 not in host_cpu().matrix_units:
        assert (gflops, config) == (0.0, "no bf16 unit")
        pytest.skip(f"this CPU ({host_cpu().model}) has no AVX512_BF16: the probe reports none, as checked")
    assert gflops > 1.0 and ("vdpbf16ps" in config or "AMX" in config)
    assert "bf16 peak" in peak.Peak(1, 50.0, "c", 40.0, "n", gflops, config).summary()
