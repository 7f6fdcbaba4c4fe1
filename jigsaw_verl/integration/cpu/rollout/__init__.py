"""The CPU rollout backend: a continuous-batching transformers engine served like verl's vLLM server."""
