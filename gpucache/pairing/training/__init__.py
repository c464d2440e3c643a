"""How the pair model is trained: the pairs it learns from (pairs.py, edits.py) and the loop that
fits it and writes the shipped weights (fit.py; ``python -m gpucache.pairing.training``)."""
