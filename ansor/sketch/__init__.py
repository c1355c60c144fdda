"""sketch (see DESIGN.md)."""
