"""jigsaw-verl: JigsawRL pipeline multiplexing for verl recipes.

``jigsaw_verl.model`` is pure (stdlib + numpy); ``jigsaw_verl.sim`` simulates a GPU pool with the same objects.
Importing this package imports neither verl nor torch.
"""

__version__ = "0.1.0"
