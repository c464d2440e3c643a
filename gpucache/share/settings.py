"""``ReplicationSettings``: whether and how replicas share entries. Importing this module needs
no Redis client; ``build`` does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpucache.fields import setting, without_password


@dataclass(frozen=True)
class ReplicationSettings:
    redis: str | None = setting(
        None,
        "a Redis or Valkey URL: replicas share their entries through it (none: this process only)",
        repr=False,  # it may carry a password: gpucache info shows it through fields.without_password
    )
    redis_prefix: str = setting("gpucache", "the prefix of every key this deployment writes in Redis")
    replay_window: float = setting(
        300.0,
        "seconds a signed event's time may differ from its place in the shared log; outside "
        "it the event is refused as a replay",
    )
    redis_stream_maxlen: int = setting(
        100_000,
        "events the shared log keeps (approximately); a replica away for longer reads every "
        "record again when it returns",
    )
    redis_deadline: float = setting(
        0.5, "seconds a replica waits on Redis for one command before it counts Redis as away"
    )
    redis_pending_max: int = setting(
        10_000,
        "events waiting to be written to Redis at most; past it the oldest stay in this "
        "replica only (counted as dropped)",
    )
    claim_wait: float = setting(
        30.0, "seconds a miss another replica is loading is waited for before this one loads it too"
    )
    claim_ttl: float = setting(
        120.0, "seconds a replica's claim on a miss it loads lasts, should it die while loading"
    )

    def __post_init__(self) -> None:
        if self.redis is not None and not self.redis.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"redis must be a redis://, rediss:// or unix:// URL, got {without_password(self.redis)!r}"
            )
        if (
            isinstance(self.replay_window, bool)
            or not isinstance(self.replay_window, (int, float))
            or not self.replay_window > 0
        ):
            raise ValueError(f"replay_window must be > 0 seconds, got {self.replay_window!r}")
        if not self.redis_prefix or any(c.isspace() for c in self.redis_prefix):
            raise ValueError(f"redis_prefix must be a non-empty word, got {self.redis_prefix!r}")
        for name in ("redis_stream_maxlen", "redis_pending_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("redis_deadline", "claim_wait", "claim_ttl"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")

    def build(self, secret: bytes) -> Any:
        """The ``RedisShare`` these settings name, its records signed with ``secret``; None when
        no Redis is named."""
        if self.redis is None:
            return None
        from gpucache.share.redis import RedisShare

        return RedisShare(
            self.redis,
            prefix=self.redis_prefix,
            secret=secret,
            replay_window=float(self.replay_window),
            maxlen=self.redis_stream_maxlen,
            deadline=float(self.redis_deadline),
            pending_max=self.redis_pending_max,
            claim_wait=float(self.claim_wait),
            claim_ttl=float(self.claim_ttl),
        )
