"""Conversations: a final request and the earlier turns before it, as one value (value.py), and
the deterministic check that two conversations' earlier turns are the same but for what is
shown not to matter (context.py)."""
