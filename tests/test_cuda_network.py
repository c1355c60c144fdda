"""A network tuned for CUDA on a machine without a GPU, up to the measurement: nothing built for the CPU
reaches a CUDA task.

On a real H200, every failed record of a ResNet-50 run was a CPU program on a CUDA task (the CPU default
schedule of its warm-up round: ``parallel``, ``vectorize``, a packed weight, no thread bound), and each
one killed a Ray worker. TVM's CUDA code generator needs no GPU, so every candidate here is really built;
only the run, which needs the GPU, is answered by the test's measurer.
"""

from __future__ import annotations

import pytest
import tvm

from ansor.cost_model import RandomModel
from ansor.log.measurement import MAX_COST, ErrorNo, MeasureInput, MeasureResult
from ansor.measure.builder import build_program
from ansor.networks import default_candidates, default_state, extract, get_network
from ansor.networks.evaluate import build
from ansor.networks.schedules import apply_schedules
from ansor.relax.tune import first_candidates
from ansor.sketch.gpu_verify import host_code, verify_gpu
from ansor.task.search_task import SearchTask
from ansor.task_scheduler import schedule_tasks

pytestmark = pytest.mark.skipif(tvm.get_global_func("target.build.cuda", allow_missing=True) is None,
                                reason="this TVM build has no CUDA code generator")

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host={"kind": "llvm"})


class BuildOnlyMeasurer:
    """Builds every candidate for the CUDA target, as the measurer's build phase does; the run phase needs
    a GPU, so each built candidate's result says there is none (an error: nothing is learned as a time)."""

    def __init__(self) -> None:
        self.sent: list[MeasureInput] = []
        self.builds: list[tuple[int, str]] = []

    def measure(self, inputs):
        results = []
        for inp in inputs:
            self.sent.append(inp)
            build = build_program(inp.task, inp.state.key())  # refuses a build without a CUDA kernel
            self.builds.append((build.error_no, build.error_msg))
            results.append(MeasureResult((MAX_COST,), int(ErrorNo.RUNTIME_DEVICE), "no GPU on this machine"))
        return results


@pytest.fixture(scope="module")
def cuda_tasks():
    return extract(get_network("tiny-cnn", 1), CUDA).tasks


def test_a_cuda_task_gets_no_cpu_default_schedule(cuda_tasks):
    task = cuda_tasks[0].task
    assert default_candidates(task) == [] and first_candidates(task, pretrained=True) == []
    cpu_task = SearchTask(task.func, {"kind": "llvm", "num-cores": 2})
    assert len(default_candidates(cpu_task)) == 1  # the CPU keeps its default schedule as first candidate


def test_gpu_verification_refuses_cpu_programs(cuda_tasks):
    """TVM's own verifier passes a program that binds no thread; ours names what makes it a CPU program."""
    task = cuda_tasks[0].task
    cpu_program = default_state(task)  # what used to be a CUDA task's warm-up
    reason = verify_gpu(task, cpu_program)
    assert reason is not None and "parallel" in reason
    unbound = task.compute_dag.init_state()
    assert "binds no loop to a GPU" in host_code(unbound)


def test_the_builder_refuses_a_cuda_program_without_a_kernel(cuda_tasks):
    """The last check before a GPU: a CUDA build with no kernel is a compile error, never a launch."""
    task = cuda_tasks[0].task
    result = build_program(task, default_state(task).key())
    assert result.error_no == ErrorNo.COMPILE_DEVICE and "no kernel" in result.error_msg and result.lib is None


@pytest.mark.slow
def test_network_tuning_sends_only_verified_gpu_programs(cuda_tasks):
    tasks = [t.task for t in cuda_tasks]
    measurer = BuildOnlyMeasurer()
    schedule_tasks(tasks, [t.weight for t in cuda_tasks], 3 * len(tasks), measurer, RandomModel(seed=0),
                   per_round=3, seed=0, first=[first_candidates(t, pretrained=True) for t in tasks])
    assert len(measurer.sent) >= 2 * len(tasks)
    assert {inp.task.workload_key for inp in measurer.sent} == {t.workload_key for t in tasks}
    for inp, (error_no, message) in zip(measurer.sent, measurer.builds):
        assert verify_gpu(inp.task, inp.state) is None, inp.task.desc
        assert error_no == ErrorNo.NO_ERROR, (inp.task.desc, message)


def test_a_cuda_network_is_built_to_launch_as_one_cuda_graph():
    """At batch 1 a GPU network is launch-bound: the built network captures its kernel launches once and
    replays them as a CUDA graph (built here without a GPU; the VM code calls the capture builtin). A CPU
    build of the same network has no such call."""
    extraction = extract(get_network("tiny-cnn", 1), CUDA)
    default = apply_schedules(extraction.mod, extraction.tasks, {}, target=CUDA)
    assert "cuda_graph" in build(default, CUDA).as_text()
    cpu_target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    cpu = extract(get_network("tiny-cnn", 1), cpu_target)
    assert "cuda_graph" not in build(apply_schedules(cpu.mod, cpu.tasks, {}, target=cpu_target), cpu_target).as_text()


class NoGpuMeasurer:
    """Every candidate's run fails as it does where no GPU is (nothing is built: the message is the point)."""

    def measure(self, inputs):
        return [MeasureResult((MAX_COST,), int(ErrorNo.RUNTIME_DEVICE), "no GPU on this machine") for _ in inputs]


def test_the_first_failure_of_each_kind_is_logged_with_its_message(cuda_tasks, caplog):
    """A record keeps only the error code: a run whose every candidate fails says why while it runs, once."""
    task = cuda_tasks[0].task
    with caplog.at_level("WARNING", logger="ansor"):
        schedule_tasks([task], [1], 4, NoGpuMeasurer(), RandomModel(seed=0), per_round=2, seed=0, first=[[]])
    firsts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("first ")]
    assert firsts == [f"first RUNTIME_DEVICE failure (task {task.desc}): no GPU on this machine"]
