"""Task scheduling: one trial budget over many tasks (see :mod:`ansor.task_scheduler.task_scheduler`)."""

from .task_scheduler import Allocator, SchedulerRound, TaskState, schedule_tasks, unseeded_tasks

__all__ = ["Allocator", "SchedulerRound", "TaskState", "schedule_tasks", "unseeded_tasks"]
