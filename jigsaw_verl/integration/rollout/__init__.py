"""Rollout migration on verl's rollout path (backend-neutral: talks to verl's load balancer and replica servers)."""
