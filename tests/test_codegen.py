"""Every LLVM function ansor builds realigns its stack frame, so vector spill slots are aligned wherever the
calling thread's stack is (``ansor/codegen/``)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import te

from ansor import codegen

#: Compiled here, never run: the spill slots of 64-byte AVX-512 registers are what needs the realignment.
AVX512 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"})


def _spilling_matmul(n: int = 64) -> tvm.IRModule:
    """A matmul whose inner loops keep 32 weight vectors live across the row loop: more than the 32 vector
    registers with the accumulators and broadcasts, so LLVM spills some of them to the stack."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b, c]))
    i, j, kk = sch.get_loops(sch.get_sblock("C"))
    jo, jm, jv = sch.split(j, [None, 4, 16])
    ko, ki = sch.split(kk, [None, 8])
    sch.reorder(jo, ko, i, jm, ki, jv)
    sch.vectorize(jv)
    sch.unroll(jm)
    sch.unroll(ki)
    return sch.mod


def test_realign_stack_adds_the_attribute_to_every_group_once():
    ir = ('define void @f() #0 {\n  ret void\n}\n'
          'attributes #0 = { noinline "target-cpu"="znver5" }\n'
          'attributes #1 = { nocallback nofree memory(argmem: write) }\n')
    once = codegen.realign_stack(ir)
    assert once.count(codegen.REALIGN) == 2
    assert 'attributes #0 = { noinline "target-cpu"="znver5" "stackrealign" }' in once
    assert codegen.realign_stack(once) == once
    assert codegen.realign_stack("no attribute groups") == "no attribute groups"


def test_a_kernel_with_vector_spills_realigns_its_frame_to_the_vector_width():
    asm = codegen.compile(_spilling_matmul(), AVX512).mod.inspect_source("asm")
    spills = re.findall(r"vmov\w+\s+%zmm\d+, -?\d+\(%rsp\)", asm)
    assert spills, "the kernel no longer spills: it tests nothing"
    assert re.search(r"andq\s+\$-64, %rsp", asm), "a frame with 64-byte spill slots is not aligned to 64 bytes"


def test_a_realigned_kernel_computes_what_numpy_does():
    target = tvm.target.Target({"kind": "llvm"})
    lib = codegen.compile(_spilling_matmul(), target)
    assert codegen.REALIGN in lib.mod.inspect_source("ll")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((64, 64)).astype("float32") for _ in range(2))
    c = tvm.runtime.tensor(np.zeros((64, 64), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def _nvrtc_missing() -> str:
    """Why CUDA source cannot be compiled to a cubin here, or "" when it can (NVRTC and CUDA's headers)."""
    import importlib.util
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        return "NVRTC is not installed (the cuda-bindings package; PyTorch with CUDA brings it)"
    try:
        from tvm.support.nvcc import find_cuda_path
        include = os.path.join(find_cuda_path(), "include", "cuda_runtime.h")
    except RuntimeError as err:
        return f"no CUDA toolkit for NVRTC's headers ({err})"
    return "" if os.path.isfile(include) else f"no CUDA headers at {include}"


CUBIN_ARCH = """
import struct, sys
import tvm
from ansor import codegen
codegen.install()
source = 'extern "C" __global__ void add_one(float* __restrict__ a) { a[threadIdx.x] += 1.0f; }'
with codegen.compiling_for(tvm.target.Target({"kind": "cuda", "arch": sys.argv[1]})):
    cubin = bytes(tvm.get_global_func(codegen.CUDA_COMPILE)(source))
assert cubin[:4] == b"\\x7fELF", cubin[:16]
print((struct.unpack_from("<I", cubin, 48)[0] >> 8) & 0xFF)  # an sm_XY cubin's e_flags hold XY
"""


NVRTC_MISSING = _nvrtc_missing()


@pytest.mark.skipif(bool(NVRTC_MISSING), reason=NVRTC_MISSING or "-")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_source_compiles_for_the_targets_arch_where_no_gpu_is_visible(arch):
    """A Ray build worker sees no GPU (and must not start CUDA): TVM's NVRTC callback, called outside the
    target's scope, would ask the GPU for the arch and fail; ours compiles for the target's."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", CUBIN_ARCH, arch], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == arch.removeprefix("sm_")
