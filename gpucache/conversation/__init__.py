"""Conversations: a final request and the earlier turns it may depend on (value.py), and the
deterministic check that two conversations' contexts agree on what the request depends on
(context.py)."""
