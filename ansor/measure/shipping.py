"""Getting SearchTasks to Ray workers cheaply.

A task travels as its PrimFunc's JSON text (see :class:`~ansor.task.search_task.SearchTask`); parsing it back
and analysing the ComputeDAG costs milliseconds, which would add up over thousands of candidates. So the
driver puts each task in the object store once per batch and sends a :class:`TaskHandle` (a key plus the
reference, nested so Ray does not fetch and unpickle it for every call); each worker process keeps the
tasks it has rebuilt, DAG analysis included, keyed by workload, target and hardware parameters.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable

import ray

from ..task.search_task import SearchTask

#: Tasks kept per worker process; a network has a few dozen.
_CACHE_SIZE = 128
_cache: "OrderedDict[str, SearchTask]" = OrderedDict()


def task_key(task: SearchTask) -> str:
    """Identity of a task for caching: same key, same program on the same hardware."""
    return f"{task.workload_key}|{task.target_str}|{task.hardware_params.to_json()}"


@dataclass(frozen=True)
class TaskHandle:
    """What a build or run call carries instead of the task itself."""

    key: str
    ref: tuple  # (ObjectRef,): a nested reference is passed as is, not resolved by Ray

    def get(self) -> SearchTask:
        """The task, from this process's cache or (once) from the object store."""
        task = _cache.get(self.key)
        if task is None:
            task = ray.get(self.ref[0])
            _cache[self.key] = task
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        else:
            _cache.move_to_end(self.key)
        return task


def ship(tasks: Iterable[SearchTask]) -> dict[str, TaskHandle]:
    """Put each distinct task in the object store once; handles by :func:`task_key`."""
    handles: dict[str, TaskHandle] = {}
    for task in tasks:
        key = task_key(task)
        if key not in handles:
            handles[key] = TaskHandle(key, (ray.put(task),))
    return handles
