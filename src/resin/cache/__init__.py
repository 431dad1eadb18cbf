"""The paged cache: one flat page arena (pool), per-group allocators, and the prefix trie."""

from resin.cache.groups import GroupTables
from resin.cache.pool import OutOfPagesError, PagePool

__all__ = ["GroupTables", "OutOfPagesError", "PagePool"]
