"""Tune, compile and deploy any Relax IRModule (the MetaSchedule ``tune_relax``/``compile_relax`` path).

::

    tasks = ansor.relax.extract_tasks(mod, params, target)            # weighted tasks, heaviest first
    ansor.relax.tune_relax(mod, params, target, "net.json", trials=500, database="tuning-db")
    exe = ansor.relax.compile_relax(mod, params, "net.json", target)  # -> Relax VM executable
    # bf16 (a CPU with AVX512_BF16): precision=Precision.BF16 (ansor.task.precision) to both calls
    ansor.relax.export(exe, "deploy/")                                  # model.so + model.json + README.md

``mod`` comes from ``relax.frontend.nn`` (``export_tvm``), ``relax.frontend.onnx``,
``relax.frontend.torch`` or TVMScript; ``params`` maps parameter names to numpy arrays (bound as
constants), or is ``None`` (weights stay run-time inputs). Inside ansor, ``from tvm import relax`` still
means TVM's Relax: this package is ``ansor.relax``.
"""

from .compile import ApplyHistoryBest, PrepareAndFuse, compile_network, compile_relax
from .export import Signature, check_export_dir, export, export_network
from .model import as_network, bind_params, entry_function
from .tune import NetworkTuneResult, extract_tasks, tune_relax, tune_tasks

__all__ = ["ApplyHistoryBest", "NetworkTuneResult", "PrepareAndFuse", "Signature", "as_network", "bind_params", "check_export_dir",
           "compile_network", "compile_relax", "entry_function", "export", "export_network", "extract_tasks",
           "tune_relax", "tune_tasks"]
