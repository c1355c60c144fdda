"""Networks: Relax model definitions, task extraction, apply-best and end-to-end evaluation.

Typical use::

    net = get_network("resnet-50", batch_size=1)
    ex = extract(net, target)                       # prepared (NHWC, weights bound), fused, weighted tasks
    ... tune ex.tasks (weights: ex.tasks[i].weight) into log.json ...
    mod = apply_history_best(ex.mod, ex.tasks, "log.json")
    print(time_network(build(mod, target), ex.network, target=target))

See ``docs/networks.md``.
"""

from .schedules import (
    ScheduledFunc, apply_schedules, apply_history_best, default_scheduled, schedule_task, scheduled_func,
)
from .default_schedule import copy_schedule, default_candidates, default_state, default_tir_schedule
from .evaluate import (
    CallProfile, OutputComparison, Timing, build, check_against_default, compare_outputs, profile_calls, run,
    runtime_threads, time_network, time_networks,
)
from .extract import Extraction, NetworkTask, SkippedFunc, extract, fuse
from .network import Network, NetworkError, TensorSpec
from .onnx_import import load_onnx
from .prepare import prepare
from .registry import describe_network, get_network, network_names

__all__ = [
    "CallProfile", "Extraction", "Network", "NetworkError", "NetworkTask", "OutputComparison", "SkippedFunc", "TensorSpec",
    "Timing", "apply_schedules", "apply_history_best", "build", "check_against_default", "compare_outputs",
    "ScheduledFunc", "copy_schedule", "default_candidates", "default_scheduled", "default_state", "default_tir_schedule", "describe_network",
    "extract", "fuse", "get_network", "load_onnx", "network_names",
    "prepare", "profile_calls", "run", "runtime_threads", "schedule_task", "scheduled_func", "time_network",
    "time_networks",
]
