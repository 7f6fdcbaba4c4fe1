"""jigsaw-verl: JigsawRL pipeline multiplexing for verl recipes.

Layers (each imports only those below it; ``tests/test_layering_on_cpu.py`` checks the arrows):

- ``model``: workload specs, catalogues, cost model, replica engine, sub-stage builders (pure);
- ``policy``: the scheduling interface, the registry and every policy (pure);
- ``pool``: the one mechanism plans are applied through: slot holds, pipeline progress, the snapshot builder, the
  timeline record (pure);
- ``sim`` (the simulated clock over the pool) and ``runtime`` (the live clock: Ray, no verl); ``report`` writes
  traces and plots of either;
- ``integration``: the only importer of verl, hydra, torch and TransferQueue (trainer modes, rollout migration,
  CPU backend); entry points ``cli`` and ``main_ppo``, and the import-swap module ``trainer``.

Importing this package imports neither verl nor torch.
"""

__version__ = "0.1.0"
