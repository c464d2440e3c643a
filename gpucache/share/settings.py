"""``ReplicationSettings``: whether and how replicas share entries. Importing this module needs
no Redis client; ``build`` does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpucache.fields import setting


@dataclass(frozen=True)
class ReplicationSettings:
    redis: str | None = setting(
        None, "a Redis or Valkey URL: replicas share their entries through it (none: this process only)"
    )
    redis_prefix: str = setting("gpucache", "the prefix of every key this deployment writes in Redis")
    replay_window: float = setting(
        300.0, "seconds a signed event's time may differ from its place in the shared log; outside "
        "it the event is refused as a replay"
    )

    def __post_init__(self) -> None:
        if self.redis is not None and not self.redis.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis must be a redis://, rediss:// or unix:// URL, got {self.redis!r}")
        if isinstance(self.replay_window, bool) or not isinstance(self.replay_window, (int, float)) \
                or not self.replay_window > 0:
            raise ValueError(f"replay_window must be > 0 seconds, got {self.replay_window!r}")
        if not self.redis_prefix or any(c.isspace() for c in self.redis_prefix):
            raise ValueError(f"redis_prefix must be a non-empty word, got {self.redis_prefix!r}")

    def build(self, secret: bytes) -> Any:
        """The ``RedisShare`` these settings name, its records signed with ``secret``; None when
        no Redis is named."""
        if self.redis is None:
            return None
        from gpucache.share.redis import RedisShare

        return RedisShare(self.redis, prefix=self.redis_prefix, secret=secret,
                          replay_window=float(self.replay_window))
