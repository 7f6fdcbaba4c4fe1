"""Live pipeline multiplexing: several verl pipelines share one pool under the JigsawRL scheduler.

- :mod:`.executor`: the live executor around a core policy (no Ray): snapshots in, lease grants out.
- :mod:`.pipeline_spec`: a verl config as the core :class:`~jigsaw_verl.core.spec.PipelineSpec` the policy plans.
- :mod:`.scheduler`: the named, detached Ray actor per ``jigsaw.mux.group`` that owns the pool.
- :mod:`.launcher`: ``jigsaw-verl mux RECIPE.sh ...``.
"""
