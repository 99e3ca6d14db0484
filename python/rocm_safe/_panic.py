"""No Rust panic reaches the caller as PyO3's ``PanicException``.

The native extension has no panicking paths by design (its errors are
values), but should one escape, PyO3 raises ``pyo3_runtime.PanicException``,
a ``BaseException`` that ``except Exception`` does not catch: a training
loop's error handling would not see it. Every public entry point of the
package (the functions in ``__all__``, the methods of ``safe_open`` and its
slices, the backward passes of the conv autograd functions) is wrapped by
:func:`guard`, which turns it into :class:`InternalError`, an ordinary
``RuntimeError`` naming what happened, with the panic chained.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterable


class InternalError(RuntimeError):
    """rocm_safe failed internally (a Rust panic crossed into Python).
    Nothing about the inputs is implied; please report it with the message."""


def _is_panic(e: BaseException) -> bool:
    t = type(e)
    return t.__name__ == "PanicException" and t.__module__ == "pyo3_runtime"


def guard(f: Callable) -> Callable:
    """``f``, with a panic of the native code turned into :class:`InternalError`."""
    if getattr(f, "__rocm_safe_guarded__", False):
        return f

    @functools.wraps(f)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except BaseException as e:
            if _is_panic(e):
                raise InternalError(
                    f"rocm_safe internal error in {getattr(f, '__qualname__', f)} (a panic of the native code;"
                    f" please report it): {e}"
                ) from e
            raise

    guarded.__rocm_safe_guarded__ = True  # type: ignore[attr-defined]
    return guarded


def guard_names(namespace: Dict[str, Any], names: Iterable[str]) -> None:
    """Replaces each function ``names`` of a module's ``namespace`` by its guard."""
    for name in names:
        value = namespace.get(name)
        if callable(value) and not isinstance(value, type):
            namespace[name] = guard(value)


def guard_methods(cls: type, names: Iterable[str]) -> None:
    """Replaces each plain method ``names`` of ``cls`` by its guard."""
    for name in names:
        setattr(cls, name, guard(getattr(cls, name)))
