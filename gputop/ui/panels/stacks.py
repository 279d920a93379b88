"""Python stacks: what each thread does (state bars), DataLoader workers, and hot frames.

Everything here is drawn from ``thread_state`` samples (gputop.derive.threads, recomputed on
replay) and the raw ``stacks`` samples, so a replay shows the same as the live session did.
"""

from __future__ import annotations

from rich.text import Text

from gputop.derive.threads import DEFAULT_HORIZON_S, KIND_THREAD_STATE, STATES, hot_frames, states_since
from gputop.derive.threads import METRICS as THREAD_METRICS
from gputop.sources.stacks import KIND_STACKS, SOURCE_NAME
from gputop.ui import fmt
from gputop.ui.panels import TextPanel, register_panel, register_view
from gputop.ui.snapshot import Snapshot

register_view("stacks", "Stacks", order=45, short="Stk")

STALE_S = 15.0  # a thread not in the last processor run for this long is gone

# One look per state: a character (readable without colour) and a colour.
STATE_LOOK = {
    "running": ("█", "green"), "gil": ("G", "bold red"), "data": ("D", "bold magenta"),
    "cuda": ("C", "bold yellow"), "collective": ("N", "bold cyan"), "idle": ("·", "bright_black"),
    "cpu_wait": ("w", "red"), "unknown": ("?", "white"),
}
SHORT = {"running": "run", "gil": "GIL", "data": "data", "cuda": "sync", "collective": "coll",
         "idle": "idle", "cpu_wait": "cpu-wait", "unknown": "unknown"}
ROLE_SHORT = {"main": "main", "thread": "thread", "dataloader_worker": "worker", "child": "child"}


def sampler_line(snap: Snapshot) -> Text:
    """One line on the stack sampler: its rate and health, or what is wrong and what to do."""
    h = snap.health().get(SOURCE_NAME)
    t = Text()
    if h is None:
        t.append("stacks: no stack sampler in this session", style="dim")
        return t
    state, msg = h.get("state"), h.get("message") or ""
    if state in ("failed", "off"):
        t.append(f"stacks {state}: ", style="bold red" if state == "failed" else "yellow")
        t.append(fmt.clean(msg))
        return t
    rate, req = h.get("rate_hz"), h.get("rate_requested_hz")
    t.append("py-spy ", style="bold")
    t.append(f"{fmt.num(rate, ' Hz', 1)} of {fmt.num(req, ' Hz')}")
    if h.get("calm"):
        t.append(" (calm)", style="dim")
    if h.get("restarts"):
        t.append(f" · {h.get('restarts')} restarts", style="yellow")
    t.append(f" · kernel {fmt.num(h.get('kernel_rate_hz'), ' Hz')}")
    t.append(" · GIL " + ("measured" if h.get("gil_known") else "unknown"))
    cost = [c for c in (h.get("pyspy_cpu_pct"), h.get("sampler_cpu_pct")) if c is not None]
    if cost:
        t.append(f" · cost {sum(cost):.1f}% CPU")
    if state == "degraded" and msg:
        t.append(" · " + fmt.clean(msg), style="yellow")
    return t


def current_states(snap: Snapshot) -> list[dict]:
    """The newest thread_state of every thread still being seen, in the processor's order
    (main thread first, then other threads of the main process, workers, children)."""
    rows = [s for s in snap.latest_of_kind(KIND_THREAD_STATE).values() if snap.now - s.t <= STALE_S]
    if not rows:
        return []
    newest = max(s.t for s in rows)
    rows = [s for s in rows if newest - s.t <= 2.5]  # the last processor run
    rank = {"main": 0, "thread": 1, "dataloader_worker": 2, "child": 3}
    rows.sort(key=lambda s: (rank.get(s.data.get("role"), 4), not s.data.get("python"),
                             (s.data.get("idle_pct") or 0.0), str(s.data.get("tid"))))
    return [s.data for s in rows]


def state_bar(d: dict, width: int) -> Text:
    """A bar of ``width`` cells split by state shares (largest remainder rounding)."""
    shares = [(s, (d.get(f"{s}_pct") or 0.0)) for s in STATES]
    total = sum(v for _, v in shares)
    t = Text()
    if total <= 0:
        return t.append(" " * width)
    exact = [(s, v / total * width) for s, v in shares]
    cells = {s: int(x) for s, x in exact}
    left = width - sum(cells.values())
    for s, x in sorted(exact, key=lambda e: e[1] - int(e[1]), reverse=True)[:left]:
        cells[s] += 1
    for s in STATES:
        ch, style = STATE_LOOK[s]
        if cells[s]:
            t.append(ch * cells[s], style=style)
    return t


