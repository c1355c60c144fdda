"""networks (see DESIGN.md)."""
