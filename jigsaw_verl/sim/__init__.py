"""Discrete-event simulation of several RL pipelines on one GPU pool (imports core only, never verl/torch/ray)."""
