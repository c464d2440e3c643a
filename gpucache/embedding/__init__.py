"""Turning prompts into unit vectors: the ``Embedder`` protocol and the transformer embedder."""
