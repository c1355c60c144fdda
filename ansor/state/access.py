"""How a block touches memory, in a form cheap enough to reason about in pure Python.

The loop state needs one piece of bound inference: when a stage is moved under another stage's loop
(``CA``), how big is the region it must cover? TensorIR answers that exactly on replay; the search needs the
same answer thousands of times a round without touching TVM. Block accesses are therefore kept as affine
expressions over the block's iterator variables, and each loop records which parts of which variables it
walks (:class:`LoopPart`). Non-affine indices are kept as ``None`` and treated as "the whole dimension";
the access notes which variables they use, so a loop over the others can still tell it is contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Optional


class IterKind(Enum):
    """What a block variable or a loop walks: Ansor's spatial, reduction, or (a fused loop) both."""

    SPATIAL = "S"
    REDUCE = "R"
    MIXED = "M"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Affine:
    """``const + sum(coef * var)`` over block iterator variables."""

    terms: tuple[tuple[str, int], ...]
    const: int = 0

    @staticmethod
    def var(name: str) -> "Affine":
        return Affine(((name, 1),), 0)

    def single_var(self) -> Optional[str]:
        """The variable if this index is exactly ``var + const`` with coefficient 1, else None."""
        if len(self.terms) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0]
        return None

    def substitute(self, mapping: dict[str, Optional["Affine"]]) -> Optional["Affine"]:
        """Replace variables by affine expressions (``None`` poisons the result); others stay."""
        coefs: dict[str, int] = {}
        const = self.const
        for name, coef in self.terms:
            if name in mapping:
                sub = mapping[name]
                if sub is None:
                    return None
                const += coef * sub.const
                for sname, scoef in sub.terms:
                    coefs[sname] = coefs.get(sname, 0) + coef * scoef
            else:
                coefs[name] = coefs.get(name, 0) + coef
        return Affine(tuple((n, c) for n, c in coefs.items() if c != 0), const)

    def __str__(self) -> str:
        parts = [f"{c}*{n}" if c != 1 else n for n, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


@dataclass(frozen=True, slots=True)
class Access:
    """One read or write of ``buffer``: an index per dimension (``None``: not affine)."""

    buffer: str
    indices: tuple[Optional[Affine], ...]
    #: The block variables the non-affine indices use (a Winograd tile's ``p // tiles``, a gather's loaded
    #: row); None: not known, any variable may move them.
    opaque_vars: Optional[frozenset[str]] = None
    #: ``(variable, run)`` for variables that move a non-affine index: along aligned runs of ``run`` values
    #: of the variable every index moves as a vector's lanes do (a tap pair's ``j % 32 // 16``: runs of 16).
    runs: tuple[tuple[str, int], ...] = ()

    def moved_opaquely(self, names: set[str]) -> bool:
        """Whether a non-affine index may change with one of the variables ``names``."""
        if all(i is not None for i in self.indices):
            return False
        return self.opaque_vars is None or not self.opaque_vars.isdisjoint(names)

    def substitute(self, mapping: dict[str, Optional[Affine]]) -> "Access":
        """This access with variables replaced by affine expressions (``None``: a non-affine one); the
        variables of an index that stops being affine join the opaque ones, as their images do."""
        indices = tuple(None if x is None else x.substitute(mapping) for x in self.indices)
        if self.opaque_vars is None:
            return Access(self.buffer, indices)
        old = set(self.opaque_vars).union(*({n for n, _ in x.terms} for x, y in zip(self.indices, indices)
                                             if x is not None and y is None))
        new: set[str] = set()
        for name in old:
            image = mapping.get(name, Affine.var(name))
            if image is None:
                return Access(self.buffer, indices)
            new.update(n for n, _ in image.terms)
        return Access(self.buffer, indices, frozenset(new))

    def __str__(self) -> str:
        return f"{self.buffer}[{', '.join('?' if i is None else str(i) for i in self.indices)}]"


@dataclass(frozen=True, slots=True)
class BlockVar:
    name: str
    kind: IterKind  # SPATIAL or REDUCE
    extent: int


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """A block's iterator variables and memory accesses; shared, never mutated."""

    vars: tuple[BlockVar, ...]
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    #: ``(variable, period)`` of each variable an ``if_then_else`` condition depends on (a concatenation's
    #: channel, a padding's rows): along it, the branch taken can change only at multiples of the period.
    branch_periods: tuple[tuple[str, int], ...] = ()

    def var(self, name: str) -> BlockVar:
        for v in self.vars:
            if v.name == name:
                return v
        raise KeyError(name)

    def reads_of(self, buffer: str) -> list[Access]:
        return [a for a in self.reads if a.buffer == buffer]

    def plain_axes(self, buffer: str) -> Optional[dict[str, int]]:
        """``{var: axis}`` when every read of ``buffer`` is ``buffer[v0, v1, ...]`` with distinct plain block
        variables (how a weight is read), else None."""
        accesses = self.reads_of(buffer)
        if not accesses or any(a.indices != accesses[0].indices for a in accesses[1:]):
            return None
        axes: dict[str, int] = {}
        for d, index in enumerate(accesses[0].indices):
            var = index.single_var() if index is not None and index.const == 0 else None
            if var is None or var in axes:
                return None
            axes[var] = d
        return axes

    def write_buffers(self) -> list[str]:
        return [a.buffer for a in self.writes]

    def read_buffers(self) -> list[str]:
        seen: list[str] = []
        for a in self.reads:
            if a.buffer not in seen:
                seen.append(a.buffer)
        return seen


@dataclass(frozen=True, slots=True)
class LoopPart:
    """A loop walks ``extent`` values of ``var`` in steps of ``stride`` (a fused loop has several parts)."""

    var: str
    stride: int
    extent: Optional[int]


def var_ranges(block: BlockInfo, inner_parts: Iterable[tuple[LoopPart, ...]]) -> dict[str, Optional[int]]:
    """Span of each block variable while only the given loops vary (the others fixed).

    TensorIR covers the bounding box, so a loop that walks ``var`` with a stride widens the span by
    ``stride * (extent - 1)`` even when the values it hits are sparse.
    """
    spans: dict[str, Optional[int]] = {v.name: 1 for v in block.vars}
    for parts in inner_parts:
        for part in parts:
            if part.var not in spans:
                continue
            cur = spans[part.var]
            spans[part.var] = None if cur is None or part.extent is None else cur + part.stride * (part.extent - 1)
    for v in block.vars:
        r = spans[v.name]
        if r is not None and r > v.extent:
            spans[v.name] = v.extent
    return spans


def region_extents(accesses: list[Access], ranges: dict[str, Optional[int]],
                   shape: tuple[int, ...]) -> list[Optional[int]]:
    """Extent per dimension of the union of ``accesses`` when each variable spans ``ranges``.

    A non-affine index covers its whole dimension; a variable whose range is still unknown (an
    unfilled split) makes that dimension ``None``.
    """
    out: list[Optional[int]] = []
    for d, dim in enumerate(shape):
        lo, hi = dim, -1
        known = True
        for acc in accesses:
            index = acc.indices[d] if d < len(acc.indices) else None
            if index is None:
                lo, hi = 0, dim - 1
                continue
            a_lo = a_hi = index.const
            for name, coef in index.terms:
                r = ranges.get(name, 1)
                if r is None:
                    known = False
                    break
                span = coef * (r - 1)
                a_lo += min(0, span)
                a_hi += max(0, span)
            lo, hi = min(lo, a_lo), max(hi, a_hi)
        out.append(min(dim, max(1, hi - lo + 1)) if known and hi >= lo else (None if not known else dim))
    return out


def split_parts(parts: tuple[LoopPart, ...], extents: list[Optional[int]]) -> list[tuple[LoopPart, ...]]:
    """Divide a loop's parts among the loops a split makes (``extents`` outer to inner).

    Each part is a digit range of the loop's mixed-radix index; a new loop covering digits
    ``[inner, inner * extent)`` takes the overlapping share of every part. Exact when extents divide.
    """
    if any(e is None for e in extents) or any(p.extent is None for p in parts):
        # Unknown lengths (an unfilled sketch): strides are unknown too, extents only where unambiguous.
        return [tuple(LoopPart(p.var, p.stride, e if len(parts) == 1 else None) for p in parts)
                for e in extents]
    out: list[tuple[LoopPart, ...]] = []
    inner_new = 1
    new_spans: list[tuple[int, int]] = []
    for e in reversed(extents):
        new_spans.append((inner_new, inner_new * e))  # type: ignore[operator]
        inner_new *= e  # type: ignore[operator]
    new_spans.reverse()
    part_spans: list[tuple[int, int]] = []
    inner_part = 1
    for p in reversed(parts):
        part_spans.append((inner_part, inner_part * p.extent))  # type: ignore[operator]
        inner_part *= p.extent  # type: ignore[operator]
    part_spans.reverse()
    for lo, hi in new_spans:
        share: list[LoopPart] = []
        for p, (plo, phi) in zip(parts, part_spans):
            s_lo, s_hi = max(lo, plo), min(hi, phi)
            if s_hi > s_lo:
                share.append(LoopPart(p.var, p.stride * (s_lo // plo), max(1, -(-s_hi // s_lo))))
        if not share:
            share.append(LoopPart(parts[-1].var, parts[-1].stride, 1))
        out.append(tuple(share))
    return out
