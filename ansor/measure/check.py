"""Is a candidate's output right? A tolerance that scales with the magnitude of the reference output.

A schedule reorders a reduction, so a correct candidate's floats differ from the unscheduled program's in
the last bits; a wrong one can differ by any factor. A fixed absolute tolerance cannot tell them apart on
small outputs: with ``atol=1e-3`` a softmax-4x1024 (outputs 6e-4 to 1.5e-3) multiplied by 0.5 or 1.5 passed.
So each element may differ by ``rtol`` of itself plus ``scale_atol`` of the largest reference magnitude of
its argument (``max|reference|``): the second term covers elements near zero whose value comes from
cancellation, and both shrink with the output, so a scaled output fails whatever its size.

Measured margin: 720 random candidates (sampled from every sketch: tilings, unrolling, vectorization,
rfactor, compute locations) of matmul-512, nhwc-resnet-50.C2, softmax-4x1024 (200 each), C2D-b1 and NRM-b1
(40 each), built and run in fp32 against the unscheduled program: none rejected, and the largest error
was 0.4 % of the allowed difference (NRM-b1); every workload's output times 0.5, 1.5 or 1.01 is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Sequence

import numpy as np

from ..state.tensor_intrin import BF16_BITS, bf16_bits_to_f32


@dataclass(frozen=True)
class Tolerance:
    """|got - want| <= rtol * |want| + scale_atol * max|want| elementwise (``want``: the reference)."""

    rtol: float
    scale_atol: float


#: By the width of the float type in bytes: fp16/bf16, fp32, fp64.
FLOAT_TOLERANCE = {2: Tolerance(1e-2, 1e-3), 4: Tolerance(1e-3, 1e-4), 8: Tolerance(1e-6, 1e-8)}


def float_tolerance(dtype: np.dtype) -> Tolerance:
    return FLOAT_TOLERANCE.get(np.dtype(dtype).itemsize, FLOAT_TOLERANCE[4])


#: bf16's unit roundoff: 8 significant bits (7 stored), so a rounded input is within 2**-9 of itself.
BF16_ROUNDOFF = 2.0 ** -9


def bf16_tolerance(reduction_length: int) -> Tolerance:
    """How far a bf16 product (inputs rounded to bf16, products and sums in fp32) may be from the fp32 one.

    Derived, not fitted: each product of two rounded inputs is within ``2u + u**2`` of the exact one
    (``u`` = :data:`BF16_ROUNDOFF`), and the fp32 sums of ``k`` terms add at most ``k * 2**-24``, both
    relative to the sum of the products' magnitudes. That is the output itself where the inputs are
    positive, as the measurement's random inputs are (:func:`ansor.task.program.random_inputs`), so the
    bound holds element by element; ``scale_atol`` is fp32's, for outputs near zero.
    """
    u = BF16_ROUNDOFF
    return Tolerance(rtol=2 * u + u * u + reduction_length * 2.0 ** -24, scale_atol=FLOAT_TOLERANCE[4].scale_atol)


def output_mismatch(got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                    skip: AbstractSet[int] = frozenset()) -> str:
    """Empty if every argument matches the reference, else which one differs, where, and by how much.

    Floats are compared with :data:`FLOAT_TOLERANCE`, NaN equal to NaN and infinities to themselves, and
    bf16 bits (``uint16``: a bf16 network's activations stored so) as the bf16 numbers they hold, where
    another order of the sums may round an element to the neighbouring value; everything else must be
    equal. ``skip``: arguments not to compare (inputs passed pre-packed, which differ from the reference's
    by layout only).
    """
    for i, (g, w) in enumerate(zip(got, want)):
        if i in skip:
            continue
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"argument {i}: {g.dtype}{list(g.shape)} where the reference has {w.dtype}{list(w.shape)}"
        if w.dtype == BF16_BITS:
            bad, allowed = _float_mismatch(bf16_bits_to_f32(g), bf16_bits_to_f32(w), FLOAT_TOLERANCE[2])
        elif np.issubdtype(w.dtype, np.floating):
            bad, allowed = _float_mismatch(g, w, float_tolerance(w.dtype))
        else:
            bad, allowed = g != w, None
        if bad.any():
            where = tuple(int(x) for x in np.argwhere(bad)[0])
            tol = f", allowed difference {allowed[where]:.3g}" if allowed is not None else ""
            return (f"wrong answer: argument {i} differs from the reference at {int(bad.sum())} of {bad.size} "
                    f"elements (first at {where}: {g[where]} instead of {w[where]}{tol})")
    return ""


def _allowed(w: np.ndarray, tol: Tolerance) -> np.ndarray:
    wide = w.astype(np.float64)
    finite = np.abs(wide[np.isfinite(wide)])
    scale = float(finite.max()) if finite.size else 0.0
    # An all-zero reference leaves only the smallest normal number as slack: zero must stay zero.
    return tol.rtol * np.abs(wide) + max(tol.scale_atol * scale, float(np.finfo(w.dtype).tiny))


def _float_mismatch(g: np.ndarray, w: np.ndarray, tol: Tolerance) -> tuple[np.ndarray, np.ndarray]:
    allowed = _allowed(w, tol)
    with np.errstate(invalid="ignore"):
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
        ok = diff <= allowed
    # NaN where the reference has NaN, and the same infinity, count as equal (as np.isclose's equal_nan).
    ok |= (np.isnan(g) & np.isnan(w)) | (np.isinf(w) & (g == w))
    return ~ok, allowed
