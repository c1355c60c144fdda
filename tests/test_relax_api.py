"""ansor.relax on modules that are not built-in networks: extract, tune, compile, export, database reuse.

One local Ray for the module; real tuning with a handful of trials; the exported model is loaded and run
in a fresh Python process that never imports ansor.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import ansor
from ansor.networks import NetworkError
from ansor.log.records import load_records

TARGET = {"kind": "llvm", "num-cores": 2}
FAST = ansor.TuningOptions(num_measures_per_round=2, cost_model="random")


@tvm.script.ir_module
class ModelA:
    @R.function
    def main(x: R.Tensor((1, 8, 8, 4), "float32"), w: R.Tensor((3, 3, 4, 8), "float32"),
             fc: R.Tensor((512, 16), "float32"), b: R.Tensor((16,), "float32")):
        with R.dataflow():
            c = R.nn.relu(R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO"))
            f = R.reshape(c, (1, 512))
            y = R.nn.relu(R.add(R.matmul(f, fc), b))
            R.output(y)
        return y


@tvm.script.ir_module
class ModelB:  # the same convolution as ModelA, another dense layer
    @R.function
    def main(x: R.Tensor((1, 8, 8, 4), "float32"), w: R.Tensor((3, 3, 4, 8), "float32"),
             fc: R.Tensor((512, 10), "float32")):
        with R.dataflow():
            c = R.nn.relu(R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO"))
            y = R.matmul(R.reshape(c, (1, 512)), fc)
            R.output(y)
        return y


def params_of(mod, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for var in mod["main"].params[1:]:
        shape = [int(d) for d in var.ty.shape.values]
        out[var.name] = (rng.standard_normal(shape) * 0.1).astype("float32")
    return out


def untuned(mod, params, x) -> np.ndarray:
    """TVM's own build of the module (default pipeline, no schedules) on ``x``."""
    exe = tvm.compile(relax.transform.BindParams("main", params)(mod), target=ansor.target.parse_target(TARGET))
    return relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def keys_in(log: Path) -> list[str]:
    return [r.workload_key for r in load_records(log)]


@pytest.fixture(scope="module")
def tuned_a(local_ray, tmp_path_factory):
    """ModelA tuned with 4 trials (each task's default schedule, then searched rounds) into a database directory."""
    db = ansor.Database(tmp_path_factory.mktemp("db"))
    params = params_of(ModelA)
    result = ansor.relax.tune_relax(ModelA, params, TARGET, db.log_path("model-a"), trials=4, options=FAST,
                                    database=db)
    return db, params, result


def test_extract_tasks_of_a_hand_written_module():
    tasks = ansor.relax.extract_tasks(ModelA, params_of(ModelA), TARGET)
    assert sorted(t.name for t in tasks) == ["fused_conv2d_relu [1,8,8,4]x[3,3,4,8]",
                                             "fused_matmul_add_relu [1,512]x[512,16]"]
    assert all(t.weight == 1 for t in tasks)
    # Without params the weights stay inputs: same tasks, more inputs.
    net = ansor.relax.as_network(ModelA, None)
    assert [s.name for s in net.inputs] == ["x", "w", "fc", "b"]
    assert [s.name for s in ansor.relax.as_network(ModelA, params_of(ModelA)).inputs] == ["x"]


@pytest.mark.slow
def test_tune_compile_export_and_run_without_ansor(tuned_a, tmp_path):
    db, params, result = tuned_a
    assert result.total_measured == 4 and sum(result.measured) == 4 and min(result.measured) >= 1
    assert all(c < float("inf") for c in result.best_costs)
    spent = result.spent  # where the time went: every part measured, none more than the whole
    assert spent.trials == 4 and spent.builds >= 4 and min(spent.build_s, spent.build_cpu_s, spent.run_s) > 0
    assert spent.search_s + spent.build_s + spent.run_s <= spent.seconds
    assert len(keys_in(db.log_path("model-a"))) == 4

    exe = ansor.relax.compile_relax(ModelA, params, db.log_path("model-a"), TARGET)
    library = ansor.relax.export(exe, tmp_path / "deploy")
    meta = json.loads((library.parent / "model.json").read_text())
    assert meta["inputs"] == [{"name": "x", "shape": [1, 8, 8, 4], "dtype": "float32"}]
    assert meta["params_file"] is None  # params were bound: they are inside model.so

    x = np.random.default_rng(1).standard_normal((1, 8, 8, 4)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    readme = (library.parent / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    child = snippet + (f"\nimport sys\nassert 'ansor' not in sys.modules\n"
                       f"np.save({str(tmp_path / 'y.npy')!r}, run(np.load({str(tmp_path / 'x.npy')!r}))[0])\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", child], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**env, "MODEL_DIR": str(library.parent)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), untuned(ModelA, params, x), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_apply_history_best_pass_in_a_users_pipeline(tuned_a):
    db, params, _ = tuned_a
    target = ansor.target.parse_target(TARGET)
    pipeline = tvm.transform.Sequential([relax.transform.BindParams("main", params),
                                         ansor.relax.PrepareAndFuse(target),
                                         ansor.relax.ApplyHistoryBest(db, target, default=False)])
    scheduled = pipeline(ModelA)
    tuned = [gv.name_hint for gv, f in scheduled.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and f.attrs.get("tirx.is_scheduled", False)]
    assert sorted(name.rstrip("0123456789") for name in tuned) == ["fused_conv2d_relu", "fused_matmul_add_relu"]
    exe = ansor.networks.build(scheduled, target)
    x = np.ones((1, 8, 8, 4), "float32")
    got = relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, untuned(ModelA, params, x), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_network_b_after_a_measures_no_shared_task(tuned_a, tmp_path):
    db, _, result_a = tuned_a
    tasks_b = ansor.relax.extract_tasks(ModelB, params_of(ModelB), TARGET)
    shared = {t.workload_key for t in result_a.tasks} & {t.workload_key for t in tasks_b}
    assert len(shared) == 1 and len(tasks_b) == 2  # the convolution
    log_b = db.log_path("model-b")
    result_b = ansor.relax.tune_relax(ModelB, params_of(ModelB), TARGET, log_b, trials=2, options=FAST, database=db)
    assert result_b.reused == sorted(shared)
    measured = dict(zip((t.workload_key for t in result_b.tasks), result_b.measured))
    assert [measured[k] for k in shared] == [0]
    assert sum(measured.values()) == 2
    assert not shared & set(keys_in(log_b)) and len(keys_in(log_b)) == 2
    # The shared task's best comes from A's log, and compiling B applies it.
    assert all(c < float("inf") for c in result_b.best_costs)
    exe = ansor.relax.compile_relax(ModelB, params_of(ModelB), db, TARGET)
    x = np.ones((1, 8, 8, 4), "float32")
    got = relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, untuned(ModelB, params_of(ModelB), x), rtol=1e-4, atol=1e-5)
    # B again with the same database: nothing left to tune, nothing measured, no Ray needed.
    again = ansor.relax.tune_relax(ModelB, params_of(ModelB), TARGET, tmp_path / "b2.json", trials=2,
                                   options=FAST, database=db)
    assert again.total_measured == 0 and len(again.reused) == 2


