"""parse_target on triples: what LLVM knows is accepted (with a CPU of that architecture), the rest refused."""

import pytest

from ansor.errors import TargetError
from ansor.target import hardware_params, parse_target


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
