"""The CPU inference runtimes a user compares ansor with, timed on the same ONNX file, inputs and threads.

ONNX Runtime and OpenVINO come with the ``bench`` extra (``pip install -e ".[bench]"``); a runtime that is not
installed is reported as missing, never faked. Every runtime is timed as ansor's builds are
(:func:`ansor.networks.time_network`): a few warm-up runs, then ``repeat`` repeats of at least
``min_repeat_ms`` each; the statistics are over the repeats.

Every runtime computes in float32, as ansor does, unless a row says otherwise: OpenVINO's CPU plugin defaults to
bfloat16 on CPUs with native bf16 arithmetic (AVX512_BF16 or AMX; on an AMD Zen 5 it ran BERT-base 1.8x faster
than in f32, its outputs 5e-3 of their scale from ONNX Runtime's instead of 1e-6), so it is timed with
``INFERENCE_PRECISION_HINT=f32``, and its default precision is reported as a row of its own where that differs.

A runtime that fails on a model (it refuses an operator, or a bug of its own) is reported as missing with its
one-line error: the benchmark goes on with the others, and a zoo run with the next model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..networks import OutputComparison


@dataclass(frozen=True)
class PeerResult:
    """One runtime's latency (ms) and outputs, or why it could not run."""

    name: str
    mean_ms: float = float("nan")
    median_ms: float = float("nan")
    outputs: Optional[list[np.ndarray]] = None
    missing: str = ""
    precision: str = "f32"  # the arithmetic it ran; only f32 rows are ansor's like-for-like peers

    @property
    def runtime(self) -> str:
        """The runtime and its version alone: ``name`` less the note a default-precision row carries."""
        return self.name.removesuffix(default_precision_note(self.precision))


def default_precision_note(precision: str) -> str:
    """What a runtime's name carries when it ran in its own default ``precision`` rather than f32."""
    return f" ({precision}, its default here)"


def time_calls(run: Callable[[], object], repeat: int = 10, min_repeat_ms: float = 200.0,
               warmup: int = 3) -> tuple[float, float]:
    """(mean, median) milliseconds per call over ``repeat`` repeats of at least ``min_repeat_ms``."""
    for _ in range(warmup):
        run()
    start = time.perf_counter()
    run()
    number = max(1, int(np.ceil(min_repeat_ms / 1e3 / max(time.perf_counter() - start, 1e-6))))
    ms = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            run()
        ms.append((time.perf_counter() - start) / number * 1e3)
    return float(np.mean(ms)), float(np.median(ms))


def onnxruntime_peer(path: str, feed: dict[str, np.ndarray], threads: int, repeat: int) -> PeerResult:
    """ONNX Runtime's CPU provider with all graph optimisations, ``threads`` intra-op threads."""
    try:
        import onnxruntime as ort
    except ImportError:
        return PeerResult("ONNX Runtime", missing="pip install onnxruntime (the bench extra)")
    name = f"ONNX Runtime {ort.__version__}"

    def run() -> PeerResult:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        outputs = session.run(None, feed)
        mean, median = time_calls(lambda: session.run(None, feed), repeat)
        return PeerResult(name, mean, median, list(outputs))

    return _reported(name, run)


def openvino_peer(path: str, feed: dict[str, np.ndarray], threads: int, repeat: int,
                  precision: str = "f32") -> PeerResult:
    """OpenVINO's CPU plugin with the latency hint, ``threads`` inference threads and ``precision`` (``f32``,
    or the plugin's own default for this CPU from :func:`openvino_default_precision`, see the module's
    docstring)."""
    try:
        import openvino as ov
    except ImportError:
        return PeerResult("OpenVINO", missing="pip install openvino (the bench extra)")
    name = f"OpenVINO {ov.__version__.split('-')[0]}"
    if precision != "f32":
        name += default_precision_note(precision)

    def run() -> PeerResult:
        core = ov.Core()
        compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                      "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision})
        request = compiled.create_infer_request()
        by_port = {port: feed[feed_name(port.get_names(), feed)] for port in compiled.inputs}
        result = request.infer(by_port)
        outputs = [np.asarray(result[port]) for port in compiled.outputs]
        mean, median = time_calls(lambda: request.infer(by_port), repeat)
        return PeerResult(name, mean, median, outputs, precision=precision)

    return _reported(name, run, precision)


def feed_name(names: set[str], feed: dict[str, np.ndarray]) -> str:
    """The model input among a port's tensor names. A port has several names when OpenVINO merged the input
    with what it feeds (GPT-2's ``input_ids`` port was also ``/net/Reshape_output_0``), and ``any_name``
    may pick the other one."""
    found = sorted(n for n in names if n in feed)
    if not found:
        raise KeyError(f"no input named {' or '.join(sorted(names))} (the model's inputs: {', '.join(feed)})")
    return found[0]


def _reported(name: str, run: Callable[[], PeerResult], precision: str = "f32") -> PeerResult:
    """``run()``, or the runtime reported as missing with its one-line error when it fails."""
    from ..errors import short_message
    try:
        return run()
    except Exception as err:  # a runtime's own failure, whatever its type: it must not end the benchmark
        return PeerResult(name, missing=f"failed: {short_message(err)}", precision=precision)


def openvino_default_precision() -> Optional[str]:
    """The precision OpenVINO's CPU plugin picks on this CPU by default, or None without OpenVINO."""
    try:
        import openvino as ov
    except ImportError:
        return None
    return ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()


def torch_peer(network: str, batch_size: int, threads: int, repeat: int) -> PeerResult:
    """PyTorch eager on the model definition the ONNX file was exported from (built-in networks only)."""
    from ..networks.torch_baseline import TorchUnavailableError, time_torch, torch_available
    if not torch_available():
        return PeerResult("PyTorch eager", missing="pip install -e '.[torch]'")
    try:
        timing = time_torch(network, batch_size, threads, repeat)
    except TorchUnavailableError as err:
        return PeerResult("PyTorch eager", missing=str(err))
    import torch
    return PeerResult(f"PyTorch {torch.__version__.split('+')[0]} eager", timing.mean_ms, timing.median_ms)


def compare_all(got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                rtol: Optional[float] = None) -> Optional["OutputComparison"]:
    """Every output of two runs compared as :func:`ansor.networks.compare_outputs` compares two builds (the
    largest absolute difference against ``atol + rtol * scale``, its default tolerances unless ``rtol`` is
    given); None when the outputs differ in number or shape."""
    import inspect

    from ..networks import OutputComparison, compare_outputs
    if len(got) != len(want) or any(np.shape(g) != np.shape(w) for g, w in zip(got, want)):
        return None
    error = max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)))) for g, w in zip(got, want))
    scale = max(float(np.max(np.abs(w))) for w in want)
    defaults = inspect.signature(compare_outputs).parameters
    return OutputComparison(error, scale, defaults["rtol"].default if rtol is None else rtol,
                            defaults["atol"].default)


def max_difference(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """Largest absolute difference between two runs' first outputs, relative to the reference's scale."""
    g, w = np.asarray(got[0], np.float64), np.asarray(want[0], np.float64)
    return float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30))
