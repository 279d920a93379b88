"""Verdicts over a whole session: the report's ``verdicts`` and ``primary_verdict``.

Pure functions over the engine's output samples (``verdict``, ``verdict_primary``,
``verdict_change``), whether they were just recomputed from raw samples or read from a file.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from gputop.derive.phases import JUDGED
from gputop.model import Sample
from gputop.verdicts.causal import fix_gain, gain_text
from gputop.verdicts.engine import (ENTER_S, KIND_VERDICT, KIND_VERDICT_CHANGE, KIND_VERDICT_PRIMARY,
                                    NO_GPU_AFTER_EVALUATIONS)


JUDGED_OR_UNKNOWN = (None, *JUDGED)  # None: a recording made before phases, or no stacks


def summarize_verdicts(samples: list[Sample], t_start: float, t_end: float, interval_s: float = 1.0) -> dict:
    """{"verdicts": {id: {...}}, "primary_verdict": {...} | None, "timeline": [...]}"""
    duration = max(t_end - t_start, interval_s)
    why_other = None
    active_n: Counter = Counter()
    last: dict[str, dict] = {}
    first_seen: dict[str, float] = {}
    evidence: dict[str, list[dict]] = defaultdict(list)
    lost: dict[str, list[float]] = defaultdict(list)
    primary_n: Counter = Counter()
    primary_first: dict[str, float] = {}
    timeline = []
    first_verdict_t = None
    evaluations = 0
    why_none = None
    notes_n: Counter = Counter()
    notes_last: dict[str, str] = {}
    changes, shown = 0, None   # the live primary changing from one verdict to another in judged time
    for s in samples:
        if s.kind == KIND_VERDICT and s.get("active"):
            active_n[s.key] += 1
            last[s.key] = dict(s.data)
            evidence[s.key].append(s.get("evidence") or {})
            if type(s.get("lost_share")) in (int, float):
                lost[s.key].append(float(s.get("lost_share")))
            first_seen.setdefault(s.key, s.get("since") if s.get("since") is not None else s.t)
        elif s.kind == KIND_VERDICT_PRIMARY:
            if s.get("phase") not in JUDGED_OR_UNKNOWN:
                # start-up, evaluation, the end: no verdict is about them, so they do not count
                # in any verdict's share of the session
                if isinstance(s.get("why"), str):
                    why_other = s.get("why")
                continue
            evaluations += 1
            for note in s.get("notes") or ():
                if isinstance(note, dict) and isinstance(note.get("id"), str) and isinstance(note.get("text"), str):
                    notes_n[note["id"]] += 1
                    notes_last[note["id"]] = note["text"]
            pid = s.get("id")
            if not pid and isinstance(s.get("why"), str):
                why_none = s.get("why")
            if pid and shown is not None and pid != shown:
                changes += 1   # (X, none, X is no change: the same verdict came back)
            if pid:
                shown = pid
                primary_n[pid] += 1
                primary_first.setdefault(pid, s.t)
                if first_verdict_t is None:
                    first_verdict_t = s.t
        elif s.kind == KIND_VERDICT_CHANGE:
            timeline.append({"t": round(s.t - t_start, 1), "id": s.key, "active": s.get("active"),
                             "title": s.get("title")})
    if evaluations:
        duration = max(evaluations * interval_s, interval_s)   # the judged time
    if why_none is None:
        why_none = why_other
    verdicts = {}
    for vid, n in active_n.most_common():
        d = last[vid]
        ev = _evidence_summary(evidence[vid])
        if isinstance(ev.get("fix_gain_pct"), (int, float)) and lost[vid]:
            # the session's gain is that of the mean lost share (a share of the wall time:
            # removing it shortens the session by that share), not the mean of each second's
            # gain, which seconds near the cap (causal.MAX_LOSS) inflate without bound (a 12 s job
            # read +513%); the report then takes a budget cause's from the training budget
            # (report._session_gain)
            ev["fix_gain_pct"] = round(fix_gain(sum(lost[vid]) / len(lost[vid])) * 100.0, 1)
        verdicts[vid] = {
            "title": d.get("title"), "severity": d.get("severity"),
            "active_share": round(min(1.0, n * interval_s / duration), 3),
            "primary_share": round(min(1.0, primary_n.get(vid, 0) / evaluations), 3) if evaluations else 0.0,
            "first_seen_s": round(first_seen[vid] - t_start, 1),
            "lost_share_last": d.get("lost_share"), "confidence": d.get("confidence"),
            "summary": d.get("summary"), "evidence": ev,
            "advice": d.get("advice"), "missing": d.get("missing") or [],
        }
    primary = None
    if primary_n:
        vid, n = primary_n.most_common(1)[0]
        gain = (verdicts.get(vid, {}).get("evidence") or {}).get("fix_gain_pct")
        primary = {"id": vid, "title": verdicts.get(vid, {}).get("title"),
                   "share": round(n / evaluations, 3),
                   # the gain of its mean lost share while it held (verdicts/causal.py: fix_gain)
                   "gain_pct": gain if isinstance(gain, (int, float)) else None,
                   "gain_from": "held" if isinstance(gain, (int, float)) else None,
                   "first_seen_s": round(primary_first[vid] - t_start, 1),
                   "summary": verdicts.get(vid, {}).get("summary"), "advice": verdicts.get(vid, {}).get("advice")}
    # causes that held while the GPU stayed busy (verdicts/causal.py: BUSY_GATE): not verdicts
    notes = [{"id": k, "noted_share": round(min(1.0, n / evaluations), 3) if evaluations else 0.0,
              "text": notes_last[k]} for k, n in notes_n.most_common(4)]
    return {"verdicts": verdicts, "primary_verdict": primary, "timeline": timeline, "notes": notes,
            "primary_changes": changes, "judged_s": round(evaluations * interval_s, 1),
            "first_verdict_s": round(first_verdict_t - t_start, 1) if first_verdict_t is not None else None,
            "no_verdict_why": why_none if primary is None else None}


def summary_rows(samples: list[Sample]) -> list[Sample]:
    """Of one stretch's verdict samples, what ``summarize_verdicts`` reads, so that the
    recorder's summary frames (verdicts/recording_summary.py) carry no more: an active verdict's
    evidence, ``since`` and lost share (its whole sample only the last time in the stretch: the report keeps
    the last one's title, advice ...), a primary's id, phase and, where it is read, its ``why``;
    the changes; inactive verdicts not at all. Run over consecutive stretches and put together,
    these summarize exactly as the samples do (tests/test_verdict_summary_rows.py): a verdict's
    last sample in the file is the last one in the last stretch it is active in. Two thirds of a
    frame's verdict bytes were what the report never reads."""
    last_at = {}
    for i, s in enumerate(samples):
        if s.kind == KIND_VERDICT and s.data.get("active"):
            last_at[s.key] = i
    out = []
    for i, s in enumerate(samples):
        d = s.data
        if s.kind == KIND_VERDICT:
            if not d.get("active"):
                continue
            if last_at.get(s.key) != i:
                d = {k: d[k] for k in ("active", "evidence", "since", "lost_share") if k in d}
        elif s.kind == KIND_VERDICT_PRIMARY:
            keep = ("id", "phase", "why", "notes") if (d.get("phase") not in JUDGED_OR_UNKNOWN or not d.get("id")) \
                else ("id", "phase", "notes")
            d = {k: d[k] for k in keep if k in d}
        out.append(s if d is s.data else Sample(s.t, s.kind, s.key, d))
    return out


def _evidence_summary(rows: list[dict]) -> dict:
    """Mean of each numeric evidence field over the time the verdict was active; the last value
    of the others."""
    out: dict = {}
    nums: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                try:
                    nums[k].append(float(v))
                except OverflowError:  # an int too big for a float: not a measurement
                    continue
            elif v is not None:
                out[k] = v
    for k, vs in nums.items():
        out[k] = round(sum(vs) / len(vs), 2)
    return out


def _why_none_after_the_end(why: str | None) -> str:
    """The engine's last "why no verdict" is worded for a live session ("collecting evidence");
    a report is read after the end: say why there was none over the whole session."""
    if not why or why == "no samples yet":
        return "the recording holds no samples the verdicts could judge"
    if why == "collecting evidence":
        return (f"the session ended while gputop was still collecting evidence (the verdicts judge "
                f"after {NO_GPU_AFTER_EVALUATIONS} s of training)")
    if why.startswith("waiting for "):
        return f"the session ended while gputop was still {why}"
    return why


def render_verdicts_text(section: dict) -> list[str]:
    lines = ["Triage (verdicts, ranked by the share of the judged time — training — each explained)"]
    p = section.get("primary_verdict")
    notes = [f"  note     {n['id']}: {n['text']} ({n['noted_share'] * 100:.0f}% of the judged time)"
             for n in section.get("notes") or ()]
    if p is None:
        lines.append(f"  no verdict over the session: {_why_none_after_the_end(section.get('no_verdict_why'))}")
        return lines + notes
    held = (section.get("verdicts", {}).get(p["id"]) or {}).get("first_seen_s")
    held_text = f" (its rule held from {held:.0f} s)" if isinstance(held, (int, float)) else ""
    lines.append(f"  PRIMARY  {p['id']}: {p['title']} — primary {p['share'] * 100:.0f}% of the judged time, "
                 f"from {p['first_seen_s']:.0f} s{held_text}")
    if p.get("summary"):
        # (the words of its last active window, with that window's figures: the --json evidence
        # averages them over its active time, and the gain below is that of its mean lost share,
        # so a figure here may differ from those: it is another span, and says so)
        lines.append(f"           evidence, its last window: {p['summary']}")
    if isinstance(p.get("gain_pct"), (int, float)):
        whence = {"budget": "its share of the training time budget",
                  "steps": "the steps' time over the median step",
                  "idle": "the GPU's idle share, under the steps' time over the median step"}.get(
                      p.get("gain_from"), "its mean lost share while it held")
        sm = p.get("gain_steps_ms") if p.get("gain_from") in ("steps", "idle") else None
        if isinstance(sm, dict) and all(isinstance(sm.get(k), (int, float)) for k in ("mean", "p50")):
            whence += f": mean step {sm['mean']:.0f} ms, median {sm['p50']:.0f} ms"
        lines.append(f"           {gain_text(p['gain_pct'] / 100.0)} (from {whence})")
    if p.get("advice"):
        lines.append(f"           try: {p['advice']}")
    others = [(vid, v) for vid, v in section["verdicts"].items() if vid != p["id"]]
    for vid, v in sorted(others, key=lambda kv: -kv[1]["active_share"]):
        lines.append(f"  {v['severity'] or '?':<8} {vid}: {v['title']} — active {v['active_share'] * 100:.0f}% "
                     f"of the judged time; {v.get('summary') or ''}")
    lines += notes
    if section.get("first_verdict_s") is not None:
        # first_verdict_s (the JSON's too) is when a primary verdict was first named; each
        # verdict's first_seen_s is earlier: when its rule first held, before the hysteresis
        lines.append(f"  first verdict named {section['first_verdict_s']:.1f} s after the session started "
                     f"(a verdict turns on once its rule has held {ENTER_S:g} s; first_seen_s in --json is "
                     f"when the rule first held)")
    return lines