def top_states(d: dict, n: int = 3) -> str:
    known = [(s, d.get(f"{s}_pct")) for s in STATES if d.get(f"{s}_pct") is not None]
    known = [(s, v) for s, v in known if v >= 1.0]
    known.sort(key=lambda e: -e[1])
    return " ".join(f"{SHORT[s]} {v:.0f}%" for s, v in known[:n])


def legend() -> Text:
    t = Text()
    for s in STATES:
        ch, style = STATE_LOOK[s]
        t.append(ch, style=style)
        t.append(f" {SHORT[s]}  ")
    return t


@register_panel
class ThreadStatesPanel(TextPanel):
    VIEW = "threads"
    ORDER = 10
    NEEDS = (KIND_THREAD_STATE,)
    TITLE_OF = "What each thread does (last {:g} s; click a thread to see its hot frames in Stacks)"
    TITLE = TITLE_OF.format(DEFAULT_HORIZON_S)
    METRICS = THREAD_METRICS

    def shown(self, snap: Snapshot) -> bool:
        return KIND_THREAD_STATE in snap.kinds or SOURCE_NAME in snap.health()

    def draw(self, snap: Snapshot, width: int) -> Text:
        # the look the thread states are over now (30 s while calm, longer while py-spy's next
        # window is late, shorter early in a phase: derive/threads.states_since, as the processor reads it)
        title = self.TITLE_OF.format(round(snap.now - states_since(snap.store, snap.now, DEFAULT_HORIZON_S)))
        if self.border_title != title:
            self.border_title = title
        out = Text()
        out.append_text(sampler_line(snap))
        rows = current_states(snap)
        self._row_keys: list[tuple[int, object]] = []
        if not rows:
            out.append("\nno thread states yet (they need a few seconds of samples)", style="dim")
            return out
        out.append("\n")
        out.append_text(legend())
        name_w = 18
        bar_w = max(10, min(40, width - name_w - 7 - 34))
        for d in rows:
            out.append("\n")
            role = ROLE_SHORT.get(d.get("role"), "")
            name = d.get("name") or str(d.get("tid"))
            if d.get("role") in ("dataloader_worker", "child"):
                name = f"{d.get('pid')} {name}"  # which process: workers all have a MainThread
            name = fmt.clip(fmt.clean(name), name_w - 1)
            style = "bold" if d.get("role") == "main" else ""
            out.append(f"{name:<{name_w}}", style=style)
            out.append(f"{role:<7}", style="dim")
            out.append_text(state_bar(d, bar_w))
            out.append(" " + top_states(d))
            if not d.get("python"):
                out.append(f" (native, CPU {fmt.pct(d.get('cpu_pct'))})", style="dim")
            self._row_keys.append((d["pid"], d["tid"]))
        main = next((d for d in rows if d.get("role") == "main"), None)
        if main is not None and main.get("where"):
            out.append("\nmain thread is mostly at: ", style="dim")
            out.append(fmt.clip(fmt.clean(main["where"]), max(10, width - 27)))
        return out

    def on_click(self, event) -> None:
        """Clicking a thread's row shows its hot frames in the Stacks view."""
        keys = getattr(self, "_row_keys", [])
        at = event.get_content_offset(self)
        if at is None:
            return
        i = at.y - 2  # sampler line, legend line, then one line per thread
        if 0 <= i < len(keys):
            for panel in self.app.query(HotFramesPanel):
                panel.select(keys[i])


@register_panel
class DataLoaderWorkersPanel(TextPanel):
    VIEW = "threads"
    ORDER = 15
    NEEDS = (KIND_THREAD_STATE,)
    TITLE = "DataLoader workers (CPU: 100% = one core)"

    def shown(self, snap: Snapshot) -> bool:
        return any(d.get("role") == "dataloader_worker" for d in current_states(snap))

    def draw(self, snap: Snapshot, width: int) -> Text:
        workers = [d for d in current_states(snap) if d.get("role") == "dataloader_worker" and d["tid"] == d["pid"]]
        out = Text()
        busy = [d.get("cpu_pct") for d in workers if d.get("cpu_pct") is not None]
        out.append(f"{len(workers)} workers", style="bold")
        if busy:
            out.append(f" · CPU mean {sum(busy) / len(busy):.0f}% · min {min(busy):.0f}% · max {max(busy):.0f}%")
        for d in workers:
            out.append(f"\n PID {d['pid']:<8} CPU {fmt.pct(d.get('cpu_pct')):>5}  ")
            out.append(top_states(d, 2) + "  ")
            if d.get("where"):
                out.append(fmt.clip(fmt.clean(d["where"]), max(10, width - 40)), style="dim")
        return out


