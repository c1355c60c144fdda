"""``ansor bench --target cuda`` (ansor/bench/gpu.py) without a GPU: its refusals are one ``error:`` line and exit
status 2 (a machine without a GPU, the CPU benchmarks' flags). Its model run, on this CPU with a real tuning
log: test_tune_network.py, which has one."""

from pathlib import Path

import pytest
import tvm

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "bench" / "bench_network.py"  # = ansor bench

NO_GPU = ("error: --target cuda times the tuned network on this machine's GPU, and TVM finds no CUDA device "
          "here; run it on the GPU machine")
CASES = [
    (["--zoo"], "--zoo is for CPU benchmarks"),
    (["--metaschedule"], "--metaschedule is for CPU benchmarks"),
    (["--precision", "bf16"], "float32 only"),
    (["--models", "tiny-cnn"], "no PyTorch definition of tiny-cnn (choose from resnet-50"),
    (["--models", "resnet-50", "bert", "--log", __file__], "--log evaluates one model"),
]


@pytest.fixture(scope="module")
def refusals(run_main_per_case, tmp_path_factory):
    """Every case, the machine without a GPU last, in one process."""
    cases = [["--target", "cuda", *flags] for flags, _ in CASES]
    cases.append(["--target", "cuda", "--models", "resnet-50", "--minutes", "1"])
    return run_main_per_case(BENCH, cases, tmp_path_factory.mktemp("bench-gpu"))


@pytest.mark.parametrize("case", range(len(CASES)), ids=[" ".join(flags) for flags, _ in CASES])
def test_flags_it_cannot_honour_are_one_error_line(refusals, case):
    code, stderr = refusals[case]
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and CASES[case][1] in lines[0], stderr


@pytest.mark.skipif(tvm.cuda(0).exist, reason="this machine has a GPU: the benchmark would run")
def test_without_a_gpu_it_is_one_error_line(refusals):
    code, stderr = refusals[-1]
    assert code == 2 and stderr.strip().splitlines() == [NO_GPU], stderr
