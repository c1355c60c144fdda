"""Measurement: building and timing candidates on Ray, with Ansor's error codes and timeouts.

The data types live in the core (:mod:`ansor.log.measurement`) and are re-exported here; everything that needs
Ray (:class:`ProgramMeasurer` and the builders and runners behind it) is imported on first use.
"""

from importlib import import_module
from typing import Any

from ..log.measurement import (
    MAX_COST, BuildResult, ErrorNo, MeasureCallback, MeasureInput, MeasureResult, Span, program_results,
)

_LAZY = {
    "ProgramBuilder": ".measurer",
    "ProgramMeasurer": ".measurer",
    "ProgramRunner": ".measurer",
}

__all__ = ["MAX_COST", "BuildResult", "ErrorNo", "MeasureCallback", "MeasureInput", "MeasureResult", "Span",
           "program_results", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
