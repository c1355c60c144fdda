"""The model zoo of ``ansor bench --zoo`` (ansor/bench/zoo.py, zoo_bench.py): what it covers, that listing it
loads no torch, its resume decision, a broken model's row and its markdown section. Nothing here tunes."""

import argparse
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from ansor.bench import zoo
from ansor.errors import AnsorError
from ansor.bench.docs import Provenance
from ansor.bench.network_report import DEFAULT, OURS, ModelReport, TaskRow, result_cells
from ansor.bench.peers import PeerResult
from ansor.bench.zoo_bench import (StoredRow, ZooResult, ZooStatus, bench_zoo_model, log_path, needs_tuning, read_status,
                                   status_path, write_status, write_zoo_docs, zoo_row, zoo_rows)

REQUIRED = {zoo.MOBILE_SE, zoo.DEPTHWISE, zoo.GROUPED, zoo.DENSE, zoo.INCEPTION, zoo.CONVNEXT, zoo.VIT,
            zoo.DETECTOR, zoo.VIDEO, zoo.ENCODER, zoo.DECODER}


def test_zoo_covers_every_required_family_with_unique_names():
    families = {m.family for m in zoo.ZOO}
    assert REQUIRED <= families and families == set(zoo.FAMILIES)
    assert len(zoo.ZOO) >= 22
    assert len({m.name for m in zoo.ZOO}) == len(zoo.ZOO)
    assert {m.library for m in zoo.ZOO} == {zoo.TORCHVISION, zoo.TRANSFORMERS}
    vits = {m.name for m in zoo.ZOO if m.family == zoo.VIT}
    assert {"vit_b_16", "swin_t"} <= vits
    assert zoo.BY_NAME["bert-base"].source == "transformers.BertModel(BertConfig)"
    assert zoo.BY_NAME["r3d_18"].source == "torchvision.models.video.r3d_18"


