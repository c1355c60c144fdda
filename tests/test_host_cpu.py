"""The host target from the CPU's flags, not only from the name LLVM gives its model.

``tests/data/cpuinfo/`` holds the head of ``/proc/cpuinfo`` of a 2-core AMD EPYC Zen 3 (recorded on a
development machine) and of a 4th-generation Xeon with AMX (its flags as Linux prints them for that part),
for which LLVM 22 named the host ``rocketlake``: a CPU without AVX512_BF16 or AMX.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tvm

from ansor.host_cpu import FLAG_FEATURES, MachineFacts, MatrixUnit, cache_sizes, host_cpu, parse_cpuinfo
from ansor.target import host_target, parse_target, target_label

DATA = Path(__file__).parent / "data" / "cpuinfo"


def recorded(name: str):
    return parse_cpuinfo((DATA / name).read_text())


def has(target: tvm.target.Target, feature: str) -> bool:
    return bool(tvm.target.codegen.target_has_features(feature, target))


def test_a_xeon_named_rocketlake_gets_its_matrix_units_from_the_flags():
    xeon = recorded("xeon-amx.txt")
    assert xeon.model.startswith("Intel(R) Xeon(R)")
    assert xeon.matrix_units == (MatrixUnit.AVX512_BF16, MatrixUnit.AMX)
    mattr = xeon.mattr("rocketlake")
    assert {"+avx512bf16", "+amx-tile", "+amx-bf16", "+amx-int8", "+avx512fp16"} <= set(mattr)
    assert not any(m.startswith("-") for m in mattr)  # rocketlake has nothing this Xeon lacks
    target = tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake", "mattr": mattr, "num-cores": 2})
    assert all(has(target, f) for f in ("avx512bf16", "amx-tile", "amx-bf16", "avx512f"))
    assert "AVX512_BF16, AMX" in xeon.describe()


def test_the_target_a_first_line_prints_can_be_typed_back():
    """``ansor`` names its target as ``llvm -mcpu=rocketlake -mattr=+avx512bf16,+amx-tile,...``; a user who
    passes that to --target gets the same target, its features a list as TVM takes them."""
    xeon = tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake", "num-cores": 2,
                              "mattr": list(recorded("xeon-amx.txt").mattr("rocketlake"))})
    label = target_label(xeon)
    assert "-mattr=+" in label and str(parse_target(label)) == str(xeon)
    typed = parse_target("llvm -mcpu=skylake-avx512 -mattr=+avx512bf16,+amx-tile")
    assert has(typed, "avx512bf16") and has(typed, "amx-tile")


def test_flags_and_llvm_agree_on_zen3_so_its_target_is_unchanged():
    zen3 = recorded("zen3-epyc.txt")
    assert zen3.mattr("znver3") == () and zen3.matrix_units == ()
    assert "none" in zen3.describe()


def test_a_unit_the_hypervisor_hides_is_taken_away():
    """A VM that reports a Zen 4 model but hides AVX-512: code for znver4 would die of SIGILL."""
    zen3_flags = recorded("zen3-epyc.txt")
    mattr = zen3_flags.mattr("znver4")
    assert "-avx512f" in mattr and "-avx512bf16" in mattr
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "mattr": mattr})
    assert not has(target, "avx512f") and not has(target, "avx512bf16") and has(target, "avx2")


def test_the_host_target_has_exactly_the_units_this_machines_flags_report():
    cpu = host_cpu()
    if not cpu.flags:
        pytest.skip("no /proc/cpuinfo on this machine")
    for target in (host_target(), parse_target("host"), parse_target("llvm")):
        for flag, feature in FLAG_FEATURES.items():
            assert has(target, feature) == (flag in cpu.flags), (flag, str(target))


def test_an_explicit_cpu_is_taken_as_given():
    target = parse_target("llvm -mcpu=znver4 -num-cores=2")
    assert "mattr" not in target.attrs and has(target, "avx512bf16")


def test_no_cpuinfo_changes_nothing():
    empty = parse_cpuinfo("")
    assert empty.mattr("znver4") == () and empty.matrix_units == ()


def _unrunnable_cpu() -> str:
    """An LLVM CPU whose code this machine cannot run (a unit its flags lack), or '' if it has them all."""
    flags = host_cpu().flags
    for mcpu, flag in (("skylake-avx512", "avx512f"), ("cooperlake", "avx512_bf16"), ("sapphirerapids", "amx_tile")):
        if flag not in flags:
            return mcpu
    return ""


def test_tuning_for_units_this_cpu_lacks_is_one_error_line():
    """Measured here, such code dies of SIGILL in every worker: it is refused before Ray starts."""
    mcpu = _unrunnable_cpu()
    if not host_cpu().flags or not mcpu:
        pytest.skip("this machine has every unit the check knows, or no cpuinfo")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "ansor", "tune-op", "--wkl", "matmul-64", "--n-trials", "1",
                           "--target", f"llvm -mcpu={mcpu}"], capture_output=True, text=True, timeout=120, env=env)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "which this CPU" in errors[0] and "lacks" in errors[0] and "Traceback" not in proc.stderr
    assert any(flag in errors[0] for flag in host_cpu().missing(parse_target(f"llvm -mcpu={mcpu}")))


@pytest.mark.slow
def test_commands_name_the_host_matrix_units_first(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = tmp_path / "empty.json"  # --eval-only: the tuning command's start, no Ray, no search
    log.write_text("")
    proc = subprocess.Popen([sys.executable, "-m", "ansor", "tune", "--network", "tiny-cnn", "--eval-only",
                             "--log-file", str(log), "--repeat", "1"], stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path, stdout=subprocess.DEVNULL)
    try:
        first = proc.stderr.readline().strip()  # the rest (the network's builds and timing) is not waited for
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert first.startswith("target: llvm -mcpu=") and "matrix units:" in first
    assert all(unit.name in first for unit in host_cpu().matrix_units)


def test_machine_facts_read_the_caches_from_sysfs(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                                             (3, "Unified", "105M")]):
        index = tmp_path / f"index{i}"
        index.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (index / name).write_text(f"{value}\n")
    assert cache_sizes(str(tmp_path)) == (48, 2048, 105 * 1024)
    assert cache_sizes(str(tmp_path / "none")) == (0, 0, 0)
    def isa(name):
        return tuple(f for f in FLAG_FEATURES if f in recorded(name).flags)

    zen3 = MachineFacts("AMD EPYC", isa("zen3-epyc.txt"), 2, (32, 512, 32768))
    assert zen3.vector_bytes == 32 and zen3.isa == ("fma", "avx2")
    xeon = MachineFacts("Xeon", isa("xeon-amx.txt"), 2, (48, 2048, 0))
    assert xeon.vector_bytes == 64 and "amx_tile" in xeon.isa
