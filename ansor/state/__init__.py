"""A program as data: the ComputeDAG of a PrimFunc, loop states made of frozen transform steps, and their
replay onto TVM's schedule (the layer every other one stands on; see docs/design.md)."""
