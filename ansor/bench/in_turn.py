"""Time the builds of several tuning logs of one network in turn, in fresh processes.

A network's time differs by a few percent from one process to the next, for the process's whole life: the
same two ViT-B/16 builds timed in turn (7 rounds each) in three processes one after another gave ratios
0.990, 1.038 and 0.986 (2-core Zen 5; huge pages for every allocation did not remove it). Rounds in one
process share its offset, so they cannot average it out; rounds spread over several processes can.

  python -m ansor.bench.in_turn MODEL.onnx A.json B.json --rounds 5 --repeat 5
  python -m ansor.bench.in_turn mobilenet-v2 A.json B.json      # a built-in network, batch 1

prints, as its last line, the JSON list of rounds: each the median milliseconds of every log's build.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence, Union

from ..errors import short_message
from ..networks import (
    Network, apply_history_best, build, extract, get_network, load_onnx, network_names, time_network,
)
from ..target import parse_target

Rounds = list[list[float]]


def is_builtin(model: Union[str, Path]) -> bool:
    """Whether ``model`` names a built-in network rather than an ONNX file."""
    return str(model) in network_names() and not Path(model).is_file()


def load_model(model: Union[str, Path]) -> Network:
    """An ONNX file's network, or a built-in network's at batch 1."""
    return get_network(str(model), 1) if is_builtin(model) else load_onnx(model)


def model_flags(model: Union[str, Path]) -> list[str]:
    """The ``ansor tune`` flags that name ``model``."""
    return ["--network", str(model)] if is_builtin(model) else ["--onnx", str(model)]


def in_turn(contenders: dict[str, Callable[[], float]], rounds: int, pause: float) -> dict[str, list[float]]:
    """Each contender's milliseconds per round, timed one after another with ``pause`` seconds before each;
    round ``i`` starts with contender ``i``, so none always runs right after the same one."""
    names = list(contenders)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            time.sleep(pause)
            out[name].append(contenders[name]())
    return out


def time_in_turn(onnx: Union[str, Path], logs: Sequence[Path], rounds: int, repeat: int, target=None) -> Rounds:
    """Build each log's best schedules into the network and time the builds :func:`in_turn`, ``rounds``
    times, a second apart."""
    target = parse_target(target)
    extraction = extract(load_model(onnx), target)
    builds = [build(apply_history_best(extraction.mod, extraction.tasks, str(log), target=target), target)
              for log in logs]
    timed = in_turn({str(j): (lambda b=b: time_network(b, extraction.network, target=target, repeat=repeat)
                              .median_ms) for j, b in enumerate(builds)}, rounds, 1.0)
    return [list(round_ms) for round_ms in zip(*timed.values())]


def time_in_processes(onnx: Union[str, Path], logs: Sequence[Path], processes: int, rounds: int,
                      repeat: int) -> list[Rounds]:
    """:func:`time_in_turn` in ``processes`` fresh Python processes, one after another (the caller's
    environment, TVM_NUM_THREADS included); one list of rounds per process."""
    out = []
    for _ in range(processes):
        cmd = [sys.executable, "-m", "ansor.bench.in_turn", str(onnx), *map(str, logs),
               "--rounds", str(rounds), "--repeat", str(repeat)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"timing {Path(onnx).name} in a fresh process failed ({proc.returncode}): "
                               f"{short_message(proc.stderr, pick='last')}")
        out.append(json.loads(lines[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx", help="the network: an ONNX file or a built-in network's name")
    parser.add_argument("logs", nargs="+", type=Path, help="tuning logs of that network")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of timings in turn (default 5)")
    parser.add_argument("--repeat", type=int, default=5, help="timing repeats of each build per round (default 5)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.logs if not p.is_file()]
    if not is_builtin(args.onnx) and not Path(args.onnx).is_file():
        missing.insert(0, args.onnx)
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    print(json.dumps(time_in_turn(args.onnx, args.logs, args.rounds, args.repeat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
