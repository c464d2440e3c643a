"""The exact-scan index: stored rows, their storage codecs, the chunked scan and its top-k.

It is mechanism only: it holds vectors and answers searches, and never decides what to keep."""
