"""Targets: what users type, what TVM 0.27 accepts, the hardware facts the search needs, and what each kind
of target (CPU, CUDA) means to building, running and exporting programs (:class:`DeviceKind`).

TVM 0.27 only takes JSON-dict targets; users still type ``llvm -mcpu=znver5`` or ``cuda``. We accept
both, plus ``host`` (this machine's CPU as LLVM names it, with its physical core count).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Union

import psutil
import tvm

from .errors import TargetError, short_message
from .host_cpu import host_cpu

TARGET_EXAMPLES = ('host', 'llvm', 'llvm -mcpu=znver5 -num-cores=2', 'cuda -arch=sm_80',
                   '\'{"kind": "llvm", "mcpu": "znver4", "num-cores": 2}\'')


def physical_cores() -> int:
    """Physical cores available to this process (TVM's thread pool should use exactly these)."""
    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    physical = psutil.cpu_count(logical=False) or logical
    return max(1, min(logical, physical))


def host_target() -> tvm.target.Target:
    """LLVM for this machine's CPU with its physical core count and the features its cpuinfo flags add to
    or take from the CPU LLVM names (:mod:`ansor.host_cpu`)."""
    return tvm.target.Target(_host_config({"kind": "llvm"}))


def _host_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with this machine's CPU, its flags' features and its core count where it names none."""
    config = dict(config)
    if "mcpu" not in config:
        config["mcpu"] = tvm.target.codegen.llvm_get_system_cpu()
        if "mattr" not in config and "mtriple" not in config:
            mattr = host_cpu().mattr(config["mcpu"])
            if mattr:
                config["mattr"] = list(mattr)
    config.setdefault("num-cores", physical_cores())
    return config


def parse_target(text: Union[str, dict, tvm.target.Target, None]) -> tvm.target.Target:
    """Parse ``host``, a CLI-style string (``llvm -mcpu=x -num-cores=2``), a JSON dict, or a Target."""
    if text is None or text == "host":
        return host_target()
    if isinstance(text, tvm.target.Target):
        return text
    if isinstance(text, dict):
        config: dict[str, Any] = dict(text)
    else:
        text = text.strip()
        if text.startswith("{"):
            try:
                config = json.loads(text)
            except json.JSONDecodeError as err:
                raise TargetError(f"target {text!r} is not valid JSON ({err.msg}); "
                                  f"examples: {', '.join(TARGET_EXAMPLES)}") from None
        else:
            config = _parse_cli(text)
    kind = config.get("kind")
    if kind == "llvm":
        _check_triple(text, config)
        config = _host_config(config)
        _check_mcpu(text, config)
    if "num-cores" in config:
        cores = config["num-cores"]
        if type(cores) is not int or cores < 1:
            raise TargetError(f"bad target {text!r}: num-cores must be a positive integer, got {cores!r}; "
                              f"examples: {', '.join(TARGET_EXAMPLES)}")
    try:
        return tvm.target.Target(config)
    except Exception as err:  # TVM raises ValueError/RuntimeError with a long trace
        raise TargetError(f"bad target {text!r}: {short_message(err, None)}; "
                          f"examples: {', '.join(TARGET_EXAMPLES)}") from None


def _check_triple(text: Any, config: dict[str, Any]) -> None:
    """An architecture LLVM lacks is an error here: TVM accepts it, then crashes the process (SIGSEGV) when
    asked about that target's CPUs or features (a target read from a log is data from anywhere).

    LLVM decides: a triple is known when its architecture is one of LLVM's target names (``nvptx64``) or
    LLVM makes a ``generic`` CPU for it (``i686``, ``armv7a``, ``arm64``, ``amd64`` are spellings of those).
    """
    triple = config.get("mtriple")
    if triple is None:
        return
    known = sorted(map(str, tvm.target.codegen.llvm_get_targets()))
    if not isinstance(triple, str) or (triple.split("-")[0] not in known
                                       and not tvm.target.codegen.llvm_is_valid_cpu("generic", triple)):
        raise TargetError(f"bad target {text!r}: LLVM does not know the architecture of -mtriple={triple!r}; "
                          f"valid architectures: {', '.join(known)}")


def _check_mcpu(text: Any, config: dict[str, Any]) -> None:
    """LLVM only warns about an unknown CPU (and compiles for a generic one): make it an error."""
    cpu, triple = config["mcpu"], config.get("mtriple") or tvm.target.codegen.llvm_get_system_triple()
    if not isinstance(cpu, str) or not tvm.target.codegen.llvm_is_valid_cpu(cpu, triple):
        valid = tvm.target.codegen.llvm_get_cpu_archlist(tvm.target.Target({"kind": "llvm", "mtriple": triple}))
        raise TargetError(f"bad target {text!r}: LLVM does not know the CPU {cpu!r} for {triple}; "
                          f"valid -mcpu values: {', '.join(sorted(set(map(str, valid))))}")


def _parse_cli(text: str) -> dict[str, Any]:
    try:
        words = shlex.split(text)
    except ValueError as err:  # an unclosed quote
        raise TargetError(f"bad target {text!r}: {err}; examples: {', '.join(TARGET_EXAMPLES)}") from None
    if not words or words[0].startswith("-"):
        raise TargetError(f"bad target {text!r}: it must start with a kind (llvm, cuda); "
                          f"examples: {', '.join(TARGET_EXAMPLES)}")
    config: dict[str, Any] = {"kind": words[0]}
    for word in words[1:]:
        if not word.startswith("-") or "=" not in word:
            raise TargetError(f"bad target option {word!r} in {text!r}: use -key=value; "
                              f"examples: {', '.join(TARGET_EXAMPLES)}")
        key, value = word.lstrip("-").split("=", 1)
        config[key] = value.split(",") if key in _LIST_OPTIONS else int(value) if value.isdigit() else value
    return config


#: Target options TVM takes as lists, typed comma-separated as LLVM's own tools take them (and as
#: :func:`target_label` prints them): ``-mattr=+avx512bf16,+amx-tile``.
_LIST_OPTIONS = ("mattr", "keys", "libs")


def target_to_str(target: tvm.target.Target) -> str:
    """The canonical JSON form used in logs (round-trips through :func:`parse_target`)."""
    return str(target)


def is_gpu(target: tvm.target.Target) -> bool:
    """Whether TVM files ``target`` under its GPU key: ask :func:`device_kind` for what that implies."""
    return "gpu" in target.keys


@dataclass(frozen=True)
class HardwareParams:
    """What the sketch rules and the validity filter need to know about the device."""

    num_cores: int
    vector_unit_bytes: int
    cache_line_bytes: int = 64
    max_shared_memory_per_block: int = 0
    max_local_memory_per_block: int = 0
    max_threads_per_block: int = 0
    max_vthread_extent: int = 0
    warp_size: int = 0

    def to_json(self) -> list[int]:
        return list(asdict(self).values())

    @staticmethod
    def from_json(values: list[int]) -> "HardwareParams":
        return HardwareParams(*values)


#: Static shared memory a CUDA block may use (48 KiB on every architecture since sm_20; more needs the
#: dynamic, opt-in kind, which TVM's static allocations do not use).
CUDA_SHARED_MEMORY_PER_BLOCK = 48 * 1024
#: Streaming multiprocessors by compute capability (the flagship part of each generation), used as the GPU's
#: "core count" when the target does not say.
_CUDA_SM_COUNT = {"sm_60": 56, "sm_70": 80, "sm_75": 40, "sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_90": 132}


def _cuda_params(target: tvm.target.Target) -> HardwareParams:
    """CUDA limits: from the target's attributes where it has them (tags such as ``nvidia/a100`` do), else
    the values every architecture since sm_30 shares. ``max_vthread_extent`` is Ansor's ``warp_size / 4``."""
    attrs = target.attrs
    warp = int(attrs.get("thread_warp_size", 32))
    return HardwareParams(
        num_cores=int(attrs.get("multi_processor_count", _CUDA_SM_COUNT.get(str(attrs.get("arch", "")), 80))),
        vector_unit_bytes=16,
        max_shared_memory_per_block=int(attrs.get("max_shared_memory_per_block", CUDA_SHARED_MEMORY_PER_BLOCK)),
        max_local_memory_per_block=2 ** 31 - 1,  # unbounded, as in Ansor: nvcc spills what does not fit
        max_threads_per_block=int(attrs.get("max_num_threads", 1024)),
        max_vthread_extent=warp // 4,
        warp_size=warp,
    )


#: The first word of an x86 LLVM triple.
X86_ARCHS = ("x86_64", "i386", "i486", "i586", "i686")


def has_x86_feature(target: tvm.target.Target, feature: str) -> bool:
    """Whether LLVM says ``target`` has the x86 ``feature`` (``avx512bf16``, ``amx-tile``); False for another
    kind or architecture. x86 features only mean something on x86, and LLVM 22 under TVM 0.27 crashes the
    process (SIGSEGV) when asked about a triple it does not know (a target from a log is data from anywhere)."""
    triple = str(target.attrs.get("mtriple", ""))
    if str(target.kind.name) != "llvm" or triple and triple.split("-")[0] not in X86_ARCHS:
        return False
    try:
        return bool(tvm.target.codegen.target_has_features(feature, target))
    except Exception:  # an LLVM without the x86 backend does not know the feature names
        return False


def _cpu_params(target: tvm.target.Target) -> HardwareParams:
    """CPU parameters: the target's core count (this machine's if it names none) and its widest vector unit."""
    cores = int(target.attrs["num-cores"]) if "num-cores" in target.attrs else physical_cores()
    vector = next((width for feature, width in (("avx512f", 64), ("avx2", 32), ("avx", 32))
                   if has_x86_feature(target, feature)), 16)
    return HardwareParams(num_cores=cores, vector_unit_bytes=vector)


def _host_device_type(target: tvm.target.Target) -> str:
    """LLVM and C targets run on the host, whatever their kind is called."""
    return "cpu"


def _kind_device_type(target: tvm.target.Target) -> str:
    """A GPU target's kind names its device type (``cuda``, ``rocm``, ``vulkan``)."""
    return str(target.kind.name)


@dataclass(frozen=True)
class DeviceKind:
    """What the layers below and beside the search need to know about a kind of target, in one place.

    One instance per kind (:data:`CPU_DEVICE`, :data:`CUDA_DEVICE`), picked by :func:`device_kind`; code
    that would branch on the target reads a field instead. The search's own per-target object (sketch
    rules, mutators, validity filter) is in :mod:`ansor.sketch.search_space`, keyed by :attr:`name`.
    To add a kind: add an instance here, a case to :func:`device_kind`, and a search space there.
    """

    #: "cpu" or "cuda": the kind's name, and the key of its search space
    name: str
    #: the hardware parameters of a target of this kind (see :func:`hardware_params`)
    hardware: Callable[[tvm.target.Target], HardwareParams]
    #: the TVM device type a target's programs run on (``tvm.device(type, 0)``): "cpu", "cuda", ...
    device_type: Callable[[tvm.target.Target], str]
    #: the Ray resource a runner of this kind holds: "cpu" or "gpu"
    ray_resource: str
    #: the ``ErrorNo`` name of a failed build: the host compiler's or the device code generator's
    compile_error: str
    #: programs run on TVM's CPU thread pool, so TVM_NUM_THREADS must match the target's cores
    thread_pool: bool
    #: a timed run first flushes the host caches of every argument but the first (cold weights)
    flush_caches: bool
    #: the kernels are in a device module the host library imports (launched with grid and block sizes);
    #: a library without one is plain LLVM object code that links with gcc, without libstdc++
    device_module: bool
    #: (index key, file suffix, ``inspect_source`` format) of each kernel source ``export-kernels`` writes
    kernel_files: tuple[tuple[str, str, str], ...]
    #: the reference output of a correctness check is computed on the host CPU, not by the code
    #: generator under test
    host_reference: bool
    #: networks get the CPU rewrites of :mod:`ansor.networks.prepare` (layout, Winograd, fast math)
    prepare_network: bool
    #: what schedules a PrimFunc no record covers: "ansor" (:mod:`ansor.networks.default_schedule`) or
    #: "dlight" (TVM's GPU default schedules)
    default_schedule: str
    #: the module of TVM's Relax pipeline whose passes lower a scheduled network
    relax_pipeline: str
    #: PyTorch eager, which runs on the CPU here, is a baseline for this kind
    torch_baseline: bool
    #: a target given without ``arch`` takes the arch of a GPU of the Ray cluster
    detect_arch: bool
    #: a kernel call returns when the kernel is done, so the VM's per-call probe times it (the
    #: network-level selection ranks candidates by it); a GPU launch returns at once
    profile_calls: bool
    #: a built network captures its kernel launches once and replays them as one CUDA graph (Relax's
    #: ``RewriteCUDAGraph``): at batch 1 a GPU network is launch-bound otherwise
    graph_launch: bool
    #: the name of the pretrained cost model and schedule database shipped for this kind
    #: (``ansor/data/<name>.*``); empty: none is shipped, tuning starts cold
    pretrained: str

    def device(self, target: tvm.target.Target) -> tvm.runtime.Device:
        """The device ``target``'s programs run on (the first of its type)."""
        return tvm.device(self.device_type(target), 0)


CPU_DEVICE = DeviceKind(
    name="cpu", hardware=_cpu_params, device_type=_host_device_type, ray_resource="cpu",
    compile_error="COMPILE_HOST", thread_pool=True, flush_caches=True, device_module=False,
    kernel_files=(("llvm_ir", "ll", "ll"), ("asm", "s", "asm")), host_reference=False, prepare_network=True,
    default_schedule="ansor", relax_pipeline="tvm.relax.backend.cpu_generic.pipeline", torch_baseline=True,
    detect_arch=False, profile_calls=True, graph_launch=False, pretrained="cpu",
)
CUDA_DEVICE = DeviceKind(
    name="cuda", hardware=_cuda_params, device_type=_kind_device_type, ray_resource="gpu",
    compile_error="COMPILE_DEVICE", thread_pool=False, flush_caches=False, device_module=True,
    kernel_files=(("cuda", "cu", "cuda"),), host_reference=True, prepare_network=False,
    default_schedule="dlight", relax_pipeline="tvm.relax.backend.cuda.pipeline", torch_baseline=False,
    detect_arch=True, profile_calls=False, graph_launch=True, pretrained="",
)


def device_kind(target: tvm.target.Target) -> DeviceKind:
    """The kind of ``target``: every target under TVM's GPU key is compiled and searched as CUDA."""
    return CUDA_DEVICE if is_gpu(target) else CPU_DEVICE


#: Where the package's pretrained files are (``scripts/train_pretrained.py`` writes them).
DATA_DIR = Path(__file__).parent / "data"


def shipped_file(target: tvm.target.Target, suffix: str) -> Optional[Path]:
    """The shipped pretrained file ``<kind>.<suffix>`` for ``target``'s kind, or ``None`` if there is none."""
    name = device_kind(target).pretrained
    path = DATA_DIR / f"{name}.{suffix}"
    return path if name and path.is_file() else None


def hardware_params(target: tvm.target.Target, overrides: Optional[dict[str, int]] = None) -> HardwareParams:
    """Hardware parameters of ``target``: from its attributes, the LLVM CPU features, or CUDA defaults."""
    params = device_kind(target).hardware(target)
    if overrides:
        params = HardwareParams(**{**asdict(params), **overrides})
    return params


def target_label(target) -> str:
    """``llvm -mcpu=... -mattr=... -num-cores=N``: the short form of a CPU target for a first line."""
    attrs = target.attrs
    words = [str(target.kind.name)]
    for key in ("mcpu", "mtriple", "num-cores"):
        if key in attrs:
            words.append(f"-{key}={attrs[key]}")
    if "mattr" in attrs and len(attrs["mattr"]):
        words.append("-mattr=" + ",".join(map(str, attrs["mattr"])))
    return " ".join(words)
