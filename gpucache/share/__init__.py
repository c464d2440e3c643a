"""Replicas sharing entries through Redis or Valkey (redis.py); needs the ``share`` extra."""
