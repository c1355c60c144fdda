"""The CPU's bf16 dot-product units as TensorIR tensor intrinsics: ``vdpbf16ps`` (AVX512_BF16) and
``tdpbf16ps`` (AMX), each a description TensorIR matches a loop nest against and the implementation it
puts in the nest's place (``sch.tensorize(loop, name)``).

bf16 here means what OpenVINO and oneDNN mean: the products' inputs are bf16, each product and sum fp32.
A bf16 operand is a ``uint16`` buffer holding the upper half of an fp32's bits (:func:`bf16_to_f32` reads
it; :func:`round_to_bf16` makes it from fp32 data, rounding to nearest even). TVM's own ``bfloat16`` type
cannot reach these units: its legalization passes turn every bf16 value into fp32 (compute) or ``i16``
(storage) before LLVM sees it, while LLVM 22's ``vdpbf16ps`` takes ``<32 x bfloat>``. So the AVX512_BF16
implementation calls ``vpdpwssd`` in its place, the same operands in integers, which :mod:`ansor.codegen`
rewrites into the real intrinsic (bitcasts to ``bfloat``) in the module's IR: a pure LLVM intrinsic, so
LLVM keeps the accumulators in registers across the reduction, where an external function (the first
placeholder) left each one stored and reloaded around every call. The AMX intrinsics take tile numbers and
pointers, which TIR passes as they are.

Layouts (the weight is packed into them at build time; the activations are read in place):

- AVX512_BF16, ``dot_16x2``: ``C[16] += A[2] . B[16, 2]``: one row of A, a k pair; B holds 16 columns'
  k pairs side by side (``Bp[n // 16, k // 2, n % 16, k % 2]``).
- AMX, ``tile_16x16x32``: ``C[16, 16] += A[16, 32] . B[16, 16, 2]``: B in k pairs
  (``Bp[k // 2, n, k % 2]``), the layout ``tdpbf16ps`` reads. Each call loads the tile configuration and
  C, and stores C: correct wherever it is placed; :mod:`ansor.codegen.amx_tiles` then keeps the configuration and
  C in their registers across the kernel's loops. ``tile_Mx16x32`` for M in :data:`AMX_ROWS` is the same
  product on M rows of A and C (a tile configured with M rows): a convolution's 56, 28, 14 or 7 output
  pixels a row fill tiles of 14 or 7 rows, where 16 rows divide none of them. Those intrinsics hold C in
  tile 0, A in tile 4 and B in tile 6 (``amx_tiles.SHAPED_TILES``), so that every tile register keeps one
  shape in a kernel whose products codegen runs side by side (A tiles M rows, B tiles 16).
"""

from __future__ import annotations

import enum
import threading
from functools import lru_cache
from typing import Optional

import numpy as np
import tvm
from tvm.script import tirx as T
from tvm.s_tir import TensorIntrin

from ..codegen import VDPBF16PS_PLACEHOLDER, amx_tiles
from .access import IterKind


#: The dtype of a buffer of bf16 bits (TVM's own bfloat16 never reaches the units: the module notes say why).
BF16_BITS = "uint16"


