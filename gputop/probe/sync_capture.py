"""The probe's counting of implicit CUDA syncs (the ``syncs`` hook), mixed into
torch_hooks.TorchHooks: torch's sync debug mode "warn" while a monitor is attached and CUDA is in
use; a wrapper of ``warnings._showwarnmsg`` counts (and hides) each sync warning at the Python
line that caused it; a wrapper of ``warnings._add_filter`` turns counting off on the caller's
thread *before* a filter that would make the sync warning an error goes in, so a sync can never
raise in the job. Its own module because the warnings plumbing is a concern of its own, with its
own lock and invariants (see ``_wrap_warnings``); the DataLoader, optimizer, autocast and
compile hooks stay in torch_hooks.py.

Needs from TorchHooks: ``probe``, ``torch``, ``skip_prefixes``, ``cuda_in_use`` and the sync
state set up in its ``__init__``. Imports: the standard library and gputop.probe only.
"""

from __future__ import annotations

import re
import sys
import threading
import warnings

from gputop.probe.core import SYNC_MESSAGE, _mono

# torch warns once per process, from set_sync_debug_mode itself, that the mode is a prototype:
# noise in the job's stderr when it is the probe that turned the mode on.
SYNC_PROTOTYPE_MESSAGE = "Synchronization debug mode is a prototype feature"
# Our "always" filter for the sync warning, as warnings.filterwarnings stores it (compared by value).
SYNC_FILTER = ("always", re.compile(SYNC_MESSAGE, re.I), UserWarning, None, 0)
ERROR_FILTER_WHY = ("the job turns warnings into errors (-W error or a filter): sync counting stays off so that "
                    "a sync can never raise in the job")


