"""The search: sketch rules derive loop-nest sketches, random annotation fills them, evolution refines them
(docs/design.md)."""