@register_panel
class HotFramesPanel(TextPanel):
    VIEW = "stacks"
    ORDER = 10
    NEEDS = (KIND_STACKS,)
    TITLE = "Hot frames, last 60 s (click here, then t: next thread, s: sort by self/total)"
    TOP = 16
    can_focus = True
    BINDINGS = [("t", "next_thread", "Next thread"), ("T", "prev_thread", "Previous thread"),
                ("s", "toggle_sort", "Self/total")]

    def __init__(self) -> None:
        super().__init__()
        self.filter: tuple[int, object] | None = None   # (pid, tid); None = the main thread
        self.all_threads = False
        self.by = "self"
        self._cache_key = None
        self._cache = None

    # -- selection ------------------------------------------------------------------------
    def _choices(self, snap: Snapshot) -> list[tuple[int, object] | None]:
        """None (all threads) then every thread with Python frames, main first."""
        return [None] + [(d["pid"], d["tid"]) for d in current_states(snap) if d.get("python")]

    def select(self, key: tuple[int, object] | None) -> None:
        self.filter, self.all_threads = key, key is None
        self._redraw()

    def _step(self, n: int) -> None:
        snap = self.last_snapshot
        if snap is None:
            return
        choices = self._choices(snap)
        cur = None if self.all_threads else (self.filter or self._main_key(snap))
        i = choices.index(cur) if cur in choices else 0
        self.select(choices[(i + n) % len(choices)])

    def action_next_thread(self) -> None:
        self._step(1)

    def action_prev_thread(self) -> None:
        self._step(-1)

    def action_toggle_sort(self) -> None:
        self.by = "total" if self.by == "self" else "self"
        self._redraw()

    def _redraw(self) -> None:
        if self.last_snapshot is not None:
            self.update_view(self.last_snapshot)

    @staticmethod
    def _main_key(snap: Snapshot) -> tuple[int, object] | None:
        main = next((d for d in current_states(snap) if d.get("role") == "main"), None)
        if main is not None:
            return main["pid"], main["tid"]
        pid = snap.target_pid
        return (int(pid), int(pid)) if pid and pid.isdigit() else None

    # -- drawing ----------------------------------------------------------------------------
    def draw(self, snap: Snapshot, width: int) -> Text:
        key = None if self.all_threads else (self.filter or self._main_key(snap))
        samples = [s for k in snap.keys(KIND_STACKS) for s in snap.series(KIND_STACKS, k)]
        newest = max((s.t for s in samples), default=None)
        ck = (newest, len(samples), key, self.by)
        if ck != self._cache_key:
            pid, tid = key if key is not None else (None, None)
            self._cache = hot_frames(samples, pid=pid, tid=tid, top=self.TOP, by=self.by)
            self._cache_key = ck
        hf = self._cache
        out = Text()
        names = {(d["pid"], d["tid"]): d.get("name") for d in current_states(snap)}
        who = "all threads" if key is None else f"{names.get(key) or 'thread'} (PID {key[0]}, TID {key[1]})"
        out.append(f"{who}", style="bold")
        out.append(f" · {hf['samples']} samples · sorted by {self.by}")
        if not hf["rows"]:
            out.append("\nno samples for this thread in the last 60 s", style="dim")
            return out
        out.append("\n  self%  total%  function (file:line)", style="dim")
        for r in hf["rows"]:
            base = (r["file"] or "?").rsplit("/", 1)[-1]
            where = f"{r['func']} ({base}:{r['line']})" if r["line"] is not None else f"{r['func']} ({base})"
            out.append(f"\n{fmt.pct(r['self_pct'], 1):>7} {fmt.pct(r['total_pct'], 1):>7}  ")
            out.append(fmt.clip(fmt.clean(where), max(10, width - 17)))
        return out
