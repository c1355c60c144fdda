"""Keep PyTorch out of ansor's measurement workers.

``tvm_ffi`` imports ``torch`` at start-up whenever it is installed (for DLPack exchange with torch tensors),
and most users of a tensor compiler have torch installed. Every Ray worker that builds or times a candidate
imports TVM, so each paid for torch too: on a Zen 3, ``import tvm`` took 4.8-10 s and 850 MB of memory
beside torch 2.14, 1.5 s and 195 MB without it, in every build worker, every runner and every restart of
one. Nothing a worker runs touches torch, so :mod:`ansor.measure.ray_session` marks Ray's workers with
:data:`WORKER_ENV` and the package's import (``ansor/__init__``, the first thing a worker runs of ours)
makes ``import torch`` fail there; ``tvm_ffi`` treats that as torch not being installed.
"""

from __future__ import annotations

import os
import sys

#: Set to "1" in the environment of every Ray worker of an ansor job (and the build processes they start).
WORKER_ENV = "ANSOR_MEASURE_WORKER"


def keep_torch_out_of_workers() -> None:
    """In a worker marked with :data:`WORKER_ENV`, make ``import torch`` raise ``ModuleNotFoundError``.

    A ``None`` entry in ``sys.modules`` is Python's documented way to block an import. A process that has
    imported torch already (not one of ours) keeps it.
    """
    if os.environ.get(WORKER_ENV) == "1" and "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
