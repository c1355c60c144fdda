"""The machine's fp32 ceiling, measured: the benchmarks' "of peak" columns divide by it.

  python scripts/bench/peak.py                 # threads = this machine's physical cores
  python scripts/bench/peak.py --threads 1

(``scripts/bench/peak.py`` runs :func:`main` here; the network benchmark, ``ansor bench``, uses the probes.)

Two probes, each run with the benchmark's thread count; the peak is the larger of the two:

1. **FMA loop.** A C loop of independent vector multiply-adds on accumulators that live in registers,
   compiled by ``gcc -O2 -march=native`` for this CPU. Each thread runs ``acc[i] = acc[i] * x + y`` over
   ``n`` accumulators; every vector width (16, 32, 64 bytes) and accumulator count below is tried and the
   fastest kept, so nothing about the ISA is written down here. Why not one fixed count: a multiply-add
   has a latency of several cycles and a CPU issues one or two per cycle, so too few accumulators leave
   the units idle; too many do not fit the register file and the compiler spills every accumulator to
   the stack once per iteration. 16 ymm accumulators plus ``x`` and ``y`` need 18 registers where AVX2 has
   16 — that naive probe ran at ~116 GFLOPS on a 2-core Zen 3 whose OpenBLAS sgemm reaches ~148.
2. **sgemm.** numpy's ``a @ b`` (OpenBLAS) on 2048 x 2048 fp32 matrices, in a fresh process that
   imports numpy alone (see :func:`numpy_gemm_gflops`), ``OPENBLAS_NUM_THREADS`` = the thread count,
   with the fastest OpenBLAS kernel family this CPU runs (see :func:`openblas_kernels`).

And the **bf16 ceiling** where the CPU has a bf16 unit (:func:`bf16_gflops`, what ``--precision bf16``
runs on): the same register loop with ``vdpbf16ps`` (AVX512_BF16: 64 flops an instruction) over each
accumulator count, and on a CPU with AMX a loop of ``tdpbf16ps`` on four accumulator tiles (16 x 16 x 32:
16,384 flops an instruction), after asking Linux for the tile state.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: Accumulator counts the FMA probe tries (the best depends on FMA latency, issue width and registers).
ACCUMULATORS = (4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32)
#: Vector widths in bytes (SSE/NEON, AVX, AVX-512); gcc splits a width the CPU lacks into narrower ops.
VECTOR_BYTES = (16, 32, 64)

#: The probes' shared ``main``: ``threads`` threads each run ``run`` for ``iters`` iterations; prints GFLOPS
#: from the kernel's ``FLOPS_PER_ITER``. With ``AMX`` defined it first asks Linux for the tile state.
_HARNESS = r"""
int main(int argc, char **argv) {
    int threads = atoi(argv[1]);
    iters = atol(argv[2]);
#ifdef AMX
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { fprintf(stderr, "Linux refused the AMX tile state\n"); return 3; }
#endif
    pthread_t th[256];
    float out[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int t = 0; t < threads; t++) pthread_create(&th[t], 0, run, &out[t]);
    for (int t = 0; t < threads; t++) pthread_join(th[t], 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    printf("%.6f\n", (double)threads * iters * FLOPS_PER_ITER / s / 1e9);
    return out[0] == 12345.0f;
}
"""

_FMA_SOURCE = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef float vf __attribute__((vector_size(VB)));
static long iters;
static volatile float seed = 0.999f;

static void *run(void *out) {
    vf acc[NACC], x, y;
    for (int l = 0; l < (int)(VB / sizeof(float)); l++) { x[l] = seed; y[l] = 1e-3f * seed; }
    for (int i = 0; i < NACC; i++) acc[i] = x * (float)i;
    for (long n = 0; n < iters; n++) {
#pragma GCC unroll 64
        for (int i = 0; i < NACC; i++) acc[i] = acc[i] * x + y;
    }
    float s = 0;
    for (int i = 0; i < NACC; i++) s += acc[i][0];
    *(float *)out = s;
    return 0;
}
#define FLOPS_PER_ITER (NACC * (VB / sizeof(float)) * 2.0)
""" + _HARNESS


_BF16_SOURCE = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long iters;
static volatile float seed = 0.999f;

#ifdef AMX
/* Four accumulator tiles (0-3) of 16 x 16 fp32, A (4) 16 x 32 bf16, B (5) 16 pairs x 16 columns. */
static void *run(void *out) {
    unsigned char cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;
    for (int t = 0; t < 6; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
    _tile_loadconfig(cfg);
    static __thread unsigned short ab[16 * 32];
    static __thread float c[16 * 16];
    for (int i = 0; i < 16 * 32; i++) ab[i] = 0x3f80;
    _tile_loadd(4, ab, 64); _tile_loadd(5, ab, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (long n = 0; n < iters; n++) {
        _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(1, 4, 5); _tile_dpbf16ps(2, 4, 5); _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, c, 64);
    _tile_release();
    *(float *)out = c[0] * seed;
    return 0;
}
#define FLOPS_PER_ITER (4.0 * 16 * 16 * 32 * 2)
#else
static void *run(void *out) {
    __m512 acc[NACC];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f7f);
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_set1_ps(seed * i);
    for (long n = 0; n < iters; n++) {
#pragma GCC unroll 64
        for (int i = 0; i < NACC; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    }
    float s = 0;
    for (int i = 0; i < NACC; i++) s += acc[i][0];
    *(float *)out = s;
    return 0;
}
#define FLOPS_PER_ITER (NACC * 16.0 * 2 * 2)
#endif
""" + _HARNESS
#: Accumulator counts of the ``vdpbf16ps`` probe (32 zmm registers; two hold the operands).
BF16_ACCUMULATORS = (8, 10, 12, 16, 20, 24, 28)


@dataclass(frozen=True)
class Peak:
    """What the probes measured, in GFLOPS; ``gflops`` is the larger of the fp32 two, ``bf16_gflops`` the
    bf16 unit's (0 without one)."""

    threads: int
    fma_gflops: float
    fma_config: str  # e.g. "12 x 32-byte vectors"
    sgemm_gflops: float
    sgemm_note: str
    bf16_gflops: float = 0.0
    bf16_config: str = "no bf16 unit"

    @property
    def gflops(self) -> float:
        return max(self.fma_gflops, self.sgemm_gflops)

    def summary(self) -> str:
        bf16 = f"; bf16 peak {self.bf16_gflops:.1f} GFLOPS ({self.bf16_config})" if self.bf16_gflops else ""
        return (f"peak {self.gflops:.1f} GFLOPS on {self.threads} threads (FMA loop {self.fma_gflops:.1f}, "
                f"{self.fma_config}; sgemm {self.sgemm_gflops:.1f}, {self.sgemm_note}){bf16}")


def fma_gflops(threads: int, seconds: float = 0.3) -> tuple[float, str]:
    """Best GFLOPS of the register FMA loop over every width and accumulator count (0 if no gcc).

    Every variant runs briefly; the three fastest run again for ``seconds`` each and the best counts.
    """
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return 0.0, "no C compiler"
    with tempfile.TemporaryDirectory(prefix="ansor-peak-") as tmp:
        src = Path(tmp, "fma.c")
        src.write_text(_FMA_SOURCE)

        def rate(exe: Path, iters: int) -> float:
            out = subprocess.run([str(exe), str(threads), str(iters)], check=True, capture_output=True, text=True)
            return float(out.stdout)

        quick: list[tuple[float, int, int, Path]] = []
        for vb in VECTOR_BYTES:
            for nacc in ACCUMULATORS:
                exe = Path(tmp, f"fma_{vb}_{nacc}")
                subprocess.run([cc, "-O2", "-march=native", f"-DVB={vb}", f"-DNACC={nacc}", str(src), "-o",
                                str(exe), "-lpthread"], check=True, capture_output=True)
                quick.append((rate(exe, 200_000), vb, nacc, exe))
        best, config = 0.0, ""
        for gflops, vb, nacc, exe in sorted(quick, reverse=True)[:3]:
            iters = max(200_000, int(seconds * gflops * 1e9 / (threads * nacc * vb // 4 * 2)))
            measured = rate(exe, iters)
            if measured > best:
                best, config = measured, f"{nacc} x {vb}-byte vectors"
    return best, config


_GEMM_SCRIPT = """
import statistics, sys, time
import numpy as np
m, n, k = (int(v) for v in sys.argv[1:4])
seconds, repeat_s = float(sys.argv[4]), float(sys.argv[5])
rng = np.random.default_rng(0)
a, b = rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)
a @ b
times = []
end = time.perf_counter() + seconds
while not times or time.perf_counter() < end:
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < repeat_s or runs == 0:
        a @ b
        runs += 1
    times.append((time.perf_counter() - start) / runs)
print(2 * m * n * k / min(times) / 1e9, 2 * m * n * k / statistics.median(times) / 1e9)
"""


#: OpenBLAS kernel families tried besides its own pick (``OPENBLAS_CORETYPE``); the fastest is "numpy" in the
#: tables (a Zen 5 EPYC pinned to Haswell ran a 512^3 sgemm at 229 GFLOPS on 2 threads, SkylakeX at 406). A
#: family the CPU cannot run dies in its own process and is skipped.
OPENBLAS_CORETYPES = ("Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids")


@functools.lru_cache(maxsize=None)
def openblas_kernels(threads: int, /) -> str:
    """The OpenBLAS kernel family whose 512^3 sgemm is fastest on this CPU with ``threads`` threads, whatever
    the environment's ``OPENBLAS_CORETYPE`` says; "" if OpenBLAS never named its kernels.

    Positional only, so that every caller shares one cached measurement: ``lru_cache`` keys ``f(1)`` and
    ``f(threads=1)`` apart, and two races between close families (Haswell, SkylakeX on Zen 4) can disagree."""
    best, kernel = 0.0, ""
    own = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}  # OpenBLAS's own detection
    for coretype in (None, *OPENBLAS_CORETYPES):
        env = {**own, "OPENBLAS_VERBOSE": "2", **({"OPENBLAS_CORETYPE": coretype} if coretype else {})}
        try:
            out = _run_gemm(512, 512, 512, threads, 0.3, 0.1, env)
        except subprocess.CalledProcessError:
            continue
        picked = re.search(r"Core: (\w+)", out.stderr)
        gflops = float(out.stdout.split()[0])
        if picked and gflops > best:
            best, kernel = gflops, picked.group(1)
    return kernel


def _run_gemm(m: int, n: int, k: int, threads: int, seconds: float, repeat_s: float,
              env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**env, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    return subprocess.run([sys.executable, "-c", _GEMM_SCRIPT, str(m), str(n), str(k), str(seconds), str(repeat_s)],
                          env=env, check=True, capture_output=True, text=True)


def numpy_gemm_gflops(m: int, n: int, k: int, threads: int, seconds: float = 1.0, median: bool = False,
                      kernels: str = "") -> float:
    """numpy's fp32 ``(m x k) @ (k x n)`` (OpenBLAS) with ``threads`` threads: the best of ~0.1 s repeats, or
    with ``median`` the median of 0.2 s repeats (the statistic :func:`ansor.task.program.time_module` reports).

    Timed in a fresh process that imports numpy alone: in a process that imported TVM, ``tvm_ffi`` has
    imported torch when it is installed, and from then on OpenBLAS's 2-thread sgemm ran at 11-15 GFLOPS
    here instead of ~150 (measured: 512^3, the same process, before and after ``import torch``).
    ``kernels``: an OpenBLAS kernel family (``OPENBLAS_CORETYPE``); "" keeps the environment's choice.
    """
    env = {**os.environ, "OPENBLAS_CORETYPE": kernels} if kernels else dict(os.environ)
    out = _run_gemm(m, n, k, threads, seconds, 0.2 if median else 0.1, env)
    best, middle = (float(v) for v in out.stdout.split())
    return middle if median else best


def sgemm_gflops(threads: int, n: int = 2048) -> tuple[float, str]:
    """numpy's sgemm on ``n x n`` matrices (see :func:`numpy_gemm_gflops`)."""
    kernels = openblas_kernels(threads)
    return (numpy_gemm_gflops(n, n, n, threads, kernels=kernels),
            f"n={n}, {threads} BLAS threads, {kernels or 'its own choice of'} kernels")


def cpu_description() -> str:
    """``model (LLVM cpu, widest vector ISA, cores)``: what every benchmark table is labelled with."""
    import platform

    import tvm

    from ..target import host_target, physical_cores
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    target = host_target()
    isa = next((name for feature, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"),
                                           ("neon", "NEON"), ("sse2", "SSE2"))
                if _has_feature(tvm, feature, target)), "scalar")
    from ..host_cpu import host_cpu
    units = "".join(f", {unit.name}" for unit in host_cpu().matrix_units)
    return f"CPU: {model} (LLVM {target.attrs['mcpu']}, {isa}{units}, {physical_cores()} physical cores)"


def bf16_probe_commands(cc: str, source: Path, out_dir: Path, march: str = "native"
                        ) -> dict[str, tuple[list[str], float]]:
    """Each bf16 probe variant by name: its compiler command (``-march``: the CPU compiled for) and its
    flops an iteration; ``vdpbf16ps`` for each accumulator count, and ``amx``."""
    base = [cc, "-O2", f"-march={march}", "-mavx512bf16", str(source), "-lpthread", "-o"]
    variants = {f"vdpbf16ps x {n}": ([*base, str(out_dir / f"dp_{n}"), f"-DNACC={n}"], n * 16 * 2 * 2.0)
                for n in BF16_ACCUMULATORS}
    variants["AMX tdpbf16ps x 4 tiles"] = ([*base, str(out_dir / "amx"), "-DAMX", "-mamx-tile", "-mamx-bf16"],
                                           4 * 16 * 16 * 32 * 2.0)
    return variants


def bf16_gflops(threads: int, seconds: float = 0.3) -> tuple[float, str]:
    """The bf16 unit's GFLOPS (AMX tiles or ``vdpbf16ps``, whichever is faster), and which ran; 0 and why
    not on a CPU without AVX512_BF16 or without a C compiler. Each variant runs briefly, then for
    ``seconds``."""
    from ..host_cpu import MatrixUnit, host_cpu
    units = host_cpu().matrix_units
    if MatrixUnit.AVX512_BF16 not in units:
        return 0.0, "no bf16 unit"
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return 0.0, "no C compiler"

    def rate(exe: str, iters: int) -> float:
        run = subprocess.run([exe, str(threads), str(iters)], capture_output=True, text=True)
        return float(run.stdout) if run.returncode == 0 else 0.0

    best, config = 0.0, ""
    with tempfile.TemporaryDirectory(prefix="ansor-peak-bf16-") as tmp:
        src = Path(tmp, "bf16.c")
        src.write_text(_BF16_SOURCE)
        for name, (command, flops) in bf16_probe_commands(cc, src, Path(tmp)).items():
            if name.startswith("AMX") and MatrixUnit.AMX not in units:
                continue
            if subprocess.run(command, capture_output=True).returncode != 0:
                continue  # a compiler without -mavx512bf16 / -mamx-bf16 (gcc before 10 / 11): no such probe
            exe = command[command.index("-o") + 1]
            quick = rate(exe, 10_000)
            if quick > 0:
                measured = rate(exe, max(10_000, int(seconds * quick * 1e9 / (threads * flops))))
                if measured > best:
                    best, config = measured, name
    return best, config


def _has_feature(tvm, feature: str, target) -> bool:
    try:
        return bool(tvm.target.codegen.target_has_features(feature, target))
    except Exception:  # an LLVM target of another architecture does not know the feature name
        return False


def measure_peak(threads: int) -> Peak:
    """Both probes with ``threads`` threads (a few seconds)."""
    fma, config = fma_gflops(threads)
    time.sleep(1.0)  # OpenBLAS and the probe threads must not overlap
    sgemm, note = sgemm_gflops(threads)
    bf16, bf16_config = bf16_gflops(threads)
    return Peak(threads, fma, config, sgemm, note, bf16, bf16_config)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of both probes (default: this machine's physical cores)")
    args = parser.parse_args()
    if args.threads is not None and args.threads < 1:
        print(f"error: --threads must be at least 1, got {args.threads}", file=sys.stderr)
        return 2
    from ..target import physical_cores
    threads = args.threads or physical_cores()
    print(cpu_description())
    print(measure_peak(threads).summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
