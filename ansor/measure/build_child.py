"""The process of an isolated build (:class:`~ansor.measure.memory_cap.IsolatedBuild`).

Reads the pickled (task, steps, cap) from stdin, says it is ready once TVM is imported, builds under the
cap and pickles the :class:`~ansor.log.measurement.BuildResult` to stdout. It dies with the worker that started it.
"""

from __future__ import annotations

import pickle
import signal
import sys

from .memory_cap import CHILD_READY, apply_cap, die_with_parent


def main() -> None:
    die_with_parent(signal.SIGKILL)
    task, steps, cap = pickle.loads(sys.stdin.buffer.read())
    from .builder import build_program  # TVM, imported before the cap applies (as in a worker)
    sys.stdout.buffer.write(CHILD_READY)
    sys.stdout.buffer.flush()
    apply_cap(cap)
    result = build_program(task, steps, cap)
    sys.stdout.buffer.write(pickle.dumps(result))


if __name__ == "__main__":
    main()
