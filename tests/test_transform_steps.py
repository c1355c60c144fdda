"""Steps as plain data: JSON round trips, malformed input, the error hierarchy, and the step registry."""

from dataclasses import fields

import pytest

from ansor import AnsorError, StepError
from ansor.task.search_task import SearchTask
from ansor.state.transform_steps import (
    STEP_TYPES, AnnotationStep, CacheReadStep, CacheWriteStep, ComputeAtStep, ComputeInlineStep,
    ComputeRootStep, FollowFusedSplitStep, FollowSplitStep, FuseStep, LayoutRewriteStep, PragmaStep, ReorderStep,
    RfactorStep, SplitStep, Step, StorageAlignStep, TensorizeStep, step_from_json, step_to_json,
)

ONE_OF_EACH = [
    SplitStep(0, 1, 512, (4, None, 8), True),
    FollowSplitStep(1, 0, 0, 2),
    FollowFusedSplitStep(1, 2, (0, 3), 1, False),
    ReorderStep(0, (1, 0, 2)),
    FuseStep(0, (0, 1)),
    AnnotationStep(0, 0, "parallel"),
    PragmaStep(0, 0, "auto_unroll_max_step$64"),
    StorageAlignStep(2, 1, 16, 1),
    ComputeAtStep(1, 0, 3),
    ComputeInlineStep(3),
    ComputeRootStep(2),
    CacheReadStep(1, "A", "shared", (1, 2)),
    CacheWriteStep(0, "local"),
    RfactorStep(0, 2, 1),
    LayoutRewriteStep(0, "B"),
    TensorizeStep(2, 7, "ansor_avx512bf16_dot_16x2"),
]


def test_every_tag_has_a_step():
    assert sorted(STEP_TYPES) == sorted(
        ["SP", "FSP", "FFSP", "RE", "FU", "AN", "PR", "SA", "CA", "CI", "CR", "CHR", "CHW", "RF", "LR", "TZ"])
    assert {type(s).TAG for s in ONE_OF_EACH} == set(STEP_TYPES)


#: The interpreters of a step list: the State, the TensorIR schedule, the readable code.
INTERPRETERS = ("apply_to_state", "apply_to_schedule", "to_code")
#: Field types the JSON codec reads (``step_from_json``).
CODEC_TYPES = {"int", "Optional[int]", "bool", "str", "tuple[int, ...]", "tuple[Optional[int], ...]"}


@pytest.mark.parametrize("tag", sorted(STEP_TYPES))
def test_every_tag_has_every_handler(tag):
    """A new step must say what it means to each interpreter and use only field types the codec reads."""
    cls = STEP_TYPES[tag]
    assert cls.TAG == tag
    missing = [name for name in INTERPRETERS if getattr(cls, name) is getattr(Step, name)]
    assert not missing, f"{tag} lacks {missing}"
    kinds = {f.name: cls.__annotations__[f.name] for f in fields(cls)}
    assert kinds and set(kinds.values()) <= CODEC_TYPES, f"{tag} has fields the JSON codec cannot read: {kinds}"
    assert list(kinds)[0] == "stage_id"


@pytest.mark.parametrize("step", ONE_OF_EACH, ids=lambda s: s.TAG)
def test_json_round_trip(step):
    data = step_to_json(step)
    assert data[0] == step.TAG
    assert step_from_json(data) == step


def test_split_json_shape_matches_ansor():
    assert step_to_json(SplitStep(0, 1, 512, (4, None, 8), True)) == ["SP", 0, 1, 512, [4, None, 8], 1]


@pytest.mark.parametrize("bad", [["XX", 1], [], "SP", ["SP", 0, 1], ["CA", "a", 0, 1], ["TZ", 0, 1, "no_such_intrin"]])
def test_malformed_json_raises_step_error(bad):
    with pytest.raises(StepError):
        step_from_json(bad)


def test_errors_share_one_base_class_and_name_the_problem():
    state = SearchTask.from_workload("matmul-64").compute_dag.init_state()
    with pytest.raises(AnsorError, match=r"stage 5 does not exist .*1 stages: C"):
        state.split(5, 0, [4])
    with pytest.raises(StepError, match=r"stage 0 \(C\) has no iterator 7 .*i, j, k"):
        state.annotate(0, 7, "parallel")
    with pytest.raises(StepError, match="unknown annotation 'sideways'"):
        state.annotate(0, 0, "sideways")
    with pytest.raises(StepError, match="permutation"):
        state.reorder(0, [0, 0, 1])
    with pytest.raises(StepError, match="consecutive"):
        state.fuse(0, [0, 2])
    with pytest.raises(StepError, match="bad pragma"):
        state.pragma(0, 0, "unroll_all$x")
    with pytest.raises(StepError, match="reduction and cannot be inlined"):
        state.compute_inline(0)
    assert state.steps == []  # rejected steps leave no trace
