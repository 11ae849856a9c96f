"""The cache's three status vocabularies, and the one place they are translated.

* :class:`CacheState`: what :func:`.cache.lookup` found for a key.
* :class:`VariantState`: what ``show-config`` says of a kernel variant.
* :class:`BuildOutcome`: what ``precompile`` did with one.

Each member is its own text (``CacheState.HIT == "hit"``), which the JSON output and
the log lines print.

>>> variant_state(CacheState.MISSING)
<VariantState.NOT_BUILT: 'not built'>
>>> str(BuildOutcome.CACHED)
'cached'
"""

from __future__ import annotations

import enum


class _Status(str, enum.Enum):
    """A status that is also its text (``str``, f-strings and JSON give the value)."""

    def __str__(self) -> str:
        return self.value


class CacheState(_Status):
    """A cache entry as :func:`.cache.lookup` finds it."""

    HIT = "hit"  # valid: load it
    MISSING = "missing"
    STALE = "stale"  # a source or header changed: rebuild quietly
    CORRUPT = "corrupt"  # rebuild, with a warning
    UNTRUSTED = "untrusted"  # another user could have written it: never loaded


class VariantState(_Status):
    """A registered kernel variant, as show-config reports it."""

    CACHED = "cached"  # valid in the writable cache
    PREBUILT = "prebuilt"  # served by a read-only cache
    NOT_BUILT = "not built"
    STALE = "stale"
    CORRUPT = "corrupt"
    UNTRUSTED = "untrusted"
    UNKNOWN = "unknown"  # its key cannot be computed here (no toolchain, no arch)


class BuildOutcome(_Status):
    """What building one variant ahead of time came to."""

    BUILT = "built"
    CACHED = "cached"  # a valid build was already there
    PREBUILT = "prebuilt"  # a read-only (prebuilt) cache serves it: nothing to build
    FAILED = "failed"


_VARIANT_STATE = {
    CacheState.HIT: VariantState.CACHED,
    CacheState.MISSING: VariantState.NOT_BUILT,
    CacheState.STALE: VariantState.STALE,
    CacheState.CORRUPT: VariantState.CORRUPT,
    CacheState.UNTRUSTED: VariantState.UNTRUSTED,
}


def variant_state(found: CacheState) -> VariantState:
    """How show-config names a variant whose writable-cache entry is ``found``."""
    return _VARIANT_STATE[found]
