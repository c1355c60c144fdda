"""Measurement: building and timing candidates (Ray executor in :mod:`ansor.measure.ray_executor`)."""

from .types import MAX_COST, BuildResult, ErrorNo, MeasureInput, MeasureResult

__all__ = ["MAX_COST", "BuildResult", "ErrorNo", "MeasureInput", "MeasureResult"]
