"""Where a tuned network's time goes against OpenVINO's, one class of layer at a time.

A network's ratio to OpenVINO says how far apart the two are, not where. OpenVINO times each node it executes
(``PERF_COUNT``), ansor's call profile each PrimFunc call in place (:class:`~ansor.networks.CallProfiler`);
both are summed per class of layer: a convolution by its kernel and whether it is grouped or depthwise
(``conv 3x3``, ``conv 1x1``, ``conv 3x3 depthwise``), a matrix product (``matmul``), a pooling (``pool``),
and everything else (``other``). OpenVINO fuses a convolution's bias, activation and residual add into the
convolution's node, as ansor fuses them into its PrimFunc, so the classes hold the same work on both sides.

The two profiles are taken in turn, ``--rounds`` times, and each class's milliseconds are the median over
the rounds. Probing every call costs ansor's side a few microseconds a call (its sum exceeds its latency).

  python scripts/bench/bench_layers.py resnet50.onnx resnet50-bf16.json --precision bf16

(``TVM_NUM_THREADS`` and OpenVINO's threads are set to the machine's physical cores; OpenVINO runs in its
default precision for this CPU, bf16 where the CPU has native bf16, as ``ansor bench`` times it.)
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from ..arguments import PRECISIONS
from ..errors import AnsorError
from .docs import markdown_table
from .peers import feed_name

#: A task's name: its PrimFunc's op names, then its input shapes (``fused_conv2d_add [1,56,56,64]x[3,3,64,64]``).
_SHAPES = re.compile(r"\[([\d,]+)\]")
OTHER = "other"


@dataclass(frozen=True)
class ClassTimes:
    """One class of layer: calls per inference and milliseconds per inference on each side."""

    name: str
    ansor_calls: int
    ansor_ms: float
    peer_calls: int
    peer_ms: float


def _kernel(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)


def _conv_class(kernel: Sequence[int], grouped: bool, depthwise: bool) -> str:
    """``conv 3x3``, ``conv 3x3 grouped`` or ``conv 3x3 depthwise`` (depthwise is grouped, one channel a group)."""
    return f"conv {_kernel(kernel)}" + (" depthwise" if depthwise else " grouped" if grouped else "")


def task_class(name: str) -> str:
    """The class of an extracted task from its name (``NetworkTask.name``), by the layouts ansor gives a
    convolution's weight: ``[*taps, I, O]`` (fp32; ``I`` the channels of a group: 1 when depthwise),
    ``[O/16, *taps, I/2, 16, 2]`` (bf16, packed in pairs), and a 1x1 convolution flattened to a product of
    a ``[pixels, channels]`` matrix. A Winograd convolution's product is a ``matmul``, its input and output
    transforms ``winograd transforms``."""
    ops, *_ = name.split(" ", 1)
    shapes = [[int(d) for d in s.split(",")] for s in _SHAPES.findall(name)]
    if "winograd" in ops:
        return "winograd transforms"
    if "conv" in ops and len(shapes) >= 2:
        data, weight = shapes[0], shapes[1]
        if len(data) == 2:
            return _conv_class((1, 1), "group_conv" in ops, False)
        packed = len(weight) == len(data) + 2  # bf16: [O/16, *taps, I/2, 16, 2] against [N, *spatial, C]
        taps, group_channels = (weight[1:-3], 2 * weight[-3]) if packed else (weight[:-2], weight[-2])
        depthwise = group_channels == 1 and data[-1] > 1
        return _conv_class(taps, "group_conv" in ops or group_channels < data[-1], depthwise)
    if any(op in ops for op in ("dense", "matmul")):
        return "matmul"
    if "pool" in ops:
        return "pool"
    return OTHER


def onnx_classes(path: Path) -> dict[str, str]:
    """The class of each convolution, matrix product and pooling node of an ONNX file, by node name."""
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            weight = shapes.get(node.input[1]) if len(node.input) > 1 else None
            kernel = attrs.get("kernel_shape") or (weight[2:] if weight else [])
            group = int(attrs.get("group", 1))
            depthwise = group > 1 and weight is not None and weight[1] == 1
            out[node.name] = _conv_class(kernel, group > 1 and not depthwise, depthwise)
        elif node.op_type in ("MatMul", "Gemm"):
            out[node.name] = "matmul"
        elif "Pool" in node.op_type:
            out[node.name] = "pool"
    return out


_OV_CLASSES = {"FullyConnected": "matmul", "MatMul": "matmul", "MaxPool": "pool", "AvgPool": "pool"}


def ov_node_class(node_name: str, node_type: str, onnx_names: Mapping[str, str]) -> str:
    """An OpenVINO node's class: its ONNX node's (OpenVINO names a convolution whose bias it fused
    ``<onnx name>/WithoutBiases``), else by its own type."""
    base = node_name.removesuffix("/WithoutBiases")
    return onnx_names.get(base) or _OV_CLASSES.get(node_type, OTHER)


def ansor_profile(profiler, extraction, repeat: int):
    """``{class: (calls, ms)}`` of one call profile of ``repeat`` inferences of ansor's build
    (``profiler``: a :class:`~ansor.networks.evaluate.CallProfiler` of it); functions that are no task (VM
    builtins, untuned PrimFuncs) are ``other``."""
    profile = profiler.profile(repeat)
    owner = {gv: task_class(t.name) for t in extraction.tasks for gv in t.global_vars}
    out: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for func, ms in profile.ms.items():
        cls = owner.get(func, "pool" if "pool" in func else OTHER)
        out[cls][0] += 0 if func.startswith("vm.builtin") else profile.calls.get(func, 0)
        out[cls][1] += ms
    return out


class OpenVINOProfile:
    """OpenVINO's per-node times of a compiled model, summed per class."""

    def __init__(self, path: Path, threads: int, feed: Mapping[str, np.ndarray]):
        import openvino as ov
        core = ov.Core()
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", {
            "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": True})
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        self.request = self.compiled.create_infer_request()
        self.feed = {port: feed[feed_name(port.get_names(), feed)] for port in self.compiled.inputs}
        self.classes = onnx_classes(path)
        for _ in range(3):
            self.request.infer(self.feed)

    def profile(self, repeat: int):
        out: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
        for _ in range(repeat):
            self.request.infer(self.feed)
            for node in self.request.profiling_info:
                ms = node.real_time.total_seconds() * 1e3
                if ms <= 0:
                    continue  # fused into another node, or not executed
                cls = ov_node_class(node.node_name, node.node_type, self.classes)
                out[cls][0] += 1
                out[cls][1] += ms
        return {cls: [calls // repeat, ms / repeat] for cls, (calls, ms) in out.items()}


def compare(ansor_rounds: list[dict], peer_rounds: list[dict]) -> list[ClassTimes]:
    """Per class, the medians over the rounds; classes by ansor's time, ``other`` last."""
    names = {c for r in ansor_rounds + peer_rounds for c in r}

    def median(rounds: list[dict], cls: str, k: int) -> float:
        return statistics.median(r.get(cls, [0, 0.0])[k] for r in rounds)

    rows = [ClassTimes(c, int(median(ansor_rounds, c, 0)), median(ansor_rounds, c, 1),
                       int(median(peer_rounds, c, 0)), median(peer_rounds, c, 1)) for c in names]
    return sorted(rows, key=lambda r: (r.name == OTHER, -max(r.ansor_ms, r.peer_ms)))


def table(rows: Sequence[ClassTimes], peer: str) -> str:
    total = ClassTimes("all", sum(r.ansor_calls for r in rows), sum(r.ansor_ms for r in rows),
                       sum(r.peer_calls for r in rows), sum(r.peer_ms for r in rows))
    cells = [(r.name, str(r.ansor_calls), f"{r.ansor_ms:.3f}", str(r.peer_calls), f"{r.peer_ms:.3f}",
              f"{r.ansor_ms / r.peer_ms:.2f}" if r.peer_ms > 0 else "-") for r in [*rows, total]]
    return markdown_table(("class", "ansor calls", "ansor ms", f"{peer} nodes", f"{peer} ms", f"ansor / {peer}"),
                          cells, "<>>>>>")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx", type=Path, help="the model's ONNX file")
    parser.add_argument("log", type=Path, help="ansor's tuning log of that model (its best records are built)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="the precision the log was tuned in (default fp32)")
    parser.add_argument("--rounds", type=int, default=5, help="profiles of each side, in turn (default 5)")
    parser.add_argument("--repeat", type=int, default=10, help="inferences per profile (default 10)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in (args.onnx, args.log) if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    if args.rounds < 1 or args.repeat < 1:
        parser.error("--rounds and --repeat must be at least 1")
    absent = [name for name in ("onnx", "openvino") if importlib.util.find_spec(name) is None]
    if absent:  # onnx: the zoo extra; openvino: the bench extra
        print(f"error: {' and '.join(absent)} not installed (pip install -e \".[zoo,bench]\")", file=sys.stderr)
        return 2
    from ..target import host_target
    target = host_target()
    threads = int(target.attrs["num-cores"])
    os.environ["TVM_NUM_THREADS"] = str(threads)  # before the first kernel starts TVM's thread pool
    from ..networks import apply_history_best, build, extract, load_onnx
    from ..task.precision import Precision
    try:
        if args.precision != "fp32":
            from ..sketch.tensor_rules import require_bf16_unit
            require_bf16_unit(target)
        extraction = extract(load_onnx(args.onnx), target, precision=Precision(args.precision))
        executable = build(apply_history_best(extraction.mod, extraction.tasks, str(args.log), target=target), target)
    except AnsorError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    feed = {spec.name: a for spec, a in zip(extraction.network.inputs, extraction.network.random_inputs(0))}
    peer = OpenVINOProfile(args.onnx, threads, feed)
    from ..networks.evaluate import CallProfiler
    profiler = CallProfiler(executable, extraction.network, target=target)
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(ansor_profile(profiler, extraction, args.repeat))
        theirs.append(peer.profile(args.repeat))
    print(f"{args.onnx.name}: ansor {args.precision} ({args.log.name}) against OpenVINO in {peer.precision}, "
          f"{threads} threads, median of {args.rounds} profiles in turn of {args.repeat} inferences each\n")
    print(table(compare(ours, theirs), "OpenVINO"))
    return 0
