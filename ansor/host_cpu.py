"""This machine's CPU as cpuid reports it (Linux's ``/proc/cpuinfo`` flags), and what that changes in the
host target: the LLVM features the flags add to, or take from, the CPU LLVM names.

LLVM names the host by its model number, so a CPU newer than its table gets an older name without the
newest units: a 2-core Xeon with AMX (model 167 under KVM) was ``rocketlake``, a CPU with neither
AVX512_BF16 nor AMX. A hypervisor may also hide a unit the model has. The flags are the truth: the host
target's ``mattr`` adds what they have and the named CPU lacks, and removes what it has and they lack.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import tvm

from .errors import AnsorError

#: cpuinfo flag -> LLVM feature, for the vector and matrix units the code generator and the search use.
FLAG_FEATURES: dict[str, str] = {
    "fma": "fma", "avx2": "avx2", "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512dq": "avx512dq",
    "avx512vl": "avx512vl", "avx512_vnni": "avx512vnni", "avx_vnni": "avxvnni", "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16", "amx_tile": "amx-tile", "amx_bf16": "amx-bf16", "amx_int8": "amx-int8",
}


class MatrixUnit(enum.Enum):
    """A unit that multiplies bf16 pairs into fp32 sums, and the cpuinfo flags it needs."""

    AVX512_BF16 = ("avx512_bf16",)  # vdpbf16ps: 16 fp32 lanes, each the dot of two bf16 pairs
    AMX = ("amx_tile", "amx_bf16")  # tdpbf16ps: 16x16 fp32 tiles from 16x32 bf16 tiles


@dataclass(frozen=True)
class CpuInfo:
    """What ``/proc/cpuinfo`` says of the first CPU: its model name and its flags."""

    model: str
    flags: frozenset[str]

    @property
    def matrix_units(self) -> tuple[MatrixUnit, ...]:
        return tuple(unit for unit in MatrixUnit if set(unit.value) <= self.flags)

    @property
    def units(self) -> str:
        """The flags of :data:`FLAG_FEATURES` this CPU has, for an error that says what it has."""
        return ", ".join(flag for flag in FLAG_FEATURES if flag in self.flags) or "none of the vector units"

    @lru_cache(maxsize=None)
    def mattr(self, mcpu: str, triple: Optional[str] = None) -> tuple[str, ...]:
        """``+f``/``-f`` for each feature of :data:`FLAG_FEATURES` where the flags and LLVM's ``mcpu``
        disagree (empty when they agree, so such a target is the plain ``mcpu`` one). Cached: it asks LLVM
        about 13 features (~2 ms), and every ``host`` target parsed needs it."""
        if not self.flags:  # no cpuinfo (another OS): LLVM's name is all we know
            return ()
        probe = {"kind": "llvm", "mcpu": mcpu, **({"mtriple": triple} if triple else {})}
        named = tvm.target.Target(probe)
        out = []
        for flag, feature in FLAG_FEATURES.items():
            has = flag in self.flags
            if has != bool(tvm.target.codegen.target_has_features(feature, named)):
                out.append(("+" if has else "-") + feature)
        return tuple(out)

    def missing(self, target: tvm.target.Target) -> list[str]:
        """The cpuinfo flags of the units ``target``'s code may use and this CPU lacks (its first such
        instruction kills the process with SIGILL); empty where there is no cpuinfo."""
        if not self.flags:
            return []
        return [flag for flag, feature in FLAG_FEATURES.items()
                if flag not in self.flags and tvm.target.codegen.target_has_features(feature, target)]

    def describe(self) -> str:
        """One line for a command's first output: the CPU and the matrix units found."""
        units = ", ".join(u.name for u in self.matrix_units) or "none (fp32 FMA only)"
        return f"{self.model or 'unknown CPU'}; matrix units: {units}"


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor's model name and flags in the text of ``/proc/cpuinfo``."""
    model, flags = "", ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = value
        if model and flags:
            break
    return CpuInfo(model, frozenset(flags.split()))


@lru_cache(maxsize=None)
def host_cpu(path: str = "/proc/cpuinfo") -> CpuInfo:
    """This machine's :class:`CpuInfo` (empty flags where there is no cpuinfo)."""
    try:
        return parse_cpuinfo(Path(path).read_text(errors="replace"))
    except OSError:
        return CpuInfo("", frozenset())


