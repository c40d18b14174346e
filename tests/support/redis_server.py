"""The tests' name for :mod:`llamad.testing.redis_server` (the bench starts one too)."""

from llamad.testing.redis_server import REDIS_SERVER, RedisServer, redis_available

__all__ = ["REDIS_SERVER", "RedisServer", "redis_available"]
