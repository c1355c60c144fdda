"""Every build of ansor's goes through :func:`compile`: TVM's compile, with each LLVM function's stack frame
realigned to what its spill slots need.

A kernel whose loop keeps more vectors live than the CPU has registers spills them to its stack frame. LLVM
decides to spill during register allocation, after it has chosen not to realign the frame, so a 64-byte
AVX-512 spill slot gets the ABI's 16-byte alignment, and an unaligned load or store that crosses a cache line.
Whether a slot crosses one then depends on where the calling thread's stack happens to be: on a Zen 5
(``znver5``, 2 threads) ViT-B/16's GELU matmul (a 197 x 768 x 3072 product whose 24 weight vectors are
spilled) ran in 2.26-2.38 ms in 1 of 5 fresh processes and 3.21-3.31 ms in the others; it was tuned to
2.32 ms in a lucky worker and ran at 3.3 ms in the network. With the frame realigned (LLVM's
``"stackrealign"`` function attribute, which TVM does not set), it ran in 2.35-2.41 ms at every stack
position tried. TVM has no option for the attribute, so :func:`compile` installs a wrapper around TVM's LLVM
code generator that adds it to the module's functions (once per process, for every LLVM build after it).
Printing and re-reading the module's IR costs ~4 ms of a matmul-512 candidate's ~94 ms build and export.

CUDA code is compiled (NVRTC) by TVM's ``tvm_callback_cuda_compile``, which takes the arch from the current
target scope, else asks the GPU. TVM calls it outside the target's scope, and a Ray build worker has no GPU
it may use: on an H200 machine every candidate of a network failed with "No CUDA architecture was specified
or GPU detected". :func:`install` wraps the callback to run inside the scope of the target being compiled.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from typing import Any, Iterator

import tvm
import tvm_ffi

from .amx_tiles import keep_tiles_in
from ..target import has_x86_feature

#: TVM's code generator for ``llvm`` targets (CPU kernels, and the host side of every other target).
LLVM_BUILD = "target.build.llvm"
_LOAD_IR = "ffi.Module.load_from_file.ll"
#: TVM's compiler of CUDA source (registered by ``tvm.support.nvcc``; absent from a TVM without CUDA).
CUDA_COMPILE = "tvm_callback_cuda_compile"
#: An attribute group of the module's textual IR: ``attributes #3 = { noinline "target-cpu"="znver5" }``.
_ATTRIBUTE_GROUP = re.compile(r"^(attributes #\d+ = \{[^}\n]*?) ?\}$", re.M)
REALIGN = '"stackrealign"'

_installed = False
_compiling: list[tvm.target.Target] = []  # the targets compile() is building for, innermost last


def realign_stack(ir: str) -> str:
    """``ir`` (an LLVM module as text) with every function's frame realigned: the attribute joins each group."""
    return _ATTRIBUTE_GROUP.sub(lambda m: m.group(0) if REALIGN in m.group(1) else f"{m.group(1)} {REALIGN} }}",
                                ir)


#: The LLVM intrinsic the AVX512_BF16 tensor intrinsic calls in ``vdpbf16ps``'s place (:mod:`ansor.state.tensor_intrin`)
#: and :func:`bf16_intrinsics` replaces: ``vpdpwssd`` has its operands' shapes in integers, and LLVM
#: knows it reads no memory, so its accumulators stay in registers (ansor's kernels use it for nothing else).
VDPBF16PS_PLACEHOLDER = "llvm.x86.avx512.vpdpwssd.512"
_VDPBF16PS_CALL = re.compile(rf"(%[\w.]+) = (?:tail )?call <16 x i32> @{re.escape(VDPBF16PS_PLACEHOLDER)}\("
                             r"<16 x i32> ([^,]+), <32 x i16> ([^,]+), <32 x i16> ([^,)]+)\)")
_VDPBF16PS = "@llvm.x86.avx512bf16.dpbf16ps.512"
_VDPBF16PS_DECLARE = f"declare <16 x float> {_VDPBF16PS}(<16 x float>, <32 x bfloat>, <32 x bfloat>)"


def bf16_intrinsics(ir: str) -> str:
    """``ir`` with each placeholder call on integer vectors made the ``vdpbf16ps`` call it stands for: TVM
    cannot give LLVM the ``<32 x bfloat>`` operands the intrinsic takes, so they are bitcast here."""
    count = 0

    def call(m: re.Match) -> str:
        nonlocal count
        count += 1
        c, a, b, r = (f"%ansor.bf16.{count}.{x}" for x in "cabr")
        return (f"{c} = bitcast <16 x i32> {m.group(2)} to <16 x float>\n  "
                f"{a} = bitcast <32 x i16> {m.group(3)} to <32 x bfloat>\n  "
                f"{b} = bitcast <32 x i16> {m.group(4)} to <32 x bfloat>\n  "
                f"{r} = call <16 x float> {_VDPBF16PS}(<16 x float> {c}, <32 x bfloat> {a}, <32 x bfloat> {b})\n  "
                f"{m.group(1)} = bitcast <16 x float> {r} to <16 x i32>")

    ir = _VDPBF16PS_CALL.sub(call, ir)
    if count and _VDPBF16PS_DECLARE not in ir:
        ir += f"\n{_VDPBF16PS_DECLARE}\n"
    return ir


def _realigning(build: Any) -> Any:
    def build_llvm(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.runtime.Module:
        lib = build(keep_tiles_in(mod) if has_x86_feature(target, "amx-tile") else mod, target)
        ir = lib.inspect_source("ll")
        realigned = realign_stack(bf16_intrinsics(ir))
        if realigned == ir:
            return lib
        with tempfile.TemporaryDirectory(prefix="ansor-ll-") as tmp:
            path = os.path.join(tmp, "lib.ll")
            with open(path, "w") as f:
                f.write(realigned)
            return tvm.get_global_func(_LOAD_IR)(path, "ll")
    return build_llvm


def _in_target_scope(cuda_compile: Any) -> Any:
    def compile_in_scope(code: str) -> Any:
        if not _compiling:
            return cuda_compile(code)
        with _compiling[-1]:  # the arch comes from the target, not from a GPU this process may not see
            return cuda_compile(code)
    return compile_in_scope


def install() -> None:
    """Wrap TVM's LLVM code generator and CUDA compiler (idempotent; for every build of this process after it)."""
    global _installed
    if not _installed:
        tvm_ffi.register_global_func(LLVM_BUILD, _realigning(tvm.get_global_func(LLVM_BUILD)), override=True)
        cuda_compile = tvm.get_global_func(CUDA_COMPILE, allow_missing=True)
        if cuda_compile is not None:
            tvm_ffi.register_global_func(CUDA_COMPILE, _in_target_scope(cuda_compile), override=True)
        _installed = True


def compile(mod: tvm.IRModule, target: tvm.target.Target, **kwargs: Any) -> tvm.runtime.Executable:
    """``tvm.compile`` with stack-realigned LLVM code and CUDA compiled for the target's arch (module docstring)."""
    install()
    with compiling_for(target):
        return tvm.compile(mod, target=target, **kwargs)


@contextlib.contextmanager
def compiling_for(target: tvm.target.Target) -> Iterator[None]:
    """CUDA source compiled within the block is compiled for ``target``'s arch (:func:`install`'s wrapper)."""
    _compiling.append(tvm.target.Target(target))
    try:
        yield
    finally:
        _compiling.pop()