def test_importing_the_zoo_loads_neither_torch_nor_tvm():
    code = ("import sys, ansor.bench.zoo, ansor.bench.zoo_bench; "
            "print(sorted(m for m in ('torch', 'torchvision', 'transformers', 'tvm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_model_lists_the_zoo():
    with pytest.raises(AnsorError, match="choose from .*mobilenet_v3_large"):
        zoo.zoo_model("alexnet")


def test_a_model_whose_tuning_finished_is_not_tuned_again(tmp_path):
    name = "squeezenet1_1"
    assert needs_tuning(tmp_path, name)  # nothing yet
    write_status(tmp_path, name, ZooStatus(error="import: no such operator"))
    assert needs_tuning(tmp_path, name)  # failures are retried
    write_status(tmp_path, name, ZooStatus(True, 1.0e9, 30.0, 42))
    assert needs_tuning(tmp_path, name)  # finished, but its log is gone
    log_path(tmp_path, name).write_text("")
    assert not needs_tuning(tmp_path, name)
    s = read_status(tmp_path, name)
    assert (s.tuned, s.start, s.tuning_s, s.trials) == (True, 1.0e9, 30.0, 42)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial file left
    status_path(tmp_path, name).write_text("{not json")
    assert needs_tuning(tmp_path, name)  # a damaged status never passes a log off as finished
    write_status(tmp_path, name, ZooStatus(True, 1.0e9, 300.0, 900, minutes=5.0))
    assert not needs_tuning(tmp_path, name, 5.0) and not needs_tuning(tmp_path, name)
    assert needs_tuning(tmp_path, name, 10.0)  # tuned for another budget: its row would not say 10 minutes


def _args(**kw):
    defaults = dict(minutes=0.1, n_trials=10, repeat=1, pause=0.0, rounds=0, metaschedule=False, reuse_timings=False,
                    precision="fp32")
    return argparse.Namespace(**{**defaults, **kw})


def test_a_model_that_fails_to_import_gets_its_error_row(tmp_path):
    model = zoo.BY_NAME["squeezenet1_1"]
    (tmp_path / f"{model.name}.onnx").write_bytes(b"\x08\x07 this is not a protobuf")  # export skips an existing file
    said = []
    result = bench_zoo_model(model, _args(), "llvm -num-cores=1", 1, tmp_path, say=said.append)
    assert result.report is None and result.stage == "import"
    assert "not a valid ONNX model" in result.error and "\n" not in result.error
    status = json.loads(status_path(tmp_path, model.name).read_text())
    assert status["error"].startswith("import: ") and status["tuned"] is False
    assert not log_path(tmp_path, model.name).exists()  # nothing was tuned
    _, rows, geomean, count = zoo_rows([result])
    assert rows[0][:4] == (model.name, model.family, f"no: import failed: {result.error}", "-")
    assert count == 0 and np.isnan(geomean)


def test_a_timed_model_gives_its_stored_row_with_reuse_timings(tmp_path):
    """The whole zoo takes longer than a machine stays free: a table is assembled from several runs, each
    model's row from the run that timed it, without exporting, building or timing it again."""
    model = zoo.BY_NAME["resnet50"]
    timed = ZooResult(model, _report(model.name, 10.0))
    row, ratio = zoo_row(timed)
    log_path(tmp_path, model.name).write_text("")
    write_status(tmp_path, model.name, ZooStatus(True, 1.0e9, 600.0, 64, minutes=10.0, row=list(row),
                                                 ratio=ratio, timed="2025-01-01"))
    said = []
    reused = bench_zoo_model(model, _args(minutes=10.0, reuse_timings=True), "llvm -num-cores=1", 1, tmp_path,
                             say=said.append)
    assert (reused.stored.cells, reused.stored.ratio) == (row, ratio) and reused.report is None
    assert "timed on 2025-01-01" in said[0]
    assert not (tmp_path / f"{model.name}.onnx").exists()  # nothing exported: the row came from the status
    _, rows, geomean, count = zoo_rows([reused, timed])
    assert rows == [row, row] and count == 2 and geomean == pytest.approx(1.5)
    provenance = Provenance("2025-02-01", "CPU: Test CPU (2 cores)", "Python 3", "ansor bench --zoo")
    text = write_zoo_docs(tmp_path, [reused], provenance, 10).read_text()
    assert "Rows timed by earlier runs" in text and "resnet50 (2025-01-01)" in text and "**1.50**" in text


def test_outputs_that_do_not_move_with_the_input_are_refused():
    """torchvision's own initialisation made GoogLeNet's outputs for two inputs differ by 3e-11 and
    ViT-B/16's all zeros: a check against ONNX Runtime on such a model proves nothing."""
    a = np.linspace(-1, 1, 10, dtype=np.float32)
    assert zoo.input_dependence([a], [a + 1e-12]) < zoo.INPUT_DEPENDENCE
    assert zoo.input_dependence([np.zeros(3)], [np.zeros(3)]) == 0.0
    assert np.isnan(zoo.input_dependence([a], [a * np.inf]))
    assert zoo.input_dependence([a, a], [a, -a]) == 0.0  # every output must move, not only one
    assert zoo.input_dependence([a], [-a]) == pytest.approx(2.0)


def test_zoo_weights_make_the_output_depend_on_the_input():
    pytest.importorskip("torchvision", reason="building the zoo's models needs torchvision (the zoo extra)")
    import torch
    model = zoo.BY_NAME["googlenet"]
    module = zoo.build_module(model)
    with torch.no_grad():
        outputs = [[module(*zoo.example_inputs(model, seed)).numpy()] for seed in (0, 1)]
    assert zoo.input_dependence(*outputs) > 10 * zoo.INPUT_DEPENDENCE  # 2.5e-2; 3e-11 with its own weights


def test_a_chaotic_model_is_refused_and_efficientnet_v2_s_is_not_chaotic():
    """He-normal weights made EfficientNet-V2-S's outputs (1e6) move by a quarter when its input moved by one
    part in a million: its tuned build then failed the check against the default build after 10 minutes."""
    pytest.importorskip("torchvision", reason="building the zoo's models needs torchvision (the zoo extra)")
    import torch
    model = zoo.BY_NAME["efficientnet_v2_s"]
    with pytest.raises(AnsorError, match="chaotic: scaling its input by 1 \\+ 1e-06 moves"):
        zoo._check_input_dependence(model, lambda x: torch.sin(x * 1e9))
    zoo._check_input_dependence(model, zoo.build_module(model))  # with its gain: stable, and input-dependent


def _report(name: str, ms: float) -> ModelReport:
    from ansor.networks import OutputComparison
    report = ModelReport(name, tuning_s=30.0, trials=64, tuned_ms=ms, default_ms=2 * ms)
    report.peers = [PeerResult("ONNX Runtime 1.x", ms, ms), PeerResult("OpenVINO 2026", 2 * ms, 2 * ms)]
    report.rounds = {OURS: [ms, ms], "ONNX Runtime 1.x": [ms / 2, ms], "OpenVINO 2026": [2 * ms, 2 * ms]}
    report.breakdown = [TaskRow("conv", 1, ms / 2, ms / 4, 10.0)]
    report.vs_ort = OutputComparison(1e-6, 1.0, 1e-4, 1e-5)
    return report


def test_tuned_vs_default_is_taken_in_turn_when_the_default_build_ran_in_the_rounds():
    """A host that slows down between two timings: one after the other the tuned build looks slower than the
    default; the rounds, in which both meet the same speed, give the real ratio. The default build is no
    runtime: the ratio to the fastest runtime ignores it."""
    report = _report("m", 19.0)
    report.default_ms = 17.4  # timed after the host slowed down
    report.rounds = {OURS: [14.3, 19.3], DEFAULT: [17.3, 23.1], "ONNX Runtime 1.x": [14.0, 18.8]}
    assert report.tuned_vs_default() == pytest.approx(np.median([17.3 / 14.3, 23.1 / 19.3]))
    assert report.in_turn_ratios() == pytest.approx([14.3 / 14.0, 19.3 / 18.8])
    cells, _ = result_cells(report)
    assert "1.20x in turn" in cells
    del report.rounds[DEFAULT]
    assert result_cells(report)[0][5] == "0.92x"


def test_zoo_section_is_replaced_not_duplicated(tmp_path):
    ok = ZooResult(zoo.BY_NAME["resnet50"], _report("resnet50", 10.0))
    broken = ZooResult(zoo.BY_NAME["swin_t"], stage="build", error="building the network failed: x | y")
    provenance = Provenance("2025-01-01", "CPU: Test CPU (2 cores)", "Python 3", "ansor bench --zoo")
    path = write_zoo_docs(tmp_path, [ok, broken], provenance, 0.5)
    first = path.read_text()
    assert first.count("<!-- generated: zoo:test-cpu -->") == 1 and "0.5 minutes" in first
    assert "| resnet50 | classic CNN | yes | yes | yes (1.0e-06) | 10.00 |" in first
    assert "no: build failed: building the network failed: x \\| y" in first  # a | in a message stays in its cell
    assert "**1.50**" in first  # in turn: median of the rounds' ratios 10/5 and 10/10
    assert "over the 1 of 2 models that ran" in first
    write_zoo_docs(tmp_path, [ok], provenance, 10)
    second = path.read_text()
    assert second.count("<!-- generated: zoo:test-cpu -->") == 1 and second.count("<!-- end: zoo:test-cpu -->") == 1
    assert "10 minutes" in second and "0.5 minutes" not in second and "swin_t" not in second


def test_a_run_over_some_models_keeps_the_other_rows_of_the_table_with_their_dates(tmp_path):
    """``--models X --reuse-timings --write-docs``: X's rows change, the other models' rows of the table the
    whole zoo made stay, dated, in the zoo's order, and the geometric mean covers them all."""
    from ansor.bench.docs import section_key
    from ansor.bench.zoo_bench import earlier_rows, with_earlier_rows
    cpu = "CPU: Test CPU (2 cores)"
    first = [ZooResult(zoo.BY_NAME["resnet50"], _report("resnet50", 10.0)),
             ZooResult(zoo.BY_NAME["swin_t"], stage="build", error="building failed: x | y"),
             ZooResult(zoo.BY_NAME["gpt2"], _report("gpt2", 4.0))]
    path = write_zoo_docs(tmp_path, first, Provenance("2025-01-01", cpu, "Python 3", "ansor bench --zoo"), 10)
    earlier = earlier_rows(path, section_key("zoo", cpu), 10)
    assert earlier["resnet50"].cells == zoo_row(first[0])[0] and earlier["resnet50"].ratio == pytest.approx(1.5)
    assert earlier["resnet50"].timed == "2025-01-01" and math.isnan(earlier["swin_t"].ratio)
    assert earlier["swin_t"].cells == zoo_row(first[1])[0]  # the escaped | stays inside its cell
    assert earlier_rows(path, section_key("zoo", cpu), 5) == {}  # another tuning time: nothing to keep
    rerun = [ZooResult(zoo.BY_NAME["gpt2"], _report("gpt2", 2.0)), ZooResult(zoo.BY_NAME["densenet121"],
                                                                            _report("densenet121", 3.0))]
    merged = with_earlier_rows(rerun, earlier)
    assert [r.model.name for r in merged] == [m.name for m in zoo.ZOO if m.name in
                                              ("resnet50", "swin_t", "gpt2", "densenet121")]
    assert next(r for r in merged if r.model.name == "gpt2").report.tuned_ms == 2.0
    text = write_zoo_docs(tmp_path, merged, Provenance("2025-02-01", cpu, "Python 3", "ansor bench --zoo"),
                          10).read_text()
    assert "resnet50 (2025-01-01)" in text and "swin_t (2025-01-01)" in text and "gpt2 (" not in text
    assert "over the 3 of 4 models" in text
    assert earlier_rows(path, section_key("zoo", cpu), 10)["resnet50"].timed == "2025-01-01"


def test_a_bf16_run_over_some_models_keeps_the_other_rows_of_the_bf16_table(tmp_path):
    """The bf16 table has its own title and column names: a bf16 run over a few models keeps its other rows
    (it kept none when the reader looked for the fp32 table's title), and never takes the fp32 table's."""
    from ansor.bench.zoo_bench import earlier_rows, zoo_section
    cpu = "CPU: Test CPU (2 cores)"
    results = [ZooResult(zoo.BY_NAME[name], _report(name, ms)) for name, ms in (("resnet50", 10.0), ("gpt2", 4.0))]
    for precision in ("fp32", "bf16"):
        for r in results:
            r.report.precision = precision
        path = write_zoo_docs(tmp_path, results, Provenance("2025-01-01", cpu, "Python 3", "ansor bench"), 10,
                              precision)
    bf16 = earlier_rows(path, zoo_section(cpu, "bf16"), 10, "bf16")
    assert sorted(bf16) == ["gpt2", "resnet50"] and bf16["resnet50"].ratio == pytest.approx(1.5)
    assert earlier_rows(path, zoo_section(cpu, "bf16"), 10) == {}  # read as fp32: another table


def test_the_readme_summary_shows_the_latest_run_between_its_markers(tmp_path):
    """The README's results block is generated too: the zoo's short table replaces whatever was there."""
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- generated: network-summary -->\nold figures\n<!-- end: network-summary -->\n\nrest\n")
    ok = ZooResult(zoo.BY_NAME["resnet50"], _report("resnet50", 10.0))
    broken = ZooResult(zoo.BY_NAME["swin_t"], stage="build", error="x")
    provenance = Provenance("2025-01-01", "CPU: Test CPU (2 cores)", "Python 3", "ansor bench --zoo")
    write_zoo_docs(tmp_path, [ok, broken], provenance, 10)
    text = readme.read_text()
    assert "old figures" not in text and text.endswith("rest\n") and text.startswith("# x\n")
    assert "| resnet50 | **1.50** | 2.00x |" in text and "| swin_t | - | - |" in text
    assert "Model zoo after 10 minutes of tuning each; CPU: Test CPU (2 cores); one run of 2025-01-01" in text
    assert "`ansor bench --zoo --minutes 10 --work-dir bench-work --write-docs .`" in text  # rerunnable as it is
    cells = ("gpt2", *zoo_row(ok)[0][1:])
    kept = ZooResult(zoo.BY_NAME["gpt2"], resumed=True, stored=StoredRow(cells, 0.9, "2024-12-24"))
    write_zoo_docs(tmp_path, [ok, kept], provenance, 10)
    assert "assembled from runs of 2024-12-24 to 2025-01-01" in readme.read_text()


def test_export_writes_the_onnx_file_once(tmp_path):
    pytest.importorskip("torchvision", reason="exporting the zoo needs torchvision (the zoo extra)")
    onnx = pytest.importorskip("onnx", reason="reading the export needs onnx")
    model = zoo.BY_NAME["squeezenet1_1"]
    path = zoo.export(model, tmp_path)
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["input"]
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == [1, 3, 224, 224]
    stamp = path.stat().st_mtime_ns
    assert zoo.export(model, tmp_path) == path and path.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no partial file left


def test_bad_zoo_flags_are_refused_before_any_work(tmp_path, capsys):
    from ansor.cli.main import main
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"")
    assert main(["bench", "--zoo", "--onnx", str(onnx)]) == 2
    assert "--zoo benchmarks the zoo's models" in capsys.readouterr().err
    assert main(["bench", "--zoo", "--models", "alexnet", "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no model 'alexnet' in the zoo") and "gpt2" in err
    assert list(tmp_path.iterdir()) == [onnx]  # nothing was exported or written
    assert main(["bench", "--reuse-timings", "--onnx", str(onnx)]) == 2
    assert "--reuse-timings reuses the model zoo's stored rows: it needs --zoo" in capsys.readouterr().err


def test_provenance_names_the_command_once():
    assert Provenance.here("CPU: x", ["bench", "--zoo"]).command == "ansor bench --zoo"
    assert Provenance.here("CPU: x", ["--zoo"]).command == "ansor bench --zoo"  # scripts/bench/bench_network.py
    script = Provenance.here("CPU: x", ["--pair", "a b.onnx", "a.json"], script="scripts/bench/bench_headroom.py")
    assert script.command == "python scripts/bench/bench_headroom.py --pair 'a b.onnx' a.json"


def test_in_network_over_alone_counts_only_tasks_timed_in_full_alone():
    """A state only probed alone (one run, maybe preempted) has no alone time to compare with."""
    report = _report("m", 4.0)
    report.breakdown = [TaskRow("conv", 1, 2.0, 1.6, 10.0), TaskRow("winograd_input", 2, 0.1, float("nan"), 1.0)]
    assert report.in_network_over_alone() == pytest.approx(2.0 / 1.6)
    report.breakdown = [TaskRow("winograd_input", 2, 0.1, float("nan"), 1.0)]
    assert np.isnan(report.in_network_over_alone())


def test_a_bf16_task_is_held_against_the_bf16_peak():
    """On a CPU whose bf16 unit doubles the fp32 peak, a bf16 layer at 400 GFLOPS is not 1.7x the peak."""
    from ansor.bench.peak import Peak
    peak = Peak(threads=2, fma_gflops=234.0, fma_config="", sgemm_gflops=200.0, sgemm_note="", bf16_gflops=468.0)
    assert TaskRow("conv", 1, 1.0, 1.0, 400.0, bf16=True).of_peak(peak) == pytest.approx(400 / 468)
    assert TaskRow("conv", 1, 1.0, 1.0, 200.0).of_peak(peak) == pytest.approx(200 / 234)
    no_unit = Peak(threads=2, fma_gflops=234.0, fma_config="", sgemm_gflops=200.0, sgemm_note="")
    assert TaskRow("conv", 1, 1.0, 1.0, 200.0, bf16=True).of_peak(no_unit) == pytest.approx(200 / 234)


def test_provenance_commands_rerun_from_the_repository(tmp_path):
    """No absolute directory of the machine that measured: the work dir and docs root are the reader's."""
    from ansor.bench.docs import portable
    root = tmp_path / "repo"
    (root / "models").mkdir(parents=True)
    argv = ["--onnx", "/elsewhere/zoo/vit_b_16.onnx", str(root / "models" / "m.onnx"), "--work-dir", "/work/bp18",
            "--write-docs", "/work/bp18/docsroot", "--models", "resnet50", "--rounds", "5"]
    assert portable(argv, root) == ["--onnx", "bench-work/vit_b_16.onnx", "models/m.onnx", "--work-dir",
                                    "bench-work", "--write-docs", ".", "--models", "resnet50", "--rounds", "5"]
    command = Provenance.here("CPU: x", argv=["--zoo", "--work-dir", "/tmp/zz"]).command
    assert command == "ansor bench --zoo --work-dir bench-work"
