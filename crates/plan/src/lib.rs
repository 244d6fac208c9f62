//! Mesh and sharding planner: chooses mesh shapes and per-parameter partition specs and predicts memory.
