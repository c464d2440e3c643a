"""Benchmarks, the false-hit evaluation, the demo and plotting: run by the command line, never
imported by the library itself."""
