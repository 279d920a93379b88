"""Where the training loop calls a library function, from py-spy's stacks of its main thread.

A verdict that names a call the job should not make (``torch.cuda.empty_cache()`` every step)
points at the line that makes it: the frame just outside the function's own, in the samples
taken inside it. Where that frame is itself a library's (accelerate's ``clear_device_cache``,
called by transformers' Trainer), the next frame out says whose code asked for it. The samples
are read as the stack source wrote them; malformed parts (a damaged or hostile recording) are
skipped.

Measured on an H100 (fourth session of 2026-12-07): the main thread was inside
``empty_cache()`` in 11-36% of its samples on five jobs calling it every step (the call first
waits for the GPU's queued work), so a 10 s window holds dozens of them.
"""

from __future__ import annotations

import os
from collections import Counter

from gputop.catalogue import KIND_STACKS
from gputop.derive.moments import main_thread
from gputop.derive.thread_samples import window_weight

LIBRARY_DIRS = ("site-packages", "dist-packages")


def _frame(entry) -> tuple[str, str, int] | None:
    if isinstance(entry, list) and len(entry) >= 3 and isinstance(entry[0], str) and isinstance(entry[1], str) \
            and type(entry[2]) is int:
        return entry[0], entry[1], entry[2]
    return None


def _named(f: tuple[str, str, int]) -> str:
    return f"{f[0]} ({os.path.basename(f[1])}:{f[2]})"


def call_site(store, since: float, func: str, file_suffix: str, pid: str | None = None) -> dict | None:
    """The main thread's most sampled caller of ``func`` (a frame whose file ends with
    ``file_suffix``) in the stacks windows since ``since``: ``{"where": "fn (file.py:47)", "via":
    the next frame out where the caller is a library's, else None, "share": the main thread's
    samples inside the call}``; None where no sample caught it. ``pid``: one rank's process, else
    the target's main process."""
    calls: Counter = Counter()
    total = 0
    for key, samples in store.window(KIND_STACKS, since).items():
        if pid is not None and key != pid:
            continue
        for s in samples:
            data = s.data
            if pid is None and data.get("main") is not True:
                continue
            frames, th = data.get("frames"), main_thread(data, key)
            if not isinstance(frames, list) or th is None or not isinstance(th.get("stacks"), list):
                continue
            weight = window_weight(data)
            for item in th["stacks"]:
                if not (isinstance(item, list) and len(item) == 2 and type(item[0]) is int and item[0] > 0
                        and isinstance(item[1], list)):
                    continue
                n, idx = item[0] * weight, item[1]
                total += n
                stack = [_frame(frames[i]) if type(i) is int and 0 <= i < len(frames) else None for i in idx]
                for j, f in enumerate(stack):
                    if f is not None and f[0] == func and f[1].endswith(file_suffix) and j > 0 \
                            and stack[j - 1] is not None:
                        caller = stack[j - 1]
                        outer = stack[j - 2] if j > 1 else None
                        via = outer if outer is not None and any(d in caller[1] for d in LIBRARY_DIRS) else None
                        calls[(caller, via)] += n
                        break
    if not calls or total <= 0:
        return None
    (caller, via), n = calls.most_common(1)[0]
    return {"where": _named(caller), "via": _named(via) if via else None,
            "share": round(sum(calls.values()) / total, 4)}
