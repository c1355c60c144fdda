"""Shared fixtures: one local Ray instance per test module that needs one (starting Ray takes ~4 s)."""

import os

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """An embedded Ray on this machine, listening on 127.0.0.1 only; measurers created inside reuse it."""
    from ansor.measure.ray_session import RaySession

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    session = RaySession.open()
    assert session.owns_cluster, "a Ray connection was left open by an earlier test module"
    yield session
    session.close()
