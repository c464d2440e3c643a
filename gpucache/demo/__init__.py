"""The main job (``gpucache demo``): a realistic workload replayed through a cache (replay.py),
answered by a stand-in model or by a small local one (local_model.py). Run by the command line,
never imported by the library itself."""
