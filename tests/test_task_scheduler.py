"""The gradient task scheduler's decisions, on synthetic latency curves (no measurement needed)."""

import pytest

from ansor.task_scheduler import Allocator, TaskState, unseeded_tasks


def simulate(alloc: Allocator, curves, rounds: int, trials_per_round: int = 16) -> list[int]:
    """Run ``rounds`` rounds; task i's best latency after r of its rounds is ``curves[i](r)``."""
    picks = []
    for _ in range(rounds):
        i = alloc.next_task()
        if i is None:
            break
        picks.append(i)
        alloc.record(i, trials_per_round, curves[i](alloc.tasks[i].rounds + 1))
    return picks


def test_warm_up_visits_every_task_once_first():
    alloc = Allocator([TaskState(1, 1e9) for _ in range(4)])
    assert simulate(alloc, [lambda r: 1.0] * 4, 4) == [0, 1, 2, 3]


def test_largest_weighted_gain_gets_the_trials():
    # Same curves, but task 1 occurs 10 times in the network: its gains count ten times as much.
    falling = lambda r: 1.0 / r  # noqa: E731
    alloc = Allocator([TaskState(1, 1e9), TaskState(10, 1e9), TaskState(1, 1e9)])
    picks = simulate(alloc, [falling] * 3, 20)
    assert picks.count(1) > picks.count(0) + picks.count(2)


def test_task_dominating_the_objective_gets_the_trials():
    # Equal weights, but task 0 is ten times slower: improving it moves the total most.
    slow = lambda r: 10.0 / r  # noqa: E731
    fast = lambda r: 1.0 / r  # noqa: E731
    alloc = Allocator([TaskState(1, 1e9), TaskState(1, 1e9)])
    picks = simulate(alloc, [slow, fast], 20)
    assert picks[2:].count(0) > 2 * picks[2:].count(1)


def test_recent_progress_breaks_ties():
    # Same latency now; task 1 got there by improving over its last rounds (backward gradient).
    alloc = Allocator([TaskState(1, 1e9), TaskState(1, 1e9)])
    for cost in (1.0, 1.0, 1.0, 1.0):
        alloc.record(0, 16, cost)
    for cost in (1.6, 1.4, 1.2, 1.0):
        alloc.record(1, 16, cost)
    grads = alloc.gradients()
    assert grads[1] < grads[0] and alloc.next_task() == 1


def test_flat_task_stops_with_early_stopping():
    flat = lambda r: 1.0  # noqa: E731
    alloc = Allocator([TaskState(1, 1e9), TaskState(1, 1e9)], early_stopping=32)
    picks = simulate(alloc, [flat, flat], 50)
    assert alloc.tasks[0].dead and alloc.tasks[1].dead
    assert alloc.next_task() is None
    assert len(picks) == 6  # one round to set the baseline, two more without gain, for each task


def test_a_plateaued_task_yields_its_rounds_to_one_still_improving():
    # Task 0 is ten times the objective but never improves after its first round; task 1 keeps improving.
    flat = lambda r: 1.0  # noqa: E731
    improving = lambda r: 0.1 * 0.95 ** r  # noqa: E731
    picks = {}
    for half_life in (None, 128):
        alloc = Allocator([TaskState(10, 1e9), TaskState(1, 1e9)], stall_half_life=half_life)
        picks[half_life] = simulate(alloc, [flat, improving], 60).count(1)
        assert alloc.tasks[0].stalled_trials == alloc.tasks[0].trials - 16
    assert picks[None] <= 2 and picks[128] >= 10


def test_a_task_without_seeds_is_searched_once_before_the_gradient_decides_unless_none_has_seeds():
    # Task 0 dominates the objective and keeps improving: the gradient alone gives it every round. Its
    # warm-up measured its default and 3 seeds; task 1 (a small transpose) only its default.
    picks = {}
    for unseeded in (True, False):  # False: a cold start, where no task has seeds
        alloc = Allocator([TaskState(12, 1e9), TaskState(12, 1e9, unseeded=unseeded)])
        alloc.record(0, 4, 1.5)
        alloc.record(1, 1, 0.05)
        assert alloc.gradients()[0] < alloc.gradients()[1]
        picks[unseeded] = simulate(alloc, [lambda r: 1.5 / r, lambda r: 0.0125], 4)
    assert picks[True] == [1, 0, 0, 0] and picks[False] == [0, 0, 0, 0]


def test_seedless_tasks_are_searched_first_only_where_seeds_cover_most_of_the_network():
    # Warm-up sizes: 1 = the default schedule alone, 4 = the default and 3 seeds.
    assert unseeded_tasks([4, 1, 4, 4]) == [False, True, False, False]  # ViT-B/16: 4 of 14 without seeds
    assert unseeded_tasks([1, 1, 1, 1]) == [False] * 4  # a cold start
    assert unseeded_tasks([4, 1, 1, 4]) == [False] * 4  # DenseNet-121: 72 of 142 without seeds
    assert unseeded_tasks([]) == []


def test_round_robin_cycles():
    alloc = Allocator([TaskState(1, 1e9) for _ in range(3)], strategy="round-robin")
    assert simulate(alloc, [lambda r: 1.0 / r] * 3, 9) == [0, 1, 2, 0, 1, 2, 0, 1, 2]


def test_objective_is_weighted_sum_and_bad_strategy_is_rejected():
    alloc = Allocator([TaskState(2, 1e9), TaskState(3, 1e9)])
    alloc.record(0, 16, 0.5)
    alloc.record(1, 16, 0.25)
    assert alloc.objective() == pytest.approx(2 * 0.5 + 3 * 0.25)
    with pytest.raises(ValueError, match="round-robin"):
        Allocator([], strategy="greedy")
