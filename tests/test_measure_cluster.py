"""A simulated two-node cluster (``ray.cluster_utils.Cluster``): builds spread, runners per node, node loss."""

import time

import pytest
import ray
from ray.cluster_utils import Cluster

from ansor.measure import ErrorNo, ProgramMeasurer
from ansor.measure.ray_session import loopback_only
from ansor.task.search_task import SearchTask

# Slow tier: a simulated two-node Ray cluster, with a node killed mid-batch.
pytestmark = pytest.mark.slow

NODE_ARGS = {"num_cpus": 1, "object_store_memory": 100 * 2 ** 20}


@pytest.fixture(scope="module")
def cluster():
    assert not ray.is_initialized(), "a Ray connection was left open by an earlier test module"
    with loopback_only():  # a test cluster is no reason to listen on the network
        c = Cluster(initialize_head=True, head_node_args={**NODE_ARGS, "resources": {"head": 1},
                                                           "include_dashboard": False})
        c.add_node(**NODE_ARGS, resources={"worker": 1})
        c.wait_for_nodes()
        yield c
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def test_builds_spread_and_each_node_times_its_share(cluster, monkeypatch, matmul_inputs):
    head, worker = cluster.head_node.node_id, next(iter(cluster.worker_nodes)).node_id
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)  # joined through the environment, as scripts do
    task = SearchTask.from_workload("matmul-128")
    with ProgramMeasurer(min_repeat_ms=20) as m:
        results = m.measure(matmul_inputs(task, 8))
        spans = m.spans
    assert all(r.ok for r in results), [r.error_msg for r in results]
    assert {s.node for s in spans if s.kind == "build"} == {head, worker}
    assert {r.node for r in results} == {head, worker}
    # Each runner measures on its own node: every run span is on the node its result names.
    runs = {s.index: s for s in spans if s.kind == "run"}
    assert all(runs[i].node == r.node for i, r in enumerate(results))
    # Leaving a cluster we joined does not stop it.
    assert not ray.is_initialized()
    assert all(n.remaining_processes_alive() for n in [cluster.head_node, *cluster.worker_nodes])


def test_losing_a_node_mid_batch_loses_no_candidate(cluster, caplog, matmul_inputs):
    worker = next(iter(cluster.worker_nodes))
    task = SearchTask.from_workload("matmul-128")
    inputs = matmul_inputs(task, 12)
    finished = []
    removed = []

    def remove_worker_after_two(inps, results):
        finished.append(results[0])
        if len(finished) == 2:  # both runners are busy: the worker's candidate is in flight
            cluster.remove_node(worker)
            removed.append(time.time())

    with ProgramMeasurer(cluster.address, min_repeat_ms=100,
                         callbacks=[remove_worker_after_two]) as m:
        results = m.measure(inputs)
        assert len(results) == len(finished) == 12
        assert all(r.ok or (r.error_no != ErrorNo.NO_ERROR and r.error_msg) for r in results)
        assert sum(r.ok for r in results) >= 11  # the candidate in flight is re-run (or, at worst, an error)
        # After the removal only the head measures. (Results may still name the worker: a slow candidate's
        # cost is the probe run it had there before, reported once the probes are done.)
        late = [s for s in m.spans if s.kind == "run" and s.node == worker.node_id and s.start > removed[0]]
        assert not late, late
        assert f"node {worker.node_id}" in caplog.text  # the loss was noticed and its work moved
        # The next batch runs on what is left.
        assert all(r.ok for r in m.measure(inputs[:2]))
