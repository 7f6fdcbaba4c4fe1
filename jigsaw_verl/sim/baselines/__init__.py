"""Baseline policies: what verl users and the peer systems do with several RL jobs on one pool."""
