"""Build a network module, run it on seeded inputs, time it, and compare two builds' outputs.

Threads: TVM's CPU runtime picks its thread count once, when its pool starts, from ``TVM_NUM_THREADS``
(default: half the logical CPUs, i.e. one thread on a 2-vCPU machine). Set it to the core count in the
environment before the first TVM kernel runs in the process; :func:`time_network` reports the count the
runtime actually uses, so a wrong setting shows in every result.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import time
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import tvm
from tvm import relax

from .. import codegen
from ..errors import short_message
from ..host_cpu import allow_amx_or_warn
from ..sketch.tensor_rules import has_amx
from ..target import device_kind, parse_target
from ..task.timing import REPORT
from .schedules import apply_schedules
from .extract import FP32_BUILD_RTOL, Extraction
from .network import Network, NetworkError

logger = logging.getLogger("ansor")

TargetLike = Union[str, dict, tvm.target.Target, None]


@dataclass(frozen=True)
class Timing:
    """End-to-end latency of one network build, in milliseconds."""

    mean_ms: float
    median_ms: float
    max_ms: float
    min_ms: float
    std_ms: float
    num_threads: int
    repeats: int

    def __str__(self) -> str:
        return (f"Mean inference time (std dev): {self.mean_ms:.3f} ms ({self.std_ms:.3f} ms)  "
                f"median {self.median_ms:.3f}  min {self.min_ms:.3f}  max {self.max_ms:.3f}  "
                f"[{self.repeats} repeats, {self.num_threads} threads]")


@dataclass(frozen=True)
class OutputComparison:
    """How far one build's outputs are from a reference build's, on the same inputs.

    ``ok`` when every element differs by at most ``atol + rtol * scale``, where ``scale`` is the largest
    magnitude of the reference output: reductions reordered by a schedule round differently, and a
    relative test per element would fail on values that happen to be near zero.
    """

    max_abs_error: float
    scale: float
    rtol: float
    atol: float

    @property
    def allowed(self) -> float:
        """The largest difference ``ok`` accepts: ``atol + rtol * scale``."""
        return self.atol + self.rtol * self.scale

    @property
    def ok(self) -> bool:
        return self.max_abs_error <= self.allowed


#: The pass-context option of Relax's ``RewriteCUDAGraph`` (in TVM's CUDA finalize passes; off by default).
GRAPH_LAUNCH = "relax.backend.use_cuda_graph"


def runtime_threads() -> int:
    """Threads the TVM CPU runtime of this process uses (fixed when its pool first starts)."""
    return int(tvm.get_global_func("runtime.NumThreads")())


def lowering_pipeline(target: tvm.target.Target) -> tvm.transform.Pass:
    """Relax passes that turn a fused, scheduled module into VM code without legalizing or fusing again.

    TVM's default pipeline would run ``FuseOps``/``FuseTIR`` a second time and merge our scheduled
    PrimFuncs with their neighbours, undoing the schedules; we only lower what is already there.
    """
    pipeline = importlib.import_module(device_kind(target).relax_pipeline)
    passes = pipeline.dataflow_lower_passes(target) + pipeline.finalize_passes(target)

    @tvm.transform.module_pass(opt_level=0, name="AnsorLowerFused")
    def _lower(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _lower


def build(mod: tvm.IRModule, target: TargetLike = None, fused: bool = True) -> tvm.runtime.Executable:
    """Compile a network module for ``target``.

    ``fused=True``: ``mod`` comes from :func:`~ansor.networks.extract.extract` / :func:`apply_schedules` and is
    only lowered. ``fused=False``: ``mod`` is a raw network module, built with TVM's default pipeline
    (legalize, fuse, no schedules: TVM's untuned build).
    """
    target = parse_target(target)
    if has_amx(target):  # the build runs here; a tile instruction without the state: SIGILL
        allow_amx_or_warn("a bf16 build that uses AMX tiles will crash in this process")
    try:
        with _graph_launch() if device_kind(target).graph_launch else contextlib.nullcontext():
            if fused:
                return codegen.compile(mod, target, relax_pipeline=lowering_pipeline(target))
            return codegen.compile(mod, target)
    except Exception as err:  # TVM reports codegen failures with the whole IR around them
        raise NetworkError(f"building the network failed: {short_message(err, None, pick='last')}") from None


def _graph_launch() -> tvm.transform.PassContext:
    """The current pass context with Relax's CUDA-graph rewrite on: the VM captures the launches of each
    static region once and replays the graph on later calls."""
    current = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(opt_level=current.opt_level,
                                     config={**dict(current.config), GRAPH_LAUNCH: True})


def _device(target: TargetLike) -> tvm.runtime.Device:
    target = parse_target(target)
    return device_kind(target).device(target)


def _vm_args(network: Network, inputs: Optional[Sequence[np.ndarray]], dev) -> list:
    arrays = list(inputs) if inputs is not None else network.random_inputs()
    if len(arrays) != len(network.inputs):
        raise NetworkError(f"network {network.name} takes {len(network.inputs)} inputs, got {len(arrays)}")
    return [tvm.runtime.tensor(a, dev) for a in (*arrays, *network.weight_arrays())]


def _to_numpy(value) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)) or type(value).__name__ == "Array":
        return [a for v in value for a in _to_numpy(v)]
    return [value.numpy()]


def run(executable: tvm.runtime.Executable, network: Network, inputs: Optional[Sequence[np.ndarray]] = None,
        target: TargetLike = None) -> list[np.ndarray]:
    """Run a built network once; returns its outputs (a tuple output is flattened)."""
    dev = _device(target)
    vm = relax.VirtualMachine(executable, dev)
    return _to_numpy(vm[network.entry](*_vm_args(network, inputs, dev)))


def time_network(executable: tvm.runtime.Executable, network: Network, inputs: Optional[Sequence[np.ndarray]] = None,
                 target: TargetLike = None, repeat: int = REPORT.repeat,
                 min_repeat_ms: int = REPORT.min_repeat_ms) -> Timing:
    """Time a built network with ``time_evaluator`` on seeded inputs (weights already on the device).

    Each repeat runs the network as often as fits in ``min_repeat_ms`` and reports the average; the
    statistics are over the repeats. Warns if the runtime's thread count differs from the target's cores.
    """
    return time_networks([executable], network, inputs, target, repeat, min_repeat_ms)[0]


def time_networks(executables: Sequence[tvm.runtime.Executable], network: Network,
                  inputs: Optional[Sequence[np.ndarray]] = None, target: TargetLike = None,
                  repeat: int = REPORT.repeat, min_repeat_ms: int = REPORT.min_repeat_ms) -> list[Timing]:
    """Time several builds of ``network`` in turn, as :func:`time_network` times one: repeat ``r`` of every
    build runs before repeat ``r + 1`` of any, so a slow spell of a shared machine falls on all of them
    (timed one after the other, the same two MobileNet-V2 builds of a 2-core Zen 3 read 0.91x and 1.19x)."""
    target = parse_target(target)
    dev = _device(target)
    timers = []
    for executable in executables:
        vm = relax.VirtualMachine(executable, dev)
        timer = vm.time_evaluator(network.entry, dev, number=1, repeat=1, min_repeat_ms=min_repeat_ms)
        timers.append((timer, _vm_args(network, inputs, dev)))
    ms: list[list[float]] = [[] for _ in timers]
    for r in range(repeat):
        for k in range(len(timers)):
            j = (r + k) % len(timers)  # each round starts with the next build: none always follows the same one
            timer, args = timers[j]
            ms[j].append(float(timer(*args).results[0]) * 1e3)
    threads = runtime_threads()
    timings = [Timing(float(np.mean(t)), float(np.median(t)), float(np.max(t)), float(np.min(t)), float(np.std(t)),
                      threads, len(t)) for t in ms]
    cores = target.attrs.get("num-cores")
    if cores is not None and device_kind(target).thread_pool and int(cores) != threads:
        logger.warning("%s was timed with %d TVM threads but the target has %d cores: set TVM_NUM_THREADS=%d "
                       "before the process starts TVM", network.name, threads, int(cores), int(cores))
    for timing in timings:
        logger.info("%s: %s", network.name, timing)
    return timings


@dataclass(frozen=True)
class CallProfile:
    """Where one inference's time goes: wall milliseconds per inference and calls per inference of each
    function the VM calls (kernels, and VM builtins such as ``vm.builtin.alloc_tensor``), and the
    inference's own latency without the probe."""

    ms: dict[str, float]
    calls: dict[str, int]
    latency_ms: float


class CallProfiler:
    """Times every call of a built network's VM function in place, on seeded inputs: kernels run in the
    network's order with its caches (a kernel timed alone keeps its weights hot; here they are not).

    One VM and one set of inputs for many profiles, so several builds can be profiled in turn.
    TVM 0.27's Python VM has no profiler; the VM's instrument hook brackets each call with clock reads in
    Python (microseconds per call, so the calls' sum can exceed ``latency_ms`` on a small network).
    """

    def __init__(self, executable: tvm.runtime.Executable, network: Network,
                 inputs: Optional[Sequence[np.ndarray]] = None, target: TargetLike = None):
        dev = _device(target)
        self._plain = relax.VirtualMachine(executable, dev)
        self._probed = relax.VirtualMachine(executable, dev)
        self._probed.set_instrument(self._probe)
        self._args = _vm_args(network, inputs, dev)
        self._entry = network.entry
        self._seconds: dict[str, float] = collections.defaultdict(float)
        self._calls: collections.Counter = collections.Counter()
        self._started: dict[str, float] = {}
        for vm in (self._plain, self._probed):
            vm[self._entry](*self._args)  # warm up: first-run allocations and page faults

    def _probe(self, _func, name: str, before_run: bool, _ret, *_args):
        now = time.perf_counter()
        if before_run:
            self._started[name] = now
        else:
            self._seconds[name] += now - self._started.pop(name, now)
            self._calls[name] += 1
        return relax.VMInstrumentReturnKind.NO_OP

    def profile(self, repeat: int = 5) -> CallProfile:
        """``repeat`` inferences without the probe (the latency), then ``repeat`` with it (the calls)."""
        begin = time.perf_counter()
        for _ in range(repeat):
            self._plain[self._entry](*self._args)
        latency_ms = (time.perf_counter() - begin) / repeat * 1e3
        self._seconds.clear()
        self._calls.clear()
        for _ in range(repeat):
            self._probed[self._entry](*self._args)
        return CallProfile({k: v / repeat * 1e3 for k, v in self._seconds.items()},
                           {k: v // repeat for k, v in self._calls.items()}, latency_ms)


def profile_calls(executable: tvm.runtime.Executable, network: Network, inputs: Optional[Sequence[np.ndarray]] = None,
                  target: TargetLike = None, repeat: int = 5) -> CallProfile:
    """One :class:`CallProfiler` profile of ``repeat`` inferences."""
    return CallProfiler(executable, network, inputs, target).profile(repeat)


def compare_outputs(network: Network, executable: tvm.runtime.Executable, reference: tvm.runtime.Executable,
                    target: TargetLike = None, seed: int = 0, rtol: float = FP32_BUILD_RTOL, atol: float = 1e-5,
                    reference_network: Optional[Network] = None) -> OutputComparison:
    """Run two builds of ``network`` on the same seeded inputs and measure how far their outputs differ.

    ``reference_network``: what ``reference`` was built from when that differs (e.g. the original network,
    whose weights are arguments, against a build of its :func:`~.prepare.prepare` d form).
    """
    inputs = network.random_inputs(seed)
    got = run(executable, network, inputs, target)
    want = run(reference, reference_network or network, inputs, target)
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
        raise NetworkError(f"network {network.name}: the two builds return differently shaped outputs "
                           f"({[g.shape for g in got]} vs {[w.shape for w in want]})")
    error = max(float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) for g, w in zip(got, want))
    scale = max(float(np.max(np.abs(w))) for w in want)
    if not np.isfinite(scale):
        raise NetworkError(f"network {network.name}: the reference output is not finite")
    return OutputComparison(error, scale, rtol, atol)


def check_against_default(extraction: Extraction, tuned: tvm.IRModule, target: TargetLike = None,
                          seed: int = 0, rtol: Optional[float] = None, atol: float = 1e-5) -> OutputComparison:
    """Compare a tuned module's outputs with the default-scheduled build of the same extraction.

    Apply-best must never change results: only loop structure differs between the two, so any difference
    beyond rounding is a bug in a schedule.
    """
    default = apply_schedules(extraction.mod, extraction.tasks, {}, target=target)
    return compare_outputs(extraction.network, build(tuned, target), build(default, target), target, seed,
                           extraction.output_rtol if rtol is None else rtol, atol)
