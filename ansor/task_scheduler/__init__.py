"""task_scheduler (see DESIGN.md)."""
