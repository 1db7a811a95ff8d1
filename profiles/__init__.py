"""spectool's data files: named deployment recipes (``*.yaml``) and GPU facts (``gpus/*.yaml``).

No code lives here; ``spectool.profiles`` (the module) loads and validates these files.
"""
