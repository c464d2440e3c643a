"""The cache proper: the get-or-load core and its sync and async drivers, the entry table,
single-flight, counters, snapshots and settings. ``SemanticCache`` is the facade."""