#: Longest CPU model name a log's machine facts keep (cpuinfo's are under 64 characters).
MAX_MODEL_CHARS = 128


@dataclass(frozen=True)
class MachineFacts:
    """The machine a log's programs were measured on, as each workload line of the log keeps it: what a
    program's speed depends on beyond its target (the model name, the units, the cores, the caches), so a
    record measured elsewhere can be weighed as a seed rather than taken as a verdict."""

    cpu: str  # cpuinfo's model name
    isa: tuple[str, ...]  # the flags of FLAG_FEATURES the CPU has, in that table's order
    cores: int  # physical cores the measuring process could use
    caches_kib: tuple[int, int, int]  # L1 data, L2, L3 of one core (0: unknown)

    def to_json(self) -> dict[str, Any]:
        return {"cpu": self.cpu, "isa": list(self.isa), "cores": self.cores, "caches_kib": list(self.caches_kib)}

    @staticmethod
    def from_json(obj: Any) -> Optional["MachineFacts"]:
        """The facts of a log's ``machine`` field; ``None`` for anything else (a field from a later version
        or a damaged one never stops a record from loading, it only loses its facts)."""
        try:
            isa = tuple(str(f) for f in obj["isa"] if f in FLAG_FEATURES)
            caches: Any = tuple(int(c) for c in obj["caches_kib"])
            facts = MachineFacts(str(obj["cpu"])[:MAX_MODEL_CHARS], isa, int(obj["cores"]), caches)
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        ok = len(caches) == 3 and all(0 <= c < 2 ** 31 for c in caches) and 0 < facts.cores < 2 ** 16
        return facts if ok else None

    @property
    def vector_bytes(self) -> int:
        return 64 if "avx512f" in self.isa else 32 if "avx2" in self.isa else 16


def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> tuple[int, int, int]:
    """The L1 data, L2 and L3 cache sizes of the first CPU in KiB, from Linux's sysfs (0 where unknown)."""
    sizes = {1: 0, 2: 0, 3: 0}
    for index in sorted(Path(root).glob("index[0-9]*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip().upper()
            kib = int(size[:-1]) * (1024 if size.endswith("M") else 1) if size[-1] in "KM" else int(size) // 1024
        except (OSError, ValueError, IndexError):
            continue
        if level in sizes and kind in ("Data", "Unified"):
            sizes[level] = kib
    return sizes[1], sizes[2], sizes[3]


@lru_cache(maxsize=None)
def host_machine(cores: int) -> MachineFacts:
    """This machine's facts, for a log of programs measured here on ``cores`` cores."""
    cpu = host_cpu()
    return MachineFacts(cpu.model[:MAX_MODEL_CHARS], tuple(f for f in FLAG_FEATURES if f in cpu.flags), cores,
                        cache_sizes())


#: Linux's x86-64 ``arch_prctl`` syscall, its "request permission for an xstate component" code, and the
#: component of AMX's tile data (``arch/x86/include/uapi/asm/prctl.h``).
SYS_ARCH_PRCTL = 158
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


class AmxError(AnsorError):
    """Linux refused this process the AMX tile state: its first tile instruction would kill it."""


@lru_cache(maxsize=None)
def request_amx() -> None:
    """Ask Linux for the AMX tile state, which a process must hold before its first tile instruction
    (without it the instruction raises SIGILL); idempotent. Raises :class:`AmxError` with the reason."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise AmxError(f"AMX needs Linux on x86-64; this is {platform.system()} on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
        err = ctypes.get_errno()
        units = host_cpu().matrix_units
        raise AmxError(f"Linux refused the AMX tile state (arch_prctl: {os.strerror(err)}); this CPU's matrix "
                       f"units: {', '.join(u.name for u in units) or 'none'}")


def allow_amx() -> bool:
    """On a CPU with AMX, ask Linux for the tile state (:func:`request_amx`), so that programs this process
    runs may use the tiles; returns whether it did. Raises :class:`AmxError` if Linux refuses."""
    if MatrixUnit.AMX not in host_cpu().matrix_units:
        return False
    request_amx()
    return True


def allow_amx_or_warn(consequence: str) -> None:
    """:func:`allow_amx` for a process that runs code it did not choose (a runner, a network build): a
    refusal is a warning that says ``consequence``, not an error; only code that uses the tiles fails."""
    try:
        allow_amx()
    except AmxError as err:
        logging.getLogger("ansor").warning("%s: %s", err, consequence)