def bf16_to_f32(bits: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    """The fp32 value of bf16 ``bits`` (a ``uint16`` expression): the bits are an fp32's upper half."""
    return tvm.tirx.reinterpret("float32", bits.astype("uint32") << tvm.tirx.const(16, "uint32"))


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """fp32 data as bf16 bits (``uint16``), rounded to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, np.uint16(0x7FC0), rounded) if nan.any() else rounded


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """The fp32 values of bf16 ``bits`` (NumPy's side of :func:`bf16_to_f32`)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


class BF16Intrin(enum.Enum):
    """The registered bf16 tensor intrinsics, by the TensorIR name ``sch.tensorize`` takes."""

    AVX512_DOT_16x2 = "ansor_avx512bf16_dot_16x2"
    AMX_TILE_16x16x32 = "ansor_amx_bf16_tile_16x16x32"
    AMX_TILE_14x16x32 = "ansor_amx_bf16_tile_14x16x32"
    AMX_TILE_12x16x32 = "ansor_amx_bf16_tile_12x16x32"
    AMX_TILE_8x16x32 = "ansor_amx_bf16_tile_8x16x32"
    AMX_TILE_7x16x32 = "ansor_amx_bf16_tile_7x16x32"
    #: ``dot_16x2``'s description as its own implementation: the same layouts and loop structure in plain
    #: fp32 code, for a CPU without the unit (tests, and the search's structure on any machine).
    PORTABLE_DOT_16x2 = "ansor_portable_bf16_dot_16x2"

    @property
    def loops(self) -> tuple[tuple[int, IterKind], ...]:
        """The innermost loops the intrinsic replaces, outermost first: (extent, kind)."""
        return _LOOPS[self]

    @property
    def spatial(self) -> tuple[int, ...]:
        """The extents of its spatial loops, outermost first (AMX: rows, then columns; the dot: columns)."""
        return tuple(n for n, kind in self.loops if kind == IterKind.SPATIAL)

    @property
    def amx_rows(self) -> Optional[int]:
        """The rows of an AMX tile product's A and C tiles; None for the dot products."""
        return _AMX_ROWS_OF.get(self)

    @property
    def reduction(self) -> int:
        """The extent of its one reduction loop (a k pair; AMX: 32)."""
        [n] = [n for n, kind in self.loops if kind == IterKind.REDUCE]
        return n


_LOOPS = {
    BF16Intrin.AVX512_DOT_16x2: ((16, IterKind.SPATIAL), (2, IterKind.REDUCE)),
    BF16Intrin.PORTABLE_DOT_16x2: ((16, IterKind.SPATIAL), (2, IterKind.REDUCE)),
}
#: The rows of AMX's tile products, most first: a product's rows take the first that divides them. The
#: zoo's stride-1 convolutions are 112, 56, 28, 14, 7 (ResNet, MobileNet, ConvNeXt), 35, 17 or 8 (Inception)
#: pixels wide, its matmuls' rows 128 or 197 tokens: 16 rows fit only 112 and 128.
AMX_ROWS = (16, 14, 12, 8, 7)
#: The reduction channels of one AMX tile product (a row of A: 64 bytes of bf16).
AMX_DEPTH = 32
_AMX_ROWS_OF = {BF16Intrin[f"AMX_TILE_{m}x16x32"]: m for m in AMX_ROWS}
_LOOPS.update({intrin: ((m, IterKind.SPATIAL), (16, IterKind.SPATIAL), (AMX_DEPTH, IterKind.REDUCE))
               for intrin, m in _AMX_ROWS_OF.items()})


def amx_tiles_of(rows: int) -> tuple[int, int, int]:
    """The tile registers (C, A, B) of the tile product on ``rows`` rows (codegen's rewrite configures them)."""
    return amx_tiles.TILES if rows == 16 else amx_tiles.SHAPED_TILES


#: An iterator annotated ``tensorize:<name>`` heads the loops intrinsic ``name`` replaces (a ``TZ`` step).
TENSORIZE = "tensorize:"


def bf16_bits(x: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    """fp32 ``x`` rounded to bf16 (to nearest even), as ``uint16`` bits; finite inputs (a NaN may become
    an infinity), as every input a tuning run draws is."""
    u = tvm.tirx.reinterpret("uint32", x)
    one = tvm.tirx.const(1, "uint32")
    half = tvm.tirx.const(0x7FFF, "uint32")
    sixteen = tvm.tirx.const(16, "uint32")
    return ((u + half + ((u >> sixteen) & one)) >> sixteen).astype("uint16")


# ------------------------------------------------------------------------------------------ AVX512_BF16
def _dot_16x2() -> tuple[tvm.tirx.PrimFunc, tvm.tirx.PrimFunc]:
    """``dot_16x2``'s description and implementation."""
    @T.prim_func(s_tir=True)
    def _dot_16x2_desc(A: T.Buffer((2,), "uint16", offset_factor=1),
                       B: T.Buffer((16, 2), "uint16", offset_factor=1),
                       C: T.Buffer((16,), "float32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            for i, k in T.grid(16, 2):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + (
                        T.reinterpret("float32", T.shift_left(T.Cast("uint32", A[vk]), T.uint32(16)))
                        * T.reinterpret("float32", T.shift_left(T.Cast("uint32", B[vi, vk]), T.uint32(16))))

    @T.prim_func(s_tir=True)
    def _dot_16x2_impl(A: T.Buffer((2,), "uint16", offset_factor=1),
                       B: T.Buffer((16, 2), "uint16", offset_factor=1),
                       C: T.Buffer((16,), "float32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:2], B[0:16, 0:2])
            T.writes(C[0:16])
            pair = T.reinterpret("int32", A.vload([0], "uint16x2"))  # one k pair of A, broadcast to 16 lanes
            C[T.ramp(T.int32(0), 1, 16)] = T.reinterpret("float32x16", T.call_llvm_pure_intrin(
                "int32x16", VDPBF16PS_PLACEHOLDER, T.reinterpret("int32x16", C.vload([0], "float32x16")),
                T.reinterpret("int16x32", T.broadcast(pair, 16)),
                T.reinterpret("int16x32", B.vload([0, 0], "uint16x32"))))
    return _dot_16x2_desc, _dot_16x2_impl


# ------------------------------------------------------------------------------------------------- AMX
def _tile(rows: int) -> tuple[tvm.tirx.PrimFunc, tvm.tirx.PrimFunc]:
    """``tile_{rows}x16x32``'s description and implementation."""
    c_tile, a_tile, b_tile = (T.int8(t) for t in amx_tiles_of(rows))

    @T.prim_func(s_tir=True)
    def _tile_desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (rows, 32), "uint16", offset_factor=1)
        B = T.match_buffer(b, (16, 16, 2), "uint16", offset_factor=1)
        C = T.match_buffer(c, (rows, 16), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:16], A[0:rows, 0:32], B[0:16, 0:16, 0:2])
            T.writes(C[0:rows, 0:16])
            for i, j, k in T.grid(rows, 16, 32):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + (
                        T.reinterpret("float32", T.shift_left(T.Cast("uint32", A[vi, vk]), T.uint32(16)))
                        * T.reinterpret("float32",
                                        T.shift_left(T.Cast("uint32", B[vk // 2, vj, vk % 2]), T.uint32(16))))

    @T.prim_func(s_tir=True)
    def _tile_impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        lda = T.int32()
        ldb = T.int32()
        ldc = T.int32()
        A = T.match_buffer(a, (rows, 32), "uint16", offset_factor=1, strides=[lda, 1])
        B = T.match_buffer(b, (16, 16, 2), "uint16", offset_factor=1, strides=[ldb, 2, 1])
        C = T.match_buffer(c, (rows, 16), "float32", offset_factor=1, strides=[ldc, 1])
        with T.sblock("root"):
            T.reads(C[0:rows, 0:16], A[0:rows, 0:32], B[0:16, 0:16, 0:2])
            T.writes(C[0:rows, 0:16])
            # The tile configuration: palette 1; C and A of `rows` rows, B of 16, each row 64 bytes.
            cfg = T.alloc_buffer((64,), "uint8", scope="local")
            for q in range(64):
                cfg[q] = T.uint8(0)
            cfg[0] = T.uint8(1)
            cfg[16 + 2 * c_tile] = T.uint8(64)
            cfg[16 + 2 * a_tile] = T.uint8(64)
            cfg[16 + 2 * b_tile] = T.uint8(64)
            cfg[48 + c_tile] = T.uint8(rows)
            cfg[48 + a_tile] = T.uint8(rows)
            cfg[48 + b_tile] = T.uint8(16)
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", cfg.access_ptr("r")))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", c_tile, C.access_ptr("r"),
                                          T.int64(ldc * 4)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", a_tile, A.access_ptr("r"),
                                          T.int64(lda * 2)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", b_tile, B.access_ptr("r"),
                                          T.int64(ldb * 2)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbf16ps", c_tile, a_tile, b_tile))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", c_tile, C.access_ptr("w"),
                                          T.int64(ldc * 4)))
    return _tile_desc, _tile_impl


_REGISTERING = threading.Lock()  # the search checks programs in threads (sketch/policy.py)


def register() -> None:
    """Register the intrinsics with TensorIR (once per process; ``sch.tensorize`` looks them up by name)."""
    with _REGISTERING:
        _register()


@lru_cache(maxsize=None)
def _register() -> None:
    dot_desc, dot_impl = _dot_16x2()
    TensorIntrin.register(BF16Intrin.AVX512_DOT_16x2.value, dot_desc, dot_impl, override=True)
    for intrin, rows in _AMX_ROWS_OF.items():
        TensorIntrin.register(intrin.value, *_tile(rows), override=True)
    TensorIntrin.register(BF16Intrin.PORTABLE_DOT_16x2.value, dot_desc, dot_desc, override=True)
