"""The last word on a candidate above the threshold: the ``HitVerifier`` protocol and the
lexical near-miss verifier. Pure Python, no torch: the same answer on every machine."""
