"""What a tuned program computes in: fp32, or bf16 as OpenVINO and oneDNN mean it (the inputs of a product
rounded to bf16, each product and sum in fp32, everything else fp32)."""

from __future__ import annotations

import enum

from ..errors import WorkloadError


class Precision(enum.Enum):
    FP32 = "fp32"
    BF16 = "bf16"

    @property
    def suffix(self) -> str:
        """What the name of a run's file or section gets: nothing in fp32, ``-bf16`` in bf16."""
        return "" if self is Precision.FP32 else f"-{self.value}"


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
