"""parse_target on triples: what LLVM knows is accepted (with a CPU of that architecture), the rest refused."""

import pytest

from ansor.errors import TargetError
from ansor.log.measurement import ErrorNo
from ansor.target import CPU_DEVICE, CUDA_DEVICE, device_kind, hardware_params, parse_target


@pytest.mark.parametrize("triple, cpu", [
    ("x86_64-linux-gnu", "znver3"), ("i686-pc-linux-gnu", "pentium4"), ("armv7a-linux-gnueabihf", "cortex-a9"),
    ("aarch64-linux-gnu", "cortex-a72"), ("arm64-apple-darwin", "apple-m1"),
])
def test_triples_llvm_knows_are_accepted(triple, cpu):
    target = parse_target(f"llvm -mtriple={triple} -mcpu={cpu} -num-cores=2")
    assert str(target.attrs["mtriple"]) == triple
    assert hardware_params(target).num_cores == 2


@pytest.mark.parametrize("triple", ["no-such-triple", "nosuch-linux-gnu", "riscv64gc-unknown-linux-gnu"])
def test_triples_llvm_lacks_are_refused_by_name(triple):
    with pytest.raises(TargetError, match=f"LLVM does not know the architecture of -mtriple='{triple}'"):
        parse_target(f"llvm -mtriple={triple} -mcpu=generic -num-cores=2")


def test_each_target_kind_is_one_device_kind():
    """The layers under and beside the search read a target's facts from its DeviceKind, never branch on it."""
    cpu, cuda = parse_target("llvm -num-cores=2"), parse_target("cuda -arch=sm_80")
    assert device_kind(cpu) is CPU_DEVICE and device_kind(cuda) is CUDA_DEVICE
    assert (CPU_DEVICE.ray_resource, CUDA_DEVICE.ray_resource) == ("cpu", "gpu")
    assert (ErrorNo[CPU_DEVICE.compile_error], ErrorNo[CUDA_DEVICE.compile_error]) == (ErrorNo.COMPILE_HOST,
                                                                                       ErrorNo.COMPILE_DEVICE)
    assert CPU_DEVICE.device(cpu).dlpack_device_type() != CUDA_DEVICE.device(cuda).dlpack_device_type()
    assert hardware_params(cuda).warp_size == 32 and hardware_params(cpu).num_cores == 2
