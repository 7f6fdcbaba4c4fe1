"""The pure core: specs, catalogues, cost model, sub-stage graph, rollout engine model, scheduling interface.

Imports the standard library and numpy only (a test enforces it), so the simulator and the live runtime run the
same objects.
"""
