"""TVM's CPU thread pool between kernels: which runtime setting runs a built network fastest on this machine.

TVM reads its pool settings from the environment once, when the pool starts, and a process keeps what it
got: the same build of EfficientNet-B0 on 2 cores (AMD EPYC, Zen 5) ran in 3.38, 4.49 and 3.48 ms in three
fresh processes with TVM's default of binding each thread to a core, and in 3.31-3.36 ms in three with
``TVM_BIND_THREADS=0``; tiny-cnn ran in 0.019 ms or 0.046 ms depending on the process, only when bound.
So a setting cannot be judged in this process, nor by one process: :func:`choose_pool_setting` exports
the build and times it in a few fresh processes per setting, in turn, and keeps unbound threads unless
another setting is faster on average by more than :data:`MARGIN`. Unbound is the reference, not TVM's
default, because bound threads collapse when another process keeps one of their cores busy: SqueezeNet-1.1
on 2 cores with a busy loop on the second ran 175 ms bound, 14.5-18.4 ms unbound, 2.05 ms with the core free.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import tvm

from ..errors import AnsorError
from ..networks.network import Network
from ..task.search_task import TargetLike
from ..task.timing import POOL_PROBE, POOL_PROBE_PROCESSES, TimingPolicy
from ..target import parse_target
from .export import LOADER, export_network

logger = logging.getLogger("ansor")

#: A setting must beat TVM's default by this share of its mean latency: the spread of one process's
#: median on a quiet machine (ResNet-50, 2 cores: 16.8-17.1 ms).
MARGIN = 0.02


@dataclass(frozen=True)
class PoolSetting:
    """A named set of TVM runtime environment variables."""

    name: str
    env: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env) or "TVM's defaults"


#: What is tried, the reference first: threads left to the OS scheduler, TVM's default (each thread bound
#: to a core, workers spin a while before sleeping), and workers that sleep at once.
SETTINGS = (PoolSetting("unbound", (("TVM_BIND_THREADS", "0"),)), PoolSetting("bound"),
            PoolSetting("no spin", (("TVM_THREAD_POOL_SPIN_COUNT", "0"),)))


@dataclass(frozen=True)
class PoolChoice:
    """Each setting's latency in every fresh process (median ms of one process each), and the choice."""

    best: PoolSetting
    ms: dict[str, list[float]]

    def __str__(self) -> str:
        rows = ", ".join(f"{name} {statistics.mean(v):.3f} ms" for name, v in self.ms.items())
        n = len(next(iter(self.ms.values())))
        return (f"thread pool (mean of {n} process{'es' if n != 1 else ''} each): {rows}; "
                f"best: {self.best} ({self.best.name})")


#: Run in a fresh process: the export's own loader, then the entry timed on zeros.
_PROBE = LOADER + '''
args = [tvm.runtime.tensor(np.zeros(s["shape"], s["dtype"]), device) for s in meta["inputs"]]
timer = vm.time_evaluator(meta["entry"], device, number=1, repeat=int(os.environ["PROBE_REPEAT"]),
                          min_repeat_ms=int(os.environ["PROBE_MS"]))
print(sorted(timer(*args, *weights).results)[2] * 1e3)
'''


def choose_pool_setting(executable: tvm.runtime.Executable, network: Network, target: TargetLike,
                        processes: int = POOL_PROBE_PROCESSES, settings: Sequence[PoolSetting] = SETTINGS,
                        timing: TimingPolicy = POOL_PROBE) -> PoolChoice:
    """Time ``executable`` in ``processes`` fresh processes per setting, in turn; the first setting is the
    default the others must beat by :data:`MARGIN`."""
    ms: dict[str, list[float]] = {s.name: [] for s in settings}
    with tempfile.TemporaryDirectory(prefix="ansor-pool-") as work:
        export_network(executable, network, work, parse_target(target))
        threads = json.loads((Path(work) / "model.json").read_text())["num_threads"]  # the target's cores
        for _ in range(processes):
            for setting in settings:
                env = {**os.environ, **dict(setting.env), "MODEL_DIR": work,
                       "PROBE_MS": str(timing.min_repeat_ms), "PROBE_REPEAT": str(timing.repeat)}
                if threads:
                    env["TVM_NUM_THREADS"] = str(threads)
                proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                                      timeout=600)
                if proc.returncode != 0:
                    raise AnsorError(f"timing the network with {setting} failed: "
                                     f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
                ms[setting.name].append(float(proc.stdout.split()[-1]))
    default = statistics.mean(ms[settings[0].name])
    best = min(settings, key=lambda s: statistics.mean(ms[s.name]))
    if statistics.mean(ms[best.name]) > (1 - MARGIN) * default:
        best = settings[0]
    choice = PoolChoice(best, ms)
    logger.info("%s", choice)
    return choice