class SyncCapture:
    def after_fork_in_child(self) -> None:
        """A forked child inherits _sync_lock in whatever state the probe thread left it (that
        thread does not exist there): a fresh one, or an error filter added in the child could
        wait forever."""
        self._sync_lock = threading.RLock()
        self._error_filters_pending = 0
        self._enabling_thread = None

    def set_sync_capture(self, on: bool) -> None:
        """Turn counting of implicit syncs on or off (torch's sync debug mode 'warn', hidden).
        Any thread may call it; see _wrap_warnings for why the lock."""
        if on:
            self._capture_on()
        else:
            self._capture_off()

    def _capture_on(self) -> None:
        p = self.probe
        # Wrap first: from here on, an error filter added by any thread stops counting before
        # it goes in; the lock makes "check the filters, then turn on" one step against that.
        self._wrap_warnings()
        with self._sync_lock:
            if p.sync_capture:
                return
            if self._error_filters_pending or self._error_filter_present():
                p.set_hook("syncs", "off", ERROR_FILTER_WHY)
                return
            mode = self._torch_sync_mode()
            if mode is None:
                p.set_hook("syncs", "off", "the job has not used CUDA yet")
                return
            if mode != 0:
                p.set_hook("syncs", "off",
                           f"the job set torch.cuda.set_sync_debug_mode({mode}) itself: left alone, not counted")
                return
            self._put_sync_filter_first()
            self._we_set_sync_mode = True
            p.sync_capture = True
            p.sync_capture_since = _mono()
            # torch's one-time "prototype feature" warning, raised by this call on this thread,
            # is dropped by our _showwarnmsg wrapper (never catch_warnings() here: it would swap
            # the job's filter list and silence every warning of every thread while open).
            self._enabling_thread = threading.get_ident()
            try:
                self._set_torch_sync_mode(1)
            finally:
                self._enabling_thread = None
            p.set_hook("syncs", "on", "counts implicit device syncs per step (sync debug mode 'warn', hidden)")

    def _capture_off(self, why: str = "no monitor attached") -> None:
        p = self.probe
        with self._sync_lock:
            was_on = p.sync_capture
            try:
                # The mode goes back first: a sync after this no longer warns at all.
                if was_on and self._torch_sync_mode() == 1:
                    self._set_torch_sync_mode(0)
            finally:
                p.sync_capture = False
                p.sync_capture_since = None
                self._drop_sync_filter()
        if p.hooks.get("syncs", [""])[0] == "on":
            p.set_hook("syncs", "off", why)

    def _torch_sync_mode(self) -> int | None:
        """torch's (process-wide) sync debug mode; None while CUDA is not initialised, because
        reading it would initialise CUDA."""
        if not self.cuda_in_use():
            return None
        return int(self.torch.cuda.get_sync_debug_mode())

    def _set_torch_sync_mode(self, mode: int) -> None:
        self.torch.cuda.set_sync_debug_mode(mode)

    def _put_sync_filter_first(self) -> None:
        """Our "always" filter for the sync warning, first in the list (so Python does not show
        only the first per line, and no 'ignore' filter hides syncs from the count). Plain list
        operations, as _add_filter does them, so that it is safe under _sync_lock."""
        filters = warnings.filters
        try:
            filters.remove(SYNC_FILTER)
        except ValueError:
            pass
        filters.insert(0, SYNC_FILTER)
        warnings._filters_mutated()
        self._sync_filter = SYNC_FILTER

    def _drop_sync_filter(self) -> None:
        if self._sync_filter is None:
            return
        self._sync_filter = None
        try:
            warnings.filters.remove(SYNC_FILTER)
            warnings._filters_mutated()
        except (ValueError, AttributeError):
            pass

    def _wrap_warnings(self) -> None:
        """Two wrappers in the warnings module, installed once (on the first capture) and kept
        until uninstall(); with counting off they only pass through.

        ``warnings._showwarnmsg``: every warning that passes the filters reaches it (the C
        ``warn`` looks it up on the module each time). Sync warnings are counted and hidden;
        torch's "prototype feature" notice raised while this probe turns the mode on is dropped;
        everything else goes on unchanged. Unlike ``showwarning``, neither
        ``catch_warnings(record=True)`` nor ``logging.captureWarnings`` replaces it, so syncs
        in such blocks are still counted and never land in the job's recorded list.

        ``warnings._add_filter``: ``simplefilter``, ``filterwarnings`` and
        ``catch_warnings(action=...)`` all go through it. Before a filter that would turn the
        sync warning into an error goes in, counting is switched off on the caller's own thread,
        so the job's next sync cannot raise, and its warnings behave as without the probe."""
        p, hooks = self.probe, self
        if self._showwarnmsg is None:
            prev_show = warnings._showwarnmsg

            def _showwarnmsg(msg):
                try:
                    text = str(msg.message)
                    if text.startswith(SYNC_MESSAGE):
                        if p.sync_capture:
                            p.count_sync(msg.filename, msg.lineno, sys._getframe(1))
                            return None
                        if hooks._we_set_sync_mode and hooks._torch_sync_mode() == 0:
                            return None  # a straggler from our own capture, emitted just after it ended
                    elif hooks._enabling_thread == threading.get_ident() and text.startswith(SYNC_PROTOTYPE_MESSAGE):
                        return None
                except Exception as e:
                    p.hook_failed("syncs", e)
                return prev_show(msg)

            self._showwarnmsg = _showwarnmsg
            warnings._showwarnmsg = _showwarnmsg

            def undo_show():
                if warnings._showwarnmsg is _showwarnmsg:
                    warnings._showwarnmsg = prev_show
            self._undo.append(undo_show)
        if self._add_filter is None:
            prev_add = warnings._add_filter

            def _add_filter(*item, append):
                if not _errors_on_sync(item):
                    return prev_add(*item, append=append)
                with hooks._sync_lock:
                    hooks._error_filters_pending += 1   # counting cannot turn on until it is in
                    if p.sync_capture:
                        try:
                            hooks._capture_off("the job added a warnings filter that turns warnings into errors: "
                                               "sync counting stopped before it took effect (it resumes once the "
                                               "filter is gone)")
                        except Exception as e:
                            p.hook_failed("syncs", e)
                try:
                    return prev_add(*item, append=append)
                finally:
                    with hooks._sync_lock:
                        hooks._error_filters_pending -= 1

            self._add_filter = _add_filter
            warnings._add_filter = _add_filter

            def undo_add():
                if warnings._add_filter is _add_filter:
                    warnings._add_filter = prev_add
            self._undo.append(undo_add)

    def _check_sync_plumbing(self) -> None:
        """Each window while counting. The wrappers catch filters added through the warnings
        API at once; this catches the rest a second later: a filter put straight into
        ``warnings.filters`` that makes warnings errors (stop counting), a ``catch_warnings()``
        block that ended and took our filter with it (put it back in front), a
        ``warnings._showwarnmsg`` replaced by someone else (wrap it again)."""
        p = self.probe
        if self._error_filter_present():
            self._capture_off(ERROR_FILTER_WHY)
            return
        if warnings._showwarnmsg is not self._showwarnmsg:
            self._showwarnmsg = None
            self._wrap_warnings()
        if self._first_matching_filter() != SYNC_FILTER:
            with self._sync_lock:
                if p.sync_capture:
                    self._put_sync_filter_first()

    def _first_matching_filter(self):
        for f in warnings.filters:
            _action, msg_re, cat, _mod, _line = f
            if ((msg_re is None or msg_re.match(SYNC_MESSAGE)) and isinstance(cat, type)
                    and issubclass(UserWarning, cat)):
                return f
        return None

    def _error_filter_present(self) -> bool:
        return any(_errors_on_sync(f) for f in list(warnings.filters))


def _errors_on_sync(f) -> bool:
    """Would this warnings filter turn torch's sync warning into an exception? (Its module and
    line are not checked: a sync can happen anywhere.) Never raises: a filter of a shape we do
    not know counts as one that would."""
    try:
        action, msg_re, cat, _mod, _line = f
        return (action == "error" and (msg_re is None or msg_re.match(SYNC_MESSAGE) is not None)
                and isinstance(cat, type) and issubclass(UserWarning, cat))
    except Exception:
        return True
