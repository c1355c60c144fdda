"""Measure callbacks: what happens to each result the moment it is known.

A callback is any ``callback(inputs, results)``; the measurer calls it once per finished candidate (lists
of one), in completion order, so a log written by :class:`RecordToFile` holds every finished measurement
even if the run is killed mid-batch. Callbacks with a ``close()`` are closed with the measurer.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol, Sequence, Union

from ..errors import short_message
from ..log.measurement import ErrorNo, MeasureInput, MeasureResult

logger = logging.getLogger("ansor")


class MeasureCallback(Protocol):
    def __call__(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None: ...


class RecordToFile:
    """Append every result to a tuning log (one flushed JSON line each, see :mod:`ansor.log.records`)."""

    def __init__(self, path: Union[str, os.PathLike]):
        from ..log.records import RecordWriter  # the records module needs TVM's JSON; import it on use
        self._writer = RecordWriter(path)

    def __call__(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        self._writer.write(inputs, results)

    def close(self) -> None:
        self._writer.close()


class ProgressLogger:
    """Log one line per result on the ``ansor`` logger: speed and best so far, or the error."""

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self._best: dict[str, float] = {}  # GFLOPS by workload key

    def __call__(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        for inp, res in zip(inputs, results):
            self.count += 1
            key = inp.task.workload_key
            if res.ok:
                gflops = inp.task.flop_ct / res.mean_cost / 1e9
                best = self._best[key] = max(gflops, self._best.get(key, 0.0))
                logger.info("#%d %s: %.2f GFLOPS (%.4f ms), best %.2f GFLOPS", self.count, key, gflops,
                            res.mean_cost * 1e3, best)
            else:
                self.errors += 1
                logger.info("#%d %s: %s %s (%d errors so far)", self.count, key, ErrorNo(res.error_no).name,
                            short_message(res.error_msg, 200) if res.error_msg.strip() else "", self.errors)
