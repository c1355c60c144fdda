"""Shared fixtures: one local Ray instance per test module that needs one (starting Ray takes ~4 s)."""

import itertools

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """An embedded Ray on this machine, listening on 127.0.0.1 only; measurers created inside reuse it."""
    from ansor.measure.ray_session import RaySession

    session = RaySession.open()
    assert session.owns_cluster, "a Ray connection was left open by an earlier test module"
    yield session
    session.close()


@pytest.fixture(scope="session")
def matmul_inputs():
    """Makes ``n`` distinct tilings of a matmul task's block (stage 0: i, j, k), outer loop parallel."""
    from ansor.measurement import MeasureInput

    def make(task, n: int) -> list:
        inputs = []
        for f, g in itertools.islice(itertools.product([4, 8, 16, 32], [4, 8, 16, 32]), n):
            s = task.compute_dag.init_state()
            s.split(0, 0, [f])
            s.split(0, 2, [g])
            s.annotate(0, 0, "parallel")
            inputs.append(MeasureInput(task, s))
        return inputs

    return make
