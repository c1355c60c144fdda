"""A tuning database: a directory of logs, consulted by workload key and target.

Every log in the directory (``*.json``, any run's, any workload's) is part of it. A task tuned before, in
any of them, for the same target, starts from those records instead of from nothing: the single-task
paths count them towards the task's budget (and measure nothing when it is spent); a network run treats
such a task as done (see ``ansor.relax.tune_tasks``). Runs given a database write their own log into its
directory by default, so the database grows with every run. :meth:`Database.distill` keeps the best
record(s) of each task. Files are read as data (:func:`~ansor.log.records.load_records`), never executed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import tvm

from ..errors import RecordError
from .records import Record, best_records, distill, load_records

logger = logging.getLogger("ansor")

PathLike = Union[str, "os.PathLike[str]"]
#: The file :meth:`Database.distill` writes when it compacts a database in place.
DISTILLED_NAME = "distilled.json"


class Database:
    """The logs of one directory (created if missing).

    Parameters
    ----------
    directory
        Where the logs are. Files whose name starts with ``.`` (temporary files) are ignored.
    """

    def __init__(self, directory: PathLike):
        self.path = Path(directory)
        if self.path.exists() and not self.path.is_dir():
            raise RecordError(f"database {self.path} is a file; give a directory (example: --database tuning-db)")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RecordError(f"cannot create database directory {self.path} ({err.strerror or err})") from None

    def logs(self, exclude: Iterable[PathLike] = ()) -> list[Path]:
        """The database's log files in name order, without ``exclude`` (e.g. the run's own log)."""
        skip = {Path(p).resolve() for p in exclude}
        return sorted(p for p in self.path.glob("*.json")
                      if p.is_file() and not p.name.startswith(".") and p.resolve() not in skip)

    def records(self, workload_key: Optional[str] = None, target: Union[str, tvm.target.Target, None] = None,
                exclude: Iterable[PathLike] = (), selections: bool = False) -> list[Record]:
        """Every record of ``workload_key`` (all keys if ``None``) measured for ``target`` (any if ``None``);
        ``selections``: also the network-level selection's records (see :func:`load_records`)."""
        paths = self.logs(exclude)
        return load_records(paths, workload_key=workload_key, target=target, selections=selections) if paths else []

    def history(self, workload_keys: Sequence[str], target: Union[str, tvm.target.Target, None],
                exclude: Iterable[PathLike] = ()) -> dict[str, list[Record]]:
        """Records by workload key for several tasks at once (one pass over the logs)."""
        wanted = set(workload_keys)
        out: dict[str, list[Record]] = {}
        for rec in self.records(target=target, exclude=exclude):
            if rec.workload_key in wanted:
                out.setdefault(rec.workload_key, []).append(rec)
        return out

    def best(self, workload_key: str, target: Union[str, tvm.target.Target, None] = None) -> Optional[Record]:
        """The fastest valid record of a task, or ``None``."""
        return best_records(self.records(workload_key, target, selections=True)).get(workload_key)

    def log_path(self, name: str) -> Path:
        """Where a run called ``name`` writes its log: ``<directory>/<name>.json``."""
        return self.path / f"{name}.json"

    def distill(self, out: Optional[PathLike] = None, top_k: int = 1) -> int:
        """Keep the ``top_k`` best valid records of each task and target; returns how many were kept.

        With ``out``, they are written there and the database is left as it is. Without, the database is
        compacted in place: they are written to ``distilled.json`` (atomically), then every other log of
        the directory is deleted. Budgets count records, so a distilled task has a smaller history.
        """
        paths = self.logs()
        if not paths:
            return 0
        if out is not None:
            return distill(paths, out, top_k)
        target_path = self.path / DISTILLED_NAME
        kept = distill(paths, target_path, top_k)
        for p in paths:
            if p.resolve() != target_path.resolve():
                p.unlink()
        logger.info("database %s distilled into %s: %d records", self.path, target_path, kept)
        return kept

    def __repr__(self) -> str:
        return f"Database({str(self.path)!r})"


def as_database(value: Union[Database, PathLike, None]) -> Optional[Database]:
    """A :class:`Database` from a database, a directory path, or ``None``."""
    if value is None or isinstance(value, Database):
        return value
    return Database(value)


def log_paths(source: Union[Database, PathLike, Sequence[PathLike]]) -> list[Path]:
    """The log files of a database, a log path, or a list of log paths."""
    if isinstance(source, Database):
        return source.logs()
    if isinstance(source, (str, os.PathLike)):
        return [Path(source)]
    return [Path(p) for p in source]
