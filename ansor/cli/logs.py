"""Log files of the scripts: checks on ``--log-file``, and the ``<network>-b<batch>.json`` naming convention.

A network's log is called ``<network>-b<batch>.json`` (``<network>-b<batch>-bf16.json`` when tuned in bf16), so
the network, batch and precision of a log can be read back from its name (:func:`log_name`,
:func:`network_from_log_name`, :func:`precision_from_log_name`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from ..errors import RecordError
from ..task.precision import Precision

_LOG_NAME = re.compile(r"^(?P<network>.+)-b(?P<batch>\d+)(?:-(?P<precision>bf16(?:-stored)?))?$")


def check_log_file(log_file: Path, *, must_exist: bool = False, resume: bool = False) -> None:
    """One-line errors for a log that is a directory, unreadable, or (``must_exist``) missing."""
    if log_file.exists() and log_file.is_dir():
        raise RecordError(f"log {log_file} is a directory; give a file path (example: --log-file logs/mm.json)")
    if (resume or must_exist) and log_file.exists() and not os.access(log_file, os.R_OK):
        raise RecordError(f"cannot read log {log_file} (permission denied)")
    if must_exist and not log_file.exists():
        raise RecordError(f"log {log_file} does not exist")


def log_name(network: str, batch_size: int, precision: str = "fp32") -> str:
    """The default log file name of a network: ``<network>-b<batch>.json``, ``-bf16`` before ``.json`` in bf16."""
    return f"{network}-b{batch_size}{Precision(precision).suffix}.json"


def network_from_log_name(path: os.PathLike) -> Optional[tuple[str, int]]:
    """``(network, batch)`` from a log named ``<network>-b<batch>.json``, else ``None``."""
    match = _LOG_NAME.match(Path(path).stem)
    return (match["network"], int(match["batch"])) if match else None


def precision_from_log_name(path: os.PathLike) -> str:
    """``bf16`` for a log whose name ends in ``-bf16.json`` (``ansor tune``'s ``<network>-b<batch>-bf16.json``,
    the zoo bench's ``<model>-bf16.json``), likewise ``bf16-stored``, else ``fp32``."""
    stem = Path(path).stem
    return next((p.value for p in Precision if p.suffix and stem.endswith(p.suffix)), "fp32")
