"""What a tuned program computes in: fp32, or bf16 as OpenVINO and oneDNN mean it (the inputs of a product
rounded to bf16, each product and sum in fp32, everything else fp32), or that bf16 with the activations that
products read stored in bf16 as OpenVINO stores them."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from ..errors import WorkloadError

if TYPE_CHECKING:  # TVM is imported where a program is converted: the CLI reads Precision before it loads TVM
    import tvm
    from tvm import te


class Precision(enum.Enum):
    FP32 = "fp32"
    #: Products' inputs rounded to bf16, every other value fp32: an activation is stored as bf16 only where
    #: nothing but products reads it (the products read the same values either way).
    BF16 = "bf16"
    #: BF16, and an activation that a product reads is stored as bf16 where element-wise operators read it
    #: too (a residual add, a batch norm), as OpenVINO stores them: they read its rounded values.
    BF16_STORED = "bf16-stored"

    @property
    def bf16(self) -> bool:
        """Whether the products take bf16 inputs (on the CPU's bf16 dot product)."""
        return self is not Precision.FP32

    @property
    def suffix(self) -> str:
        """What the name of a run's file or section gets: nothing in fp32, else ``-`` and the name (``-bf16``)."""
        return "" if self is Precision.FP32 else f"-{self.value}"


def precision_named(value: "Precision | str") -> Precision:
    """A :class:`Precision` from itself or its name (``"bf16"``), or one error naming the choices."""
    try:
        return Precision(value)
    except ValueError:
        raise WorkloadError(f"unknown precision {value!r}; choices: "
                            f"{', '.join(p.value for p in Precision)}") from None


#: Workload name prefixes that have a bf16 form (``bf16-`` + the name), for the error that lists them.
BF16_FAMILIES = ("matmul-N", "matmul-MxNxK")


def workload_in(name: str, precision: Precision) -> str:
    """The workload that computes ``name`` in ``precision`` (``matmul-512`` in bf16: ``bf16-matmul-512``)."""
    if precision is Precision.FP32 or name.startswith("bf16-"):
        return name
    if name.startswith("matmul-") and not name.startswith("matmul-relu-"):
        return f"bf16-{name}"
    raise WorkloadError(f"workload {name!r} has no bf16 form yet; bf16 workloads: "
                        f"{', '.join('bf16-' + f for f in BF16_FAMILIES)} (--precision bf16 --wkl matmul-512)")


def in_precision(func: tvm.tirx.PrimFunc, precision: Precision) -> tvm.tirx.PrimFunc:
    """``func`` computed in ``precision``. In bf16 a PrimFunc that is one matmul (``C = A @ B`` over the last
    two axes, float32, any leading batch axes) becomes its bf16 form: both operands rounded and packed in
    the kernel, as the ``bf16-matmul-*`` workloads and a network's products of two activations are."""
    if precision is Precision.FP32:
        return func
    from tvm import te

    from .te_ops import BF16_LANES, BF16_PAIR, bf16_matmul
    shapes = [_static_shape(p) for p in func.params]
    if {str(p.dtype) for p in func.params} == {"float32"} and _matmul_shapes(shapes):
        a = te.placeholder(shapes[0], "float32", name="A")
        b = te.placeholder(shapes[1], "float32", name="B")
        if _is_matmul(func, a, b):
            k, n = shapes[1][-2:]
            if n % BF16_LANES or k % BF16_PAIR:
                raise WorkloadError(f"a bf16 matmul needs N a multiple of {BF16_LANES} and K even (the bf16 unit's k "
                                    f"pairs of {BF16_LANES} columns); this one has N={n}, K={k}")
            return te.create_prim_func([a, b, bf16_matmul(a, b, name="C")])
    raise WorkloadError("precision bf16 takes a PrimFunc that is one float32 matmul, C = A @ B over the last two "
                        "axes (batched alike or not); for a whole model's convolutions and dense layers use "
                        "ansor.relax (precision=Precision.BF16)")


def _static_shape(param: tvm.tirx.Var) -> tuple[int, ...] | None:
    dims = getattr(param, "shape", None)
    if dims is None or not all(isinstance(d, int) or hasattr(d, "value") for d in dims):
        return None
    return tuple(int(d) for d in dims)


def _matmul_shapes(shapes: list[tuple[int, ...] | None]) -> bool:
    """Three static shapes ``[..., M, K]``, ``[..., K, N]``, ``[..., M, N]`` with the same leading axes."""
    if len(shapes) != 3 or any(s is None or len(s) < 2 for s in shapes):
        return False
    (*lead, m, k), (*lead_b, k_b, n), out = shapes
    return lead == lead_b and k == k_b and out == (*lead, m, n)


def _is_matmul(func: tvm.tirx.PrimFunc, a: te.Tensor, b: te.Tensor) -> bool:
    """Whether ``func`` computes exactly ``a @ b`` (names aside)."""
    import tvm_ffi
    from tvm import te

    from .te_ops import matmul_stage
    ref = te.create_prim_func([a, b, matmul_stage(a, b)])
    return tvm_ffi.structural_equal(func.body, ref.body, map_free_vars=True)
