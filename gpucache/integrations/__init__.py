"""Adapters that plug gpucache into other frameworks; each needs that framework installed."""
