"""The paged cache: the arena's pools, one kind per cache group, the prefix trie and index."""

from resin.cache.groups import KINDS, Kind
from resin.cache.manager import CacheManager, PageReservation
from resin.cache.matching import Match
from resin.cache.pool import OutOfPagesError, PagePool
from resin.cache.prefix_index import PrefixIndex
from resin.cache.trie import PrefixTrie

__all__ = [
    "KINDS",
    "CacheManager",
    "Kind",
    "Match",
    "OutOfPagesError",
    "PagePool",
    "PageReservation",
    "PrefixIndex",
    "PrefixTrie",
]
