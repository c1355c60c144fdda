"""Where a tuning run's log is and how it is written: every measurement appended the moment it is known."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union

from ..errors import AnsorError
from ..host_cpu import host_machine
from ..log.measurement import MeasureCallback
from ..log.records import Record, RecordWriter, load_records, other_targets_message
from ..task.search_task import SearchTask
from ..target import physical_cores
from .options import Measurer, TuningOptions, make_measurer

if TYPE_CHECKING:
    from ..log.database import Database

logger = logging.getLogger("ansor")


@contextmanager
def measuring_into(path: Path, options: TuningOptions, on_round: Optional[Callable[[Any], None]] = None,
                   callbacks: Sequence[MeasureCallback] = ()) -> Iterator[tuple[Measurer, Callable[[Any], None]]]:
    """A measurer (:func:`make_measurer`, then ``callbacks``) whose first callback appends each result to the
    log at ``path`` the moment it is known, and ``on_round`` preceded by an fsync of the log.

    The one way a tuning workflow writes its log: after Ctrl-C or a crash every finished measurement is on
    disk and a rerun resumes it, and each round's measurements survive a power loss too. Runners on this
    machine (no Ray address) measure: the log keeps its facts (:class:`~ansor.host_cpu.MachineFacts`).
    """
    machine = host_machine(physical_cores()) if options.ray_address is None else None
    with RecordWriter(path, machine=machine) as writer, make_measurer(options, [writer.write, *callbacks]) as measurer:

        def round_done(report: Any) -> None:
            writer.sync()
            if on_round is not None:
                on_round(report)

        yield measurer, round_done


def log_path(path: Union[str, os.PathLike], example: str = "logs/mm.json") -> Path:
    """``path`` as the log a tuning run appends to; a directory is refused with a one-line error."""
    path = Path(path)
    if path.is_dir():
        raise AnsorError(f"log {path} is a directory; give a file path (example: {example})")
    return path


def log_history(path: Union[str, os.PathLike], tasks: Sequence[SearchTask]) -> list[Record]:
    """The records of ``tasks`` (for their target) in the log at ``path``; when there are none, say which
    targets the log holds (a resume that silently re-measures everything is the worst outcome)."""
    keys = {t.workload_key for t in tasks}
    one = next(iter(keys)) if len(keys) == 1 else None  # the loader then skips every other task's lines
    records = [r for r in load_records(path, workload_key=one, target=tasks[0].target) if r.workload_key in keys]
    if not records:
        note = other_targets_message(path, tasks[0].target, keys)
        if note:
            logger.warning("resuming nothing: %s", note)
    return records


def default_log_path(name: str, database: Optional["Database"] = None) -> Path:
    """``<database>/<name>.json`` with a database, else ``logs/<name>.json`` (the scripts' convention)."""
    return database.log_path(name) if database is not None else Path("logs") / f"{name}.json"
