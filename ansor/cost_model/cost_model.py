"""The cost-model interface the search talks to, the random baseline, and the model file format.

The search only asks two things of a model: score these states (``predict``; higher = predicted faster)
and learn from these measurements (``update``). A model file is one ``.npz`` archive (no pickle, so
loading a file cannot run code) holding a JSON header that names the model kind, plus the kind's arrays.
"""

from __future__ import annotations

import json
import os
import reprlib
import stat
import zipfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Sequence, Union

import numpy as np

from ..errors import AnsorError
from ..state.loop_state import State
from ..log.measurement import MeasureInput, MeasureResult
from ..task.search_task import SearchTask

PathLike = Union[str, "os.PathLike[str]"]

#: Tag in every model file's header; a file without it is not ours.
MODEL_FORMAT = "ansor-cost-model"
MODEL_VERSION = 1


class CostModelError(AnsorError):
    """A model file that cannot be read or written, or training data that cannot train a model."""


class CostModel(ABC):
    """Predicts which programs of a task are fast, and learns from measurements."""

    #: Name of the model kind in its files' header.
    kind: ClassVar[str]

    @abstractmethod
    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Learn from measured programs (retraining as needed)."""

    @abstractmethod
    def predict(self, task: SearchTask, states: Sequence[State]) -> np.ndarray:
        """A score per state, higher = predicted faster; ``-inf`` for a state that cannot be a program."""

    @abstractmethod
    def save(self, path: PathLike) -> None:
        """Write the model to ``path`` (read back with :func:`load_model` or :meth:`load`)."""

    @classmethod
    def load(cls, path: PathLike) -> "CostModel":
        """Read a model of this class written by :meth:`save`."""
        header, arrays = read_model_file(path, cls.kind)
        return cls.from_file(header, arrays, path)

    @classmethod
    @abstractmethod
    def from_file(cls, header: dict[str, Any], arrays: dict[str, np.ndarray], path: PathLike) -> "CostModel":
        """Rebuild a model from the header and arrays its :meth:`save` wrote (``path`` names it in errors)."""


class RandomModel(CostModel):
    """Uniform random scores: the baseline every learned model must beat, and Ansor's warm-up ranking."""

    kind = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Nothing to learn."""

    def predict(self, task: SearchTask, states: Sequence[State]) -> np.ndarray:
        return self._rng.uniform(0.0, 1.0, len(states))

    def save(self, path: PathLike) -> None:
        write_model_file(path, {"kind": self.kind, "seed": self.seed}, {})

    @classmethod
    def from_file(cls, header: dict[str, Any], arrays: dict[str, np.ndarray], path: PathLike) -> "RandomModel":
        try:
            return cls(seed=int(header["seed"]))
        except (KeyError, TypeError, ValueError, OverflowError):
            raise CostModelError(f"{path}: damaged random cost model header") from None


def write_model_file(path: PathLike, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write ``header`` (JSON-able) and ``arrays`` atomically: a crash never leaves half a model file."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    meta = json.dumps({"format": MODEL_FORMAT, "version": MODEL_VERSION, **header}).encode("utf-8")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:  # a file object, so numpy does not append ".npz" to the name
            np.savez(f, header=np.frombuffer(meta, dtype=np.uint8), **arrays)
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CostModelError(f"{out}: cannot write model ({err.strerror or err})") from None


def read_model_file(path: PathLike, kind: str | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The header and arrays of a model file; ``kind``: also check the header names that kind.

    The file is untrusted data: a device or FIFO is refused before reading (``/dev/zero`` would never
    end), and a header nested deeper than any model writes is refused before anything walks it.
    """
    not_model = f"{path}: not a cost model file (save one with scripts/train_cost_model.py)"
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise CostModelError(f"{path} is not a regular file; give a model file (save one with "
                                 "scripts/train_cost_model.py)")
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        header = json.loads(arrays.pop("header").tobytes().decode("utf-8"))
    except OSError as err:
        raise CostModelError(f"{path}: cannot read model ({err.strerror or err})") from None
    except (ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile, UnicodeDecodeError, EOFError,
            RecursionError):
        raise CostModelError(not_model) from None
    if not isinstance(header, dict) or _nesting(header) > _MAX_HEADER_NESTING:
        raise CostModelError(not_model)
    if header.get("format") != MODEL_FORMAT or not isinstance(header.get("kind"), str):
        raise CostModelError(not_model)
    if header.get("version") != MODEL_VERSION:
        raise CostModelError(f"{path}: model file version {reprlib.repr(header.get('version'))}, this ansor reads "
                             f"version {MODEL_VERSION}")
    if kind is not None and header["kind"] != kind:
        raise CostModelError(f"{path}: holds a {header['kind']!r} model, not a {kind!r} one (use load_model)")
    return header, arrays


#: Deepest nesting of a model header (the XGBoost header: header -> params -> a list).
_MAX_HEADER_NESTING = 4


def _nesting(value: Any) -> int:
    """How deeply lists and dicts nest in a JSON value, without recursion (the value is untrusted)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            if level <= _MAX_HEADER_NESTING:  # deeper is refused anyway; do not walk it
                stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest
