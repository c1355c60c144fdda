"""The PyTorch eager baseline: the five torch definitions, their timing, and the scripts' baseline choice.

PyTorch is optional (extra ``torch``): every test that runs it is skipped without it. The last test needs no
torch: it hides torch from the script's process to check the error a user without it gets.
"""

import dataclasses
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ansor.networks import get_network

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
TARGET = "llvm -num-cores=2"
TORCH_NETWORKS = ("resnet-50", "mobilenet-v2", "resnet3d-18", "bert", "dcgan")


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is optional (pip install -e \".[torch]\"): the PyTorch "
                                               "eager baseline is not tested without it")


def run_script(script: str, *args: str, hide_torch: bool = False, cwd: Path = ROOT,
               timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a script as a user would; ``hide_torch`` makes ``import torch`` fail in its process."""
    path = str(SCRIPTS / script)
    if hide_torch:  # a None entry in sys.modules makes every import of torch raise ImportError
        code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        cmd = [sys.executable, "-c", code, path, *args]
    else:
        cmd = [sys.executable, path, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("name", TORCH_NETWORKS)
def test_torch_network_matches_the_relax_network(torch, name):
    from ansor.networks.torch_baseline import has_torch_definition, make_torch_model, torch_inputs

    net = get_network(name, batch_size=1)
    assert has_torch_definition(net)
    model = make_torch_model(name)
    assert not model.training
    # Same layers: the same multiset of weight sizes (layouts differ: OIHW vs HWIO, (out, in) vs (in, out)).
    assert sorted(p.numel() for p in model.parameters()) == sorted(math.prod(w.shape) for w in net.weights)
    with torch.inference_mode():
        out = model(*torch_inputs(net))
    want = net.mod[net.entry].ret_ty
    assert tuple(out.shape) == tuple(int(d) for d in want.shape.values)
    assert str(out.dtype) == f"torch.{want.dtype}"
    assert bool(torch.isfinite(out).all())


def test_only_builtin_networks_have_a_torch_definition():
    from ansor.networks.torch_baseline import has_torch_definition

    assert not has_torch_definition(get_network("tiny-cnn"))
    resnet = get_network("resnet-50")
    assert has_torch_definition(resnet)
    # An ONNX model named resnet-50 is another program: its entry is "main".
    assert not has_torch_definition(dataclasses.replace(resnet, entry="main"))


def test_time_torch_dcgan(torch):
    from ansor.networks import Timing
    from ansor.networks.torch_baseline import time_torch

    before = torch.get_num_threads()
    timing = time_torch("dcgan", 1, threads=1, repeat=2, min_repeat_ms=20, warmup=1)
    assert isinstance(timing, Timing)
    assert timing.num_threads == 1 and timing.repeats == 2
    assert 0 < timing.min_ms <= timing.median_ms <= timing.max_ms and timing.std_ms >= 0
    assert torch.get_num_threads() == before  # restored


def test_evaluate_networks_torch_baseline(torch, tmp_path):
    # Empty logs: the ansor column is the default build; the baseline column is what is under test.
    for name in ("dcgan-b1.json", "tiny-cnn-b1.json"):
        (tmp_path / name).write_text("")
    proc = run_script("evaluate_networks.py", "dcgan-b1.json", "tiny-cnn-b1.json", "--baseline", "torch",
                      "--repeat", "2", "--target", TARGET, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert re.match(r"Network +\| Batch \| +Baseline \| +ansor \| Speedup \| Tuned tasks \| Baseline used$",
                    lines[0]), proc.stdout
    assert re.match(r"dcgan +\| +1 \| +\d+\.\d+ ms \| +\d+\.\d+ ms \| +\d+\.\d+x \| 0/5 +\| PyTorch eager, 2 threads$",
                    lines[2]), proc.stdout
    # tiny-cnn: 7 tasks (its 16 -> 32 channel 3x3 convolution is three Winograd tasks)
    assert re.match(r"tiny-cnn +\| +1 \| .* \| 0/7 +\| default build$", lines[3]), proc.stdout
    assert f"PyTorch {torch.__version__}" in proc.stdout
    assert "tiny-cnn has no PyTorch definition" in proc.stderr and "Traceback" not in proc.stderr


def test_tune_network_reports_a_pytorch_row(torch, tmp_path):
    log = tmp_path / "dcgan-b1.json"
    log.write_text("")
    proc = run_script("tune_network.py", "--network", "dcgan", "--eval-only", "--log-file", str(log), "--repeat",
                      "2", "--target", TARGET)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for row in ("default build", "tuned", "pytorch eager"):
        assert re.search(rf"^{row}( +\d+\.\d+){{5}}$", out, re.M), out
    assert re.search(r"^Speedup over PyTorch eager \(mean\): \d+\.\d+x \(2 PyTorch threads\)$", out, re.M), out


@pytest.mark.slow
def test_baseline_torch_without_torch(tmp_path):
    (tmp_path / "dcgan-b1.json").write_text("")
    proc = run_script("evaluate_networks.py", "dcgan-b1.json", "--baseline", "torch", hide_torch=True,
                      cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "PyTorch is not installed" in errors[0] and "pip install" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    # auto falls back to the default build and says so.
    proc = run_script("evaluate_networks.py", "dcgan-b1.json", "--repeat", "2", "--target", TARGET,
                      hide_torch=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.match(r"dcgan +\| +1 \| .* \| default build$", proc.stdout.splitlines()[2]), proc.stdout
    assert "Baseline (default build)" in proc.stdout
    assert "note: PyTorch is not installed" in proc.stderr
