"""What goes into and comes out of a measurement, with Ansor's error codes.

Plain data in the core, free of Ray: records, the cost model and the search read it without depending on
how programs are built and timed (:mod:`ansor.measure`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol, Sequence

from ..errors import short_message
from ..state.layout_rewrite import PackedLayout
from ..state.loop_state import State
from ..task.search_task import SearchTask

#: Cost recorded for a candidate that failed, so it sorts last everywhere.
MAX_COST = 1e10
#: Longest ``error_msg`` of a result: enough for TVM's reason and a short traceback, not a whole program.
MAX_ERROR_CHARS = 2000


def error_text(err: BaseException) -> str:
    """A result's ``error_msg`` for an exception: its type and its whole (bounded) text."""
    return short_message(err, MAX_ERROR_CHARS, pick="all", typed=True)


class ErrorNo(IntEnum):
    """Ansor's measurement error codes (the numbers are stored in logs; do not renumber)."""

    NO_ERROR = 0
    INSTANTIATION_ERROR = 1
    COMPILE_HOST = 2
    COMPILE_DEVICE = 3
    RUNTIME_DEVICE = 4
    WRONG_ANSWER = 5
    BUILD_TIMEOUT = 6
    RUN_TIMEOUT = 7
    UNKNOWN_ERROR = 8
    #: Not one of Ansor's: the measurement machinery failed, not the program (a node lost, a worker that
    #: did not start or was killed for the machine's memory), and a retry did not help. Such a result is
    #: not learned from and its program may be proposed again (see :func:`program_results`).
    INFRA_ERROR = 9


@dataclass
class MeasureInput:
    """One candidate: a state of a task."""

    task: SearchTask
    state: State


@dataclass
class BuildResult:
    """An exported library (bytes, so any node can load it) or the reason there is none."""

    lib: bytes | None
    error_no: int
    error_msg: str = ""
    time_cost: float = 0.0
    start: float = 0.0  # wall-clock time the build began (``time.time()``), for timelines
    node: str = ""  # Ray node id of the process that built it
    packed: tuple[PackedLayout, ...] = ()  # the library takes these arguments pre-packed


@dataclass
class MeasureResult:
    """Seconds per run for each repeat, or ``(MAX_COST,)`` and an error code."""

    costs: tuple[float, ...]
    error_no: int
    error_msg: str = ""
    all_cost: float = 0.0
    timestamp: float = field(default_factory=time.time)
    node: str = ""
    #: False when the candidate was timed without checking its output against the reference (stored in a
    #: log as ``"unchecked": 1``), so its speed may belong to a wrong program.
    checked: bool = True
    #: True for the network-level selection's verdict (stored as ``"net": 1``): the costs are this state's
    #: per-call times inside the built network, and the state is the one the network runs fastest with.
    #: Not a trial: only :func:`~ansor.log.records.best_records` reads it (see docs/log_format.md).
    in_network: bool = False

    @property
    def mean_cost(self) -> float:
        return sum(self.costs) / len(self.costs) if self.costs else MAX_COST

    @property
    def ok(self) -> bool:
        return self.error_no == ErrorNo.NO_ERROR

    @property
    def retriable(self) -> bool:
        """The failure was the infrastructure's: it says nothing about the program."""
        return self.error_no == ErrorNo.INFRA_ERROR


class MeasureCallback(Protocol):
    """What sees each result the moment it is known: the measurer calls it once per finished candidate
    (lists of one), in completion order, so a log written by one (``RecordWriter.write``) holds every
    finished measurement even if the run is killed mid-batch. One with a ``close()`` is closed with the
    measurer."""

    def __call__(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None: ...


def program_results(inputs: Sequence[MeasureInput],
                    results: Sequence[MeasureResult]) -> tuple[list[MeasureInput], list[MeasureResult]]:
    """The (input, result) pairs that say something about their program: all but infrastructure failures.

    What the search policy remembers as measured and the cost model learns from; a program whose
    measurement failed for the infrastructure's sake stays eligible.
    """
    kept = [(i, r) for i, r in zip(inputs, results) if not r.retriable]
    return [i for i, _ in kept], [r for _, r in kept]


@dataclass(frozen=True)
class Span:
    """One build or run of a batch: where and when it happened (wall clock, seconds).

    Kept so tests and progress displays can check the measurement discipline (builds overlap, runs never
    overlap each other or a build on the same node) from what the workers themselves recorded.
    """

    kind: str  # "build", "run", or "reference" (the one run of a task's unscheduled program)
    index: int  # position of the candidate in the measured batch; -1 for a reference
    node: str
    start: float
    end: float
