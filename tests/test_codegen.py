"""Every LLVM function ansor builds realigns its stack frame, so vector spill slots are aligned wherever the
calling thread's stack is (``ansor/codegen.py``)."""

import re

import numpy as np
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
