"""``gpucache bench``: the GPU-against-CPU benchmark a user runs on the machine they have.

It measures the embedder (beside sentence-transformers), the similarity scan per storage mode
and size (beside FAISS), ``get_or_put_all`` end to end and one lookup at a time, on the CPU and
on CUDA where present, in one run, and writes Markdown, JSON and a PNG plot stating the commit,
versions, precision, threads and machine as run. It chooses the sizes that fit the machine's
memory and the time it was given, and says what it left out and why.

The parts: ``runner`` (one run, device by device), ``sizing`` (what fits: memory and time),
``scan``, ``embedding`` and ``lookups`` (the cells), ``timing`` (how a call is timed),
``machine`` (what the machine is and can do), ``report`` (the three files).

FAISS, sentence-transformers and matplotlib are optional peers (``pip install
'gpucache[bench]'``): without them their columns and the plot are left out, and the report
says so.
"""
