"""Replicas sharing entries through Redis or Valkey: ``RedisShare`` (redis.py), over the record
format (records.py), the link (link.py) and the writing and tailing threads (writer.py,
tail.py); needs the ``share`` extra. ``ReplicationSettings`` (settings.py) imports without it."""
