"""The search space of a target: which sketch rules derive its sketches, which annotation fills them in.

The one module that knows both the CPU search (:mod:`.rules`, :mod:`.annotation`) and the CUDA one
(:mod:`.gpu_rules`, :mod:`.gpu_annotation`); they build on each other's helpers in one direction only.
"""

from __future__ import annotations

import random
from typing import Optional

from ..state.loop_state import State
from ..task.search_task import SearchTask
from ..target import is_gpu
from .annotation import sample_cpu_program
from .gpu_annotation import sample_gpu_program
from .gpu_rules import GPU_RULES
from .rules import CPU_RULES, SketchRule, derive_sketches


def generate_sketches(task: SearchTask, rules: Optional[tuple[SketchRule, ...]] = None,
                      extra_rules: tuple[SketchRule, ...] = ()) -> list[State]:
    """All sketches of ``task``: each rule list walk from the last stage to the first.

    ``extra_rules`` run before the built-in ones (a user rule returning APPLY_AND_SKIP_REST replaces them
    for the stages it claims). The built-in rules are the CPU ones, or the CUDA ones for a GPU target.
    """
    if rules is None:
        rules = GPU_RULES if is_gpu(task.target) else CPU_RULES
    return derive_sketches(task, tuple(extra_rules) + tuple(rules))


def sample_program(task: SearchTask, sketch: State, rng: random.Random) -> Optional[State]:
    """One complete random program from ``sketch`` (None if the random choices were illegal)."""
    sample = sample_gpu_program if is_gpu(task.target) else sample_cpu_program
    return sample(task, sketch, rng)


def sample_initial_population(task: SearchTask, sketches: list[State], n: int, rng: random.Random,
                              exclude: Optional[set] = None) -> list[State]:
    """Up to ``n`` distinct random programs, spread over the sketches; ``exclude`` holds known keys.

    Gives up after ``8 n`` draws: some sketches rarely yield a legal program.
    """
    exclude = set() if exclude is None else exclude
    out: list[State] = []
    seen: set = set()
    for _ in range(n * 8):
        if len(out) >= n:
            break
        state = sample_program(task, rng.choice(sketches), rng)
        if state is None:
            continue
        key = state.key()
        if key in seen or key in exclude:
            continue
        seen.add(key)
        out.append(state)
    return out
