"""The search space of each kind of target: one :class:`SearchSpace` per kind, the only place the search
tells CPU from CUDA (MetaSchedule's ``default_config.py`` plays this part there).

A space holds the sketch rules, the annotation that samples a complete program from a sketch, the mutation
rules with the names of their probabilities (the numbers are in :class:`~ansor.sketch.evolution.EvolutionParams`),
the cheap hardware check run on each mutated child (``fits``) and the validity filter run before measurement
(``check``).
:func:`space_of` picks the space of a target; policy, evolution and sampling ask it and nothing else.
A space names no feature extractor: :mod:`ansor.cost_model.features` serves both kinds (it reads the target
from the task, and a GPU program's thread and block extents are columns of the same vector).

To add a kind of target:

1. add a :class:`~ansor.target.DeviceKind` in ``ansor/target.py`` and map targets to it in ``device_kind``;
2. write its sketch rules and its sampler (as :mod:`.gpu_rules` and :mod:`.gpu_annotation` do for CUDA);
3. add a :class:`SearchSpace` here under the kind's name, choosing its mutators, check and filter.

To add a mutation rule: write ``mutate_x(task, state, rng)`` in :mod:`.mutation` (return None when it does
not apply), add its probability ``p_x`` to ``EvolutionParams``, and list ``Mutator("x", mutate_x, ("p_x",))``
in the spaces that should use it (``tests/test_gpu_sketch.py`` checks that every name is a field).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import tvm

from ..errors import StepError
from ..state.loop_state import State
from ..target import CPU_DEVICE, CUDA_DEVICE, device_kind
from ..task.search_task import SearchTask
from .annotation import CPU_UNROLL_STEPS, sample_cpu_program
from .gpu_annotation import GPU_UNROLL_STEPS, fits_gpu, sample_gpu_program
from .gpu_rules import GPU_RULES
from .gpu_verify import verify_gpu
from .mutation import (
    Mutator, mutate_compute_location, mutate_layout_rewrite, mutate_parallel, mutate_tile_size, mutate_unroll,
)
from .rules import CPU_RULES, SketchRule, derive_sketches
from .tensor_rules import BF16DotProduct

Sampler = Callable[[SearchTask, State, random.Random], Optional[State]]


@dataclass(frozen=True)
class SearchSpace:
    """Everything the search does differently for one kind of target."""

    name: str
    #: the built-in sketch rules, in the order they are tried on each stage
    rules: tuple[SketchRule, ...]
    #: one complete random program from a sketch (None if the draw was illegal)
    sample: Sampler
    #: the mutation rules evolution picks from, each weighted by its ``EvolutionParams`` probabilities
    mutators: tuple[Mutator, ...]
    #: a pure-Python check of the hardware limits, run on every mutated child (fast: thousands a round)
    fits: Callable[[SearchTask, State], bool]
    #: why a program must not be measured, or None: run on each program before it is proposed (~2 ms)
    check: Callable[[SearchTask, State], Optional[str]]


def replay_error(task: SearchTask, state: State) -> Optional[str]:
    """Why TVM cannot replay ``state``, or None: the cost model ranks States without TVM, so a program
    TensorIR would refuse can rank high, and a replay costs less than a failed build."""
    try:
        task.compute_dag.replay(state)
    except StepError as err:
        return str(err)
    return None


def no_limits(task: SearchTask, state: State) -> bool:
    """A CPU program has no block limits to break: what does not replay is caught before measurement."""
    return True


CPU = SearchSpace(
    name=CPU_DEVICE.name,
    rules=(BF16DotProduct(), *CPU_RULES),  # the bf16 rule passes on every stage of an fp32 program
    sample=sample_cpu_program,
    mutators=(
        Mutator("tile_size", mutate_tile_size, ("p_tile_size",)),
        Mutator("unroll", partial(mutate_unroll, choices=CPU_UNROLL_STEPS), ("p_unroll",)),
        Mutator("compute_location", mutate_compute_location, ("p_compute_location",)),
        Mutator("parallel", mutate_parallel, ("p_parallel",)),
        Mutator("layout_rewrite", mutate_layout_rewrite, ("p_layout_rewrite",)),
    ),
    fits=no_limits,
    check=replay_error,
)
#: Ansor's GPU search: compute locations are fixed by the sketch and loops are bound to threads, not
#: parallelized, so only tile sizes and unroll limits mutate; TVM's GPU verifier is the filter.
CUDA = SearchSpace(
    name=CUDA_DEVICE.name,
    rules=GPU_RULES,
    sample=sample_gpu_program,
    mutators=(
        Mutator("tile_size", partial(mutate_tile_size, thread_splits=True), ("p_tile_size",)),
        Mutator("unroll", partial(mutate_unroll, choices=GPU_UNROLL_STEPS), ("p_unroll", "p_compute_location")),
    ),
    fits=fits_gpu,
    check=verify_gpu,
)
SPACES: dict[str, SearchSpace] = {space.name: space for space in (CPU, CUDA)}


def space_of(target: tvm.target.Target) -> SearchSpace:
    """The search space of ``target``'s kind (:func:`ansor.target.device_kind`)."""
    return SPACES[device_kind(target).name]


def generate_sketches(task: SearchTask, rules: Optional[tuple[SketchRule, ...]] = None,
                      extra_rules: tuple[SketchRule, ...] = ()) -> list[State]:
    """All sketches of ``task``: each rule list walk from the last stage to the first.

    ``extra_rules`` run before the built-in ones (a user rule returning APPLY_AND_SKIP_REST replaces them
    for the stages it claims). The built-in rules are those of the target's search space.
    """
    if rules is None:
        rules = space_of(task.target).rules
    return derive_sketches(task, tuple(extra_rules) + tuple(rules))


def sample_initial_population(task: SearchTask, sketches: list[State], n: int, rng: random.Random,
                              exclude: Optional[set] = None) -> list[State]:
    """Up to ``n`` distinct random programs, spread over the sketches; ``exclude`` holds known keys.

    Gives up after ``8 n`` draws: some sketches rarely yield a legal program.
    """
    exclude = set() if exclude is None else exclude
    sample = space_of(task.target).sample
    out: list[State] = []
    seen: set = set()
    for _ in range(n * 8):
        if len(out) >= n:
            break
        state = sample(task, rng.choice(sketches), rng)
        if state is None:
            continue
        key = state.key()
        if key in seen or key in exclude:
            continue
        seen.add(key)
        out.append(state)
    return out
