"""``cache_once``: a thread-safe in-process memo for module builders (functools.lru_cache
breaks torch.compile). The disk cache of built modules is :mod:`.cache`."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_MISSING = object()
_KWARGS = object()  # separates positional from keyword arguments in a key


def cache_once(fn: F) -> F:
    """Memoises ``fn`` on its arguments; concurrent first calls run ``fn`` once.

    Arguments are told apart by type too (``1``, ``1.0`` and ``True`` are equal keys
    to a dict, but make_cpp_args spells them as three C++ values: three modules). A
    hit is one dict lookup (no lock). On a miss, callers with the same key
    wait for one of them to compute the value; an exception is not cached, so
    a later call retries. The wrapper has ``cache_clear()`` and ``uncached``
    (the original function).

    >>> calls = []
    >>> @cache_once
    ... def square(x):
    ...     calls.append(x)
    ...     return x * x
    >>> square(3), square(3), calls
    (9, 9, [3])
    >>> square(3.0), calls
    (9.0, [3, 3.0])
    """
    cache: dict[Any, Any] = {}
    key_locks: dict[Any, threading.Lock] = {}
    guard = threading.Lock()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            named = sorted(kwargs.items())
            key = (*args, _KWARGS, *named, *map(type, args), *(type(v) for _, v in named))
        else:
            key = (*args, *map(type, args))
        try:
            value = cache.get(key, _MISSING)
        except TypeError:
            raise TypeError(
                f"{fn.__qualname__}: cache_once needs hashable arguments, got {args!r} {kwargs!r}"
            ) from None
        if value is not _MISSING:
            return value
        with guard:
            key_lock = key_locks.setdefault(key, threading.Lock())
        with key_lock:
            value = cache.get(key, _MISSING)
            if value is _MISSING:
                value = fn(*args, **kwargs)
                cache[key] = value
        return value

    def cache_clear() -> None:
        with guard:
            cache.clear()
            key_locks.clear()

    wrapper.cache_clear = cache_clear  # type: ignore[attr-defined]
    wrapper.uncached = fn  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
