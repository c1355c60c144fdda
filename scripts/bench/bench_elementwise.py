"""Benchmark: elements per second of each activation, the exact TIR operator against ansor's fast version
(ansor/networks/fast_math.py), both with the default schedule an untuned network kernel gets (parallel
outer loops, vectorized inner loop).

Run: python scripts/bench/bench_elementwise.py [--elements N] [--repeat N] [--target T]

The exact versions are what TVM's legalization makes of the Relax operators: exp, sigmoid and tanh
become libm ``expf`` calls one lane at a time, erf ``erff``; hardswish, hardsigmoid and rsqrt vectorize
already and have no fast version. TVM_NUM_THREADS is set to the target's core count (the runtime would
use one thread on a 2-vCPU machine otherwise). Time it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Callable, Optional

import numpy as np


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=1 << 20, help="float32 elements (default: 2^20)")
    parser.add_argument("--repeat", type=int, default=9, help="rounds; each version's median is reported (default: 9)")
    parser.add_argument("--target", default="host", help="LLVM target (default: this CPU, its physical cores)")
    parser.add_argument("--only", nargs="*", default=None, help="activations to time (default: all)")
    args = parser.parse_args()

    from ansor.target import parse_target  # imports TVM: after the flags, so --help is instant

    target = parse_target(args.target)
    cores = int(target.attrs["num-cores"])
    os.environ.setdefault("TVM_NUM_THREADS", str(cores))  # before the runtime's thread pool starts
    rows = _activations()
    if args.only:
        rows = [r for r in rows if r[0] in args.only]
    x = np.random.default_rng(0).normal(0.0, 3.0, args.elements).astype(np.float32)
    timers = []  # (name, exact timer, fast timer or None); built first, then timed in alternation
    for name, exact, fast in rows:
        data = np.abs(x) + np.float32(1e-3) if name == "rsqrt" else x
        timers.append((name, _timer(exact, data, target), _timer(fast, data, target) if fast else None))
    seconds: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.repeat):  # round-robin, so a neighbour's burst of load hits both versions alike
        for name, *pair in timers:
            for is_fast, timer in enumerate(pair):
                if timer is not None:
                    seconds.setdefault((name, bool(is_fast)), []).append(timer())
    print(f"CPU {_cpu_model()}, target {target.attrs['mcpu']}, {os.environ['TVM_NUM_THREADS']} threads, "
          f"{args.elements} float32 elements, median of {args.repeat} rounds")
    print(f"{'activation':<12}{'exact Melem/s':>15}{'fast Melem/s':>15}{'speedup':>9}")
    for name, _, fast in timers:
        slow = args.elements / statistics.median(seconds[name, False])
        quick = args.elements / statistics.median(seconds[name, True]) if fast else None
        speed = f"{quick / slow:8.1f}x" if quick else f"{'-':>9}"
        print(f"{name:<12}{slow / 1e6:>15.0f}{(f'{quick / 1e6:.0f}' if quick else '-'):>15}{speed}")


def _activations() -> list[tuple[str, Callable, Optional[Callable]]]:
    """(name, exact te function, fast te function or None) per activation."""
    from tvm import te, tirx

    from ansor.networks import fast_math

    def each(fn: Callable) -> Callable:
        return lambda a: te.compute(a.shape, lambda i: fn(a[i]), name="T_exact")

    def fast(name: str) -> Callable:
        return lambda a: fast_math.elementwise(a, name)

    f = lambda v: tirx.const(v, "float32")  # noqa: E731
    hardsigmoid = lambda v: tirx.min(tirx.max(v * f(0.2) + f(0.5), f(0.0)), f(1.0))  # noqa: E731 (ONNX's)
    return [
        ("exp", each(te.exp), fast("exp")),
        ("sigmoid", each(te.sigmoid), fast("sigmoid")),
        ("silu", each(lambda v: v * te.sigmoid(v)), fast("silu")),
        ("tanh", each(te.tanh), fast("tanh")),
        ("erf", each(te.erf), fast("erf")),
        ("gelu", each(lambda v: v * (f(0.5) + f(0.5) * te.erf(v * f(0.7071067811865476)))), fast("gelu")),
        ("hardsigmoid", each(hardsigmoid), None),
        ("hardswish", each(lambda v: v * tirx.min(tirx.max(v + f(3.0), f(0.0)), f(6.0)) / f(6.0)), None),
        ("rsqrt", each(te.rsqrt), None),
    ]


def _timer(compute: Callable, data: np.ndarray, target) -> Callable[[], float]:
    """A function timing one call of ``compute`` on ``data`` (default schedule), in seconds."""
    import tvm
    from tvm import te

    from ansor.networks.default_schedule import default_state
    from ansor.task.program import build_program
    from ansor.task.search_task import SearchTask

    a = te.placeholder(data.shape, "float32", name="A")
    task = SearchTask(te.create_prim_func([a, compute(a)]), target)
    lib = build_program(task, default_state(task))
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(data, dev), tvm.runtime.tensor(np.empty_like(data), dev)]
    timer = lib.time_evaluator("main", dev, number=10, repeat=1, min_repeat_ms=100)
    return lambda: timer(*args).mean


if __name__ == "__main__":
    main()
