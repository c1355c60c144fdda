"""The thread-pool probe: a real build of tiny-cnn timed in fresh processes under each TVM setting."""

import json
import os

import pytest

from ansor.networks import apply_schedules, build, extract, get_network
from ansor.relax import export_network
from ansor.relax.thread_pool import MARGIN, SETTINGS, choose_pool_setting
from ansor.target import host_target
from ansor.task.timing import TimingPolicy

# Slow tier: builds a network and times it in fresh processes.
pytestmark = pytest.mark.slow


@pytest.mark.timing
def test_each_setting_is_timed_in_fresh_processes_and_unbound_threads_stand_unless_beaten(tmp_path):
    """Unbound threads are the reference: bound ones collapse when another process keeps a core busy."""
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    target = host_target()
    ex = extract(get_network("tiny-cnn", 1), target)
    exe = build(apply_schedules(ex.mod, ex.tasks, {}, target=target), target)
    settings = SETTINGS[:2]
    assert [s.name for s in settings] == ["unbound", "bound"]
    choice = choose_pool_setting(exe, ex.network, target, processes=2, settings=settings,
                                 timing=TimingPolicy(repeat=5, min_repeat_ms=20))
    assert set(choice.ms) == {"bound", "unbound"} and all(len(v) == 2 and min(v) > 0 for v in choice.ms.values())
    mean = {k: sum(v) / len(v) for k, v in choice.ms.items()}
    assert choice.best.name == ("bound" if mean["bound"] < (1 - MARGIN) * mean["unbound"] else "unbound")
    assert "bound" in str(choice) and "unbound" in str(choice)
    # The export names the chosen setting for whoever runs the model.
    export_network(exe, ex.network, tmp_path, target, env=dict(settings[0].env))
    assert json.loads((tmp_path / "model.json").read_text())["env"] == {"TVM_BIND_THREADS": "0"}
    assert "`TVM_BIND_THREADS=0`" in (tmp_path / "README.md").read_text()