@pytest.mark.slow
def test_export_network_with_run_time_weights(tmp_path):
    """A build whose weights are arguments (here TVM's own build of tiny-cnn): they go to params.bin."""
    from ansor.networks import build, get_network, run

    net = get_network("tiny-cnn", 1)
    exe = build(net.mod, TARGET, fused=False)
    library = ansor.relax.export_network(exe, net, tmp_path / "deploy", TARGET)
    meta = json.loads((library.parent / "model.json").read_text())
    assert meta["params_file"] == "params.bin" and [w["name"] for w in meta["weights"]] == [w.name for w in net.weights]
    x = net.random_inputs(seed=2)[0]
    np.save(tmp_path / "x.npy", x)
    snippet = re.search(r"```python\n(.*?)```", (library.parent / "README.md").read_text(), re.S).group(1)
    child = snippet + f"\nnp.save({str(tmp_path / 'y.npy')!r}, run(np.load({str(tmp_path / 'x.npy')!r}))[0])\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", child], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**env, "MODEL_DIR": str(library.parent)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), run(exe, net, [x], TARGET)[0], rtol=1e-5, atol=1e-6)


def test_nn_module_extracts_compiles_and_matches_untuned():
    from tvm.relax.frontend import nn

    class MLP(nn.Module):
        def __init__(self):
            self.fc1 = nn.Linear(32, 64)
            self.fc2 = nn.Linear(64, 8)

        def forward(self, x):
            return self.fc2(nn.relu(self.fc1(x)))

    mod, named = MLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor((4, 32), "float32")}})
    rng = np.random.default_rng(0)
    params = {n: (rng.standard_normal([int(d) for d in p.shape]) * 0.1).astype(p.dtype) for n, p in named}
    tasks = ansor.relax.extract_tasks(mod, params, TARGET)
    assert len(tasks) == 2 and all("matmul" in t.name for t in tasks)
    exe = ansor.relax.compile_relax(mod, params, None, TARGET)  # no log: default schedules
    x = rng.standard_normal((4, 32)).astype("float32")
    got = relax.VirtualMachine(exe, tvm.cpu())["forward"](tvm.runtime.tensor(x)).numpy()
    want_exe = tvm.compile(relax.transform.BindParams("forward", params)(mod), target=ansor.target.parse_target(TARGET))
    want = relax.VirtualMachine(want_exe, tvm.cpu())["forward"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_onnx_frontend_module_extracts():
    onnx = pytest.importorskip("onnx", reason="the onnx package is not installed (pip install 'ansor[onnx]')")
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    w = numpy_helper.from_array(np.full((16, 8), 0.5, np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    mod = from_onnx(model, keep_params_in_input=True)
    tasks = ansor.relax.extract_tasks(mod, {"W": np.full((16, 8), 0.5, np.float32)}, TARGET)
    assert [t.name for t in tasks] == ["fused_matmul_relu [2,16]x[16,8]"]


def test_torch_frontend_module_extracts():
    torch = pytest.importorskip("torch", reason="torch is optional (pip install 'ansor[torch]')")
    from tvm.relax.frontend.torch import from_exported_program

    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    exported = torch.export.export(model, (torch.randn(2, 16),))
    mod = from_exported_program(exported, keep_params_as_input=True)
    mod, params = relax.frontend.detach_params(mod)
    names = [v.name for v in mod["main"].params[1:]]
    tasks = ansor.relax.extract_tasks(mod, dict(zip(names, (p.numpy() for p in params["main"]))), TARGET)
    assert len(tasks) == 1 and "matmul" in tasks[0].name


def test_bad_params_name_the_choices():
    with pytest.raises(NetworkError, match="does not take; its parameters: x, w, fc, b"):
        ansor.relax.extract_tasks(ModelA, {"weight": np.zeros(3, "float32")}, TARGET)
    with pytest.raises(NetworkError, match=r"parameter 'b': got float32\[3\], main expects float32\[16\]"):
        ansor.relax.extract_tasks(ModelA, {"b": np.zeros(3, "float32")}, TARGET)
    with pytest.raises(NetworkError, match="was not made by ansor.relax.compile_relax"):
        ansor.relax.export(tvm.compile(ModelA, target=ansor.target.parse_target(TARGET)), "unused-dir")
