"""CuPy's memory-hook protocol, written once.

CuPy calls every registered hook's ``<event>_preprocess`` before an action
and ``<event>_postprocess`` after it, the latter in a ``finally`` (with
``mem_ptr=0`` and ``pmem_id=0`` when the action failed).  pgmo reports its
own blocks the same way, so ``DebugPrintHook``, ``LineProfileHook`` and
users' hooks see every allocation.
"""

from __future__ import annotations

from typing import Any, Callable

from cupy.cuda import memory_hook as _memory_hook

__all__ = ["hooks_active", "thread_hooks", "call_hooks", "FreeReport"]

_get_memory_hooks = _memory_hook.get_memory_hooks
#: The calling thread's registered hooks (CuPy keeps one dict per thread).
thread_hooks = _get_memory_hooks


def hooks_active() -> bool:
    """Whether the calling thread has memory hooks registered now."""
    return bool(_get_memory_hooks())


def call_hooks(event: str, kwargs: dict[str, Any], action: Callable[[], Any] | None = None,
               result_kwargs: Callable[[Any], dict[str, Any]] | None = None) -> Any:
    """Run ``action`` between the pre- and post-hooks of ``event``; returns its result.

    ``result_kwargs(result)`` adds what the post-hooks learn from the result
    (``result`` is None when the action failed).
    """
    hooks = list(_get_memory_hooks().values())
    for hook in hooks:
        getattr(hook, f"{event}_preprocess")(**kwargs)
    result = None
    try:
        if action is not None:
            result = action()
        return result
    finally:
        post = {**kwargs, **(result_kwargs(result) if result_kwargs is not None else {})}
        for hook in hooks:
            getattr(hook, f"{event}_postprocess")(**post)


class FreeReport:
    """Reports one pgmo block's free to the hooks, in the freeing thread."""

    __slots__ = ("kwargs",)

    def __init__(self, device_id: int, mem_size: int, mem_ptr: int, pmem_id: int):
        self.kwargs = {"device_id": device_id, "mem_size": mem_size, "mem_ptr": mem_ptr,
                       "pmem_id": pmem_id}

    def __call__(self) -> None:
        if _get_memory_hooks():
            call_hooks("free", self.kwargs)
