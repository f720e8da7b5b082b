"""What a target keeps by content: blobs received as a stream (``blob_stream``) and made durable without making a
push wait (``durability``), immutable revisions of hard links to them (``revisions``), the runs' Python environments
named by their inputs (``envs``), and the garbage collection of all of these and of old run folders (``gc``).
"""

# the modules the rest of the agent may import; the others are this room's own (tests/unit/test_layers.py)
__all__ = ["blob_stream", "envs", "gc", "revisions"]
