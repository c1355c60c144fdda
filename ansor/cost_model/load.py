"""Reading a saved model of any kind: the one place that knows every kind of cost model."""

from __future__ import annotations

import reprlib

from .cost_model import CostModel, CostModelError, PathLike, RandomModel, read_model_file


def load_model(path: PathLike) -> CostModel:
    """Read any model file written by a :class:`CostModel` (what ``--load-model FILE`` options call).

    Raises
    ------
    CostModelError
        If the file is missing, unreadable, or not a model file of a kind this version knows.
    """
    header, arrays = read_model_file(path)
    if header["kind"] == RandomModel.kind:
        return RandomModel.from_file(header, arrays, path)
    if header["kind"] == "xgb":
        from .xgb_model import XGBModel  # XGBoost is imported only by models that use it
        return XGBModel.from_file(header, arrays, path)
    raise CostModelError(f"{path}: unknown cost model kind {reprlib.repr(header['kind'])} (known: random, xgb)")
