"""scripts/tune_network.py, evaluate_networks.py and plot_tuning_curve.py as a user runs them.

Real Ray, real TVM, the tiny-cnn network (7 tasks): one short tuning run shared by several tests, bad input,
--eval-only, and the two log-reading scripts. A run killed with SIGKILL and resumed:
test_tune_network_kill.py (a module of its own, so a second pytest-xdist worker runs it beside this one).
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Slow tier: the scripts run as a user runs them, in subprocesses that tune, kill and resume.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
TINY_TASKS = 7  # tiny-cnn: conv, Winograd conv (input transform, product, output transform), 2 pools, dense
TINY_TRIALS = 2 * TINY_TASKS  # the warm-up measures every task's default (and seeds), the rest is searched


def env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


def run(script: str, *args: str, timeout: int = 300, cwd: Path = ROOT, extra_env: dict | None = None):
    return subprocess.run([sys.executable, str(SCRIPTS / script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**env(), **(extra_env or {})}, cwd=cwd)


def records(log: Path) -> list[tuple[str, str]]:
    """(workload key, steps) of every complete measurement line, in file order (the network-level
    selection's records, ``"net": 1``, are not measurements)."""
    out = []
    for line in log.read_text().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:  # a line torn by SIGKILL
            continue
        if "i" in obj and not obj.get("net"):
            out.append((obj["i"][0][0], json.dumps(obj["i"][1][1])))
    return out


def assert_final_report(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Output check: tuned == default build" in out, out
    assert re.search(r"^Mean inference time \(std dev\): \d+\.\d+ ms \(\d+\.\d+ ms\)$", out, re.M), out
    assert re.search(r"Mean +Median +Max +Min +Std", out), out
    assert re.search(r"^default build( +\d+\.\d+){5}$", out, re.M), out
    assert re.search(r"^tuned( +\d+\.\d+){5}$", out, re.M), out
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One short end-to-end run: 2 trials per round, every task gets its warm-up round, then tasks in turn
    (round-robin: the gradient scheduler's picks follow the measured times, and on a loaded machine they once
    left no heavy task a second state for the network-level selection to compare)."""
    log = tmp_path_factory.mktemp("tuned") / "tiny-cnn-b1.json"
    proc = run("tune_network.py", "--network", "tiny-cnn", "--n-trials", TINY_TRIALS, "--per-round", 2,
               "--strategy", "round-robin", "--log-file", log, "--repeat", 3)
    return log, proc


def test_tiny_network_end_to_end(tuned):
    log, proc = tuned
    assert_final_report(proc)
    assert len(records(log)) == TINY_TRIALS
    assert len({key for key, _ in records(log)}) == TINY_TASKS  # the warm-up round visits every task
    # The live table (stderr) and the final table (stdout) name tasks with shapes, weights, trials, best ms.
    assert "fused_conv2d_add_relu" in proc.stderr and "[1,32,32,3]x[3,3,3,16]" in proc.stdout
    assert re.search(r"^Estimated total latency: \d+\.\d+ ms", proc.stdout, re.M), proc.stdout
    assert f"{TINY_TASKS} of {TINY_TASKS} tasks use tuned schedules" in proc.stdout
    assert re.search(r"^time: \d+ trials a minute: search and cost model [\d.]+ s, builds [\d.]+ s", proc.stderr,
                     re.M), proc.stderr
    # Searched rounds gave some tasks other states: the network-level selection re-timed them and said so.
    assert re.search(r"^network-level selection: \d+ heaviest tasks, their \d+ best states re-timed", proc.stderr,
                     re.M), proc.stderr[-2000:]


def test_each_task_measures_its_default_schedule_first(tuned):
    from ansor.networks import default_state, extract, get_network
    from ansor.log.records import load_records
    from ansor.target import host_target

    log, proc = tuned
    assert proc.returncode == 0, proc.stderr[-3000:]
    first_round: dict[str, list[tuple]] = {}  # a task's first round: at most 2 programs (--per-round 2)
    for record in load_records(log):
        first_round.setdefault(record.workload_key, []).append(record.steps)
    tasks = extract(get_network("tiny-cnn", batch_size=1), host_target()).tasks
    assert len(tasks) == TINY_TASKS
    for t in tasks:  # every task's first round measures its default schedule: tuning never regresses
        # (results are logged as they finish, so the default need not be the first line of its task)
        assert tuple(default_state(t.task).steps) in first_round[t.task.workload_key][:2], t.task.desc


def test_eval_only_applies_the_log_without_measuring(tuned, tmp_path):
    log = tmp_path / "tiny-cnn-b1.json"
    shutil.copy(tuned[0], log)
    before = log.read_bytes()
    proc = run("tune_network.py", "--network", "tiny-cnn", "--eval-only", "--log-file", log, "--repeat", 3)
    assert_final_report(proc)
    assert log.read_bytes() == before  # nothing measured, nothing appended
    assert "round" not in proc.stderr and "tuning:" not in proc.stderr
    assert f"{TINY_TASKS} of {TINY_TASKS} tasks use tuned schedules" in proc.stdout


BAD_INPUT = [
    (["--network", "no-such-net"], "valid names: resnet-50, mobilenet-v2"),
    ([], "--network NAME"),
    (["--onnx", "{tmp}/missing.onnx"], "missing.onnx does not exist"),
    (["--onnx", "{tmp}/garbage.onnx"], "not a valid ONNX model"),
    (["--network", "tiny-cnn", "--n-trials", "0"], "--n-trials must be an integer from 1"),
    (["--network", "tiny-cnn", "--n-trials", "-3"], "--n-trials must be an integer from 1"),
    (["--network", "tiny-cnn", "--batch-size", "0"], "--batch-size must be an integer from 1"),
    (["--network", "tiny-cnn", "--eval-only"], "logs/tiny-cnn-b1.json does not exist"),
    (["--network", "tiny-cnn", "--seed", "-1"], "--seed must be an integer from 0"),
    (["--network", "tiny-cnn", "--no-eval", "--eval-only"], "--no-eval skips the final build, which --eval-only"),
    (["--network", "tiny-cnn", "--no-eval", "--export", "{tmp}/deploy"], "which --export needs"),
]


@pytest.fixture(scope="module")
def bad_input_runs(run_main_per_case, tmp_path_factory):
    """Every case in one process, from a directory of its own (the cases must not create ``logs/``)."""
    cwd = tmp_path_factory.mktemp("bad-input")
    (cwd / "garbage.onnx").write_bytes(b"this is not a protobuf \x00\xff")
    runs = run_main_per_case(SCRIPTS / "tune_network.py", [[a.format(tmp=cwd) for a in args] for args, _ in BAD_INPUT],
                             cwd)
    return runs, cwd


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(case, bad_input_runs):
    args, needle = BAD_INPUT[case]
    runs, cwd = bad_input_runs
    if "--onnx" in args and importlib.util.find_spec("onnx") is None:
        needle = "pip install"
    code, stderr = runs[case]
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], stderr
    assert "Traceback" not in stderr
    assert not (cwd / "logs").exists()


def test_onnx_model_with_a_sequence_input_is_one_line_and_exit_2(tmp_path):
    onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
    from onnx import TensorProto, helper
    # A valid model whose only input is a sequence of tensors (SequenceAt picks one): nothing to tune it with.
    graph = helper.make_graph(
        [helper.make_node("SequenceAt", ["xs", "index"], ["y"])], "sequence_input",
        [helper.make_tensor_sequence_value_info("xs", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[helper.make_tensor("index", TensorProto.INT64, [], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "seq.onnx"))
    proc = run("tune_network.py", "--onnx", tmp_path / "seq.onnx", timeout=120, cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "'xs' is a sequence, not a tensor" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_explains_every_flag():
    out = run("tune_network.py", "--help", timeout=60).stdout
    for flag in ("--network", "--onnx", "--batch-size", "--n-trials", "--target", "--log-file", "--resume",
                 "--ray-address", "--eval-only", "--per-round", "--strategy", "--early-stopping", "--cost-model",
                 "--load-model", "--seed", "--build-memory-gib", "--no-eval"):
        assert flag in out


def test_evaluate_networks_table(tuned, tmp_path):
    proc = run("evaluate_networks.py", tuned[0], "--repeat", 3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert re.match(r"Network +\| Batch \| Baseline \(default build\) \| +ansor \| Speedup", lines[0]), proc.stdout
    row = rf"tiny-cnn +\| +1 \| +\d+\.\d+ ms \| +\d+\.\d+ ms \| +\d+\.\d+x \| {TINY_TASKS}/{TINY_TASKS}"
    assert re.match(row, lines[2]), proc.stdout
    assert "Baseline: default build" in proc.stdout
    # A log whose name does not say which network it is for.
    odd = tmp_path / "mylog.json"
    shutil.copy(tuned[0], odd)
    bad = run("evaluate_networks.py", odd, timeout=120)
    assert bad.returncode == 2 and "--network NAME --batch-size B" in bad.stderr and "Traceback" not in bad.stderr


def _final_estimate(stdout: str) -> float:
    return float(re.search(r"^Estimated total latency: (\d+\.\d+) ms", stdout, re.M).group(1))


def test_plot_data_and_missing_matplotlib(tuned, tmp_path):
    stub = tmp_path / "stub" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    # The stub goes first; the rest of PYTHONPATH stays, so the script imports this checkout's ansor.
    no_mpl = {"PYTHONPATH": os.pathsep.join(p for p in (str(stub.parent), os.environ.get("PYTHONPATH")) if p)}
    proc = run("plot_tuning_curve.py", tuned[0], "--out", tmp_path / "c.png", extra_env=no_mpl, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "pip install matplotlib" in lines[0], proc.stderr
    csv_file = tmp_path / "c.csv"
    proc = run("plot_tuning_curve.py", tuned[0], "--csv", csv_file, extra_env=no_mpl, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = csv_file.read_text().splitlines()
    assert rows[0].startswith("trial,total_ms,") and len(rows) == 1 + TINY_TRIALS
    total = [r.split(",")[1] for r in rows[1:]]
    assert total[0] == "" and total[-1] != ""  # defined once every task has a result
    assert float(total[-1]) == pytest.approx(_final_estimate(tuned[1].stdout), abs=2e-3)
    assert not (tmp_path / "c.png").exists()


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="matplotlib is not installed (optional: pip install matplotlib)")
def test_plot_tuning_curve_png(tuned, tmp_path):
    png = tmp_path / "curve.png"
    proc = run("plot_tuning_curve.py", tuned[0], "--out", png, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{TINY_TRIALS} trials; {TINY_TASKS} of {TINY_TASKS} tasks measured" in proc.stdout


def test_database_and_export(tuned, tmp_path):
    """A database holding the tuned log: a second run measures nothing and exports a build tvm alone runs."""
    log, _ = tuned
    db = tmp_path / "db"
    db.mkdir()
    shutil.copy(log, db / "earlier-run.json")
    out = tmp_path / "deploy"
    proc = run("tune_network.py", "--network", "tiny-cnn", "--n-trials", TINY_TRIALS, "--database", db,
               "--export", out, "--repeat", 1, "--no-pool-probe")
    assert_final_report(proc)
    assert f"{TINY_TASKS} of {TINY_TASKS} tasks already tuned there" in proc.stderr
    assert "tuning: 0 new trials" in proc.stderr
    assert f"{TINY_TASKS} of {TINY_TASKS} tasks use tuned schedules" in proc.stdout
    new_log = db / "tiny-cnn-b1.json"  # this run's log: nothing was measured
    assert not new_log.exists() or records(new_log) == []
    meta = json.loads((out / "model.json").read_text())
    assert meta["entry"] == "forward" and [i["name"] for i in meta["inputs"]] == ["data"]
    assert meta["weights"] == [] and meta["params_file"] is None  # prepared for the CPU: weights are constants
    assert "thread pool" not in proc.stderr and meta["env"] == {}  # --no-pool-probe: no setting named

    import numpy as np
    from ansor.networks import apply_schedules, build, extract, get_network, run as run_network
    ex = extract(get_network("tiny-cnn", 1), meta["target"])
    x = ex.network.random_inputs(seed=3)[0]
    want = run_network(build(apply_schedules(ex.mod, ex.tasks, {}), meta["target"]), ex.network, [x], meta["target"])[0]
    np.save(tmp_path / "x.npy", x)
    snippet = re.search(r"```python\n(.*?)```", (out / "README.md").read_text(), re.S).group(1)
    child = snippet + ("\nimport sys\nassert 'ansor' not in sys.modules\n"
                       f"np.save({str(tmp_path / 'y.npy')!r}, run(np.load({str(tmp_path / 'x.npy')!r}))[0])\n")
    no_ansor = {k: v for k, v in env().items() if k != "PYTHONPATH"}
    loaded = subprocess.run([sys.executable, "-c", child], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**no_ansor, "MODEL_DIR": str(out)})
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-5)


def test_export_command_probes_the_thread_pool(tuned, tmp_path):
    """``ansor export`` of the tuned log: the build is timed under each thread-pool setting in a fresh process
    (one each, to keep the suite short) and model.json names the choice (unbound threads unless another
    setting beats them), as ``ansor tune --export`` does."""
    log, _ = tuned
    out = tmp_path / "deploy"
    proc = subprocess.run([sys.executable, "-m", "ansor", "export", str(log), "--out", str(out),
                           "--pool-probe-processes", "1"], capture_output=True, text=True, timeout=300, env=env(),
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "thread pool (mean of 1 process each): unbound" in proc.stderr, proc.stderr[-2000:]
    meta = json.loads((out / "model.json").read_text())
    assert set(meta["env"]) <= {"TVM_BIND_THREADS", "TVM_THREAD_POOL_SPIN_COUNT"}
    assert f"with {TINY_TASKS} of {TINY_TASKS} tasks tuned" in proc.stderr


#: ``ansor bench --target cuda``'s model run on a log, in a process of its own: timing TVM in the test's
#: process would pin it to TVM's first cores, and later runs from it would see a 1-core host.
GPU_FLOW = """
import argparse, dataclasses, json, sys
from pathlib import Path
from ansor.bench.gpu import bench_gpu_model
from ansor.target import host_target
args = argparse.Namespace(log=sys.argv[1], repeat=2, rounds=2, pause=0.0)
print(json.dumps(dataclasses.asdict(bench_gpu_model("tiny-cnn", args, host_target(), Path(sys.argv[1]).parent))))
"""


def test_the_gpu_benchmark_model_run_on_the_cpu(tuned):
    """``ansor bench --target cuda`` (ansor/bench/gpu.py) up to the device, on this CPU with the tuned log: each
    contender timed every round, PyTorch's rows timed or said missing (tiny-cnn has no PyTorch definition). Its
    refusals: test_bench_gpu.py."""
    from ansor.bench.gpu import DEFAULT, OURS, TORCH_ROWS

    log, _ = tuned
    flow = subprocess.run([sys.executable, "-c", GPU_FLOW, str(log)], capture_output=True, text=True, timeout=300,
                          env={**env(), "TVM_NUM_THREADS": str(os.cpu_count())}, cwd=ROOT)
    assert flow.returncode == 0, flow.stderr[-3000:]
    report = json.loads(flow.stdout.splitlines()[-1])
    assert (report["trials"], report["failed"]) == (TINY_TRIALS, 0) and report["tuning_s"] > 0
    assert report["outputs_agree"].startswith("equal"), report["outputs_agree"]
    assert [len(report["rounds"][name]) for name in (OURS, DEFAULT)] == [2, 2]
    assert all(ms > 0 for times in report["rounds"].values() for ms in times)
    for row in TORCH_ROWS.values():
        assert row not in report["rounds"] and report["missing"][row], report["missing"]
