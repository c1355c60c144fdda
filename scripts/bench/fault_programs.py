"""Programs that fail the measurement machinery on purpose, for the fault tests and ``fault_report.py``.

- ``endless``: a reduction over 2^48 iterations (days of work), so a runner really hangs and is killed;
- ``crashing``: calls ``abort()``, so its runner process really dies;
- ``lying_scan``: declares it reads ``A`` only, but reads what the previous iteration wrote (wrong when
  vectorized);
- ``big_copy``: 2^20 iterations that TVM needs gigabytes and minutes to unroll fully.
"""

from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def endless(A: T.Buffer((16,), "float32"), B: T.Buffer((1,), "float32")):
    for i, j, k in T.grid(65536, 65536, 65536):
        with T.sblock("spin"):
            vi, vj, vk = T.axis.remap("RRR", [i, j, k])
            with T.init():
                B[0] = T.float32(0)
            B[0] = B[0] * T.float32(0.999) + A[vk % 16]


@T.prim_func(s_tir=True)
def crashing(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("crash"):
            vi = T.axis.spatial(16, i)
            B[vi] = A[vi] + T.Cast("float32", T.call_extern("int32", "abort"))


@T.prim_func(s_tir=True)
def lying_scan(A: T.Buffer((1024,), "float32"), B: T.Buffer((1025,), "float32")):
    for i in range(1024):
        with T.sblock("scan"):
            vi = T.axis.spatial(1024, i)
            T.reads(A[vi])  # the lie: it also reads B[vi], written by the previous iteration
            T.writes(B[vi + 1])
            B[vi + 1] = B[vi] + A[vi]


@T.prim_func(s_tir=True)
def big_copy(A: T.Buffer((1048576,), "float32"), B: T.Buffer((1048576,), "float32")):
    for i in range(1048576):
        with T.sblock("copy"):
            vi = T.axis.spatial(1048576, i)
            B[vi] = A[vi] * T.float32(2)
