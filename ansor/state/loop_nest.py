"""Iterator and Stage: the frozen loop nest of one block, as the search sees it.

A :class:`~ansor.state.loop_state.State` holds one :class:`Stage` per block; a transform step replaces stages and
iterators, never edits them, so copying a state copies a list of references.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Optional

from .access import BlockInfo, IterKind, LoopPart


class AttachKind(Enum):
    """Where a stage is computed: at the root, inlined into its consumers, or under another stage's loop."""

    ROOT = "root"
    INLINED = "inline"
    ITER = "iter"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Iterator:
    """One loop of a stage; ``parts`` say which block variables it walks and with what stride."""

    name: str
    extent: Optional[int]
    kind: IterKind
    annotation: str = "none"
    pragma: str = ""
    parts: tuple[LoopPart, ...] = ()


@dataclass(frozen=True, slots=True)
class Stage:
    """One block: its loops, how it touches memory, and where it is computed."""

    name: str
    iters: tuple[Iterator, ...]
    block: BlockInfo
    compute_at: AttachKind = AttachKind.ROOT
    attach: tuple[int, int] = (-1, -1)  # (stage id, iterator id) when compute_at is ITER
    origin: int = -1  # the ComputeDAG stage this block comes from; -1 for stages a step added
    packed: tuple[str, ...] = ()  # arguments read through a copy in this stage's loop order (LR steps)

    @property
    def reduces_across_threads(self) -> bool:
        """Whether a loop of the stage's reduction is bound to GPU threads (a cross-thread reduction)."""
        return any(it.kind != IterKind.SPATIAL and it.annotation.startswith("threadIdx.") for it in self.iters)


def fused_kind(kinds: Iterable[IterKind]) -> IterKind:
    """The kind of a loop walking iterators of these kinds: theirs if they agree, else MIXED."""
    distinct = set(kinds)
    return distinct.pop() if len(distinct) == 1 else IterKind.MIXED
