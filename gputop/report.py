"""``gputop report FILE [--json]``: what a recorded session looked like, in numbers.

A file with summary frames (format 1.1: the recorder writes one every 5 minutes, `SUMMARY_S`) is reported by
merging them: the statistics of every field, and the verdicts and time budget of the whole-file
replay that the recorder ran as it wrote (docs/report.md). Otherwise the statistics are built in
one pass over the chunks, aggregating the columnar data directly, and the verdicts are
recomputed by replaying the raw samples through the session's processors (seconds for an hour).
The same functions make the numbers either way (derive/record_stats.py). Later layers add
*sections* (Python stacks, probe timings, ranks): each declares the sample kinds it needs and
gets just those samples. docs/report.md documents the JSON shape; fields are only ever added,
and ``report_version`` bumps if one changes meaning.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import Callable

from gputop.derive.record_stats import FieldStats, StatsPartial
from gputop.derive.report_partials import PARTIALS, series_samples
from gputop.derive.stats import is_number, summarize
from gputop.model import (KIND_GPU, KIND_GPU_INFO, KIND_PROC, KIND_PROC_INFO, KIND_SYSTEM,
                          KIND_TARGET, MetricSpec, Sample)
from gputop.session.recording import RecordingReader, damage_line
from gputop.session.sanitize import BadValues, clean_meta, clean_series, json_safe, printable, printable_tree
from gputop.sources import metric_specs
from gputop.sources.candidates import one_line

REPORT_VERSION = 1


@dataclass(frozen=True)
class ReportSection:
    """A part of the report that a later layer adds (stacks, probe, verdicts).

    ``build`` gets the samples of ``kinds`` (time-ordered) and the report so far, and returns a
    JSON-able dict (or None to leave the section out). ``text`` renders it for humans.
    """

    name: str
    kinds: tuple[str, ...]
    build: Callable[[list[Sample], dict], dict | None]
    text: Callable[[dict], list[str]] | None = None
    # Mergeable form (derive/report_partials.py): ``partial`` of one summary frame's samples, written in
    # the summary frames; ``merge(partials, kept samples, report)`` -> what ``build`` gives. None:
    # a section whose kinds the summary frames keep as they are is built from those; any other
    # makes the report read every sample.
    partial: Callable[[list[Sample]], dict] | None = None
    merge: Callable[[list, list[Sample], dict], dict | None] | None = None


SECTIONS: list[ReportSection] = []


def register_section(section: ReportSection) -> None:
    SECTIONS[:] = [s for s in SECTIONS if s.name != section.name] + [section]


def _specs_by_field() -> dict[tuple[str, str], MetricSpec]:
    return {(m.kind, m.field): m for m in metric_specs()}


def _metrics(kind: str, cols: dict[str, list], specs: dict) -> dict:
    out = {}
    for name in sorted(cols):
        spec = specs.get((kind, name))
        if spec is not None and not spec.aggregate:
            continue
        stats = cols[name].summary()
        if stats["n"] == 0:
            continue
        stats["unit"] = spec.unit if spec else ""
        out[name] = stats
    return out


def _verdict_section(path: str) -> dict:
    """Verdicts recomputed from the raw samples (so better rules improve old recordings): the
    recording is played through the same processors a live session runs, at full speed."""
    from gputop.session.whole_replay import replay_whole
    from gputop.verdicts import default_processors

    from gputop.derive.budget_processor import BudgetProcessor, budget_section

    processors = default_processors()
    got = replay_whole(path, processors)
    budget = next((p for p in processors if isinstance(p, BudgetProcessor)), None)
    return _verdict_keys(got.samples, got.t_start, got.t_end,
                         budget_section(budget, got.t_end) if budget is not None else {})


def _verdict_keys(samples: list[Sample], t_start: float, t_end: float, budget: dict) -> dict:
    """The report's verdict and time-budget keys: one function, whether the verdict samples come
    from a whole-file replay or from the summary frames the recorder wrote while replaying."""
    from gputop.verdicts.summary import summarize_verdicts

    out = summarize_verdicts(samples, t_start, t_end)
    return {"verdicts": out["verdicts"], "primary_verdict": out["primary_verdict"],
            "verdict_timeline": out["timeline"], "primary_changes": out["primary_changes"],
            "judged_s": out["judged_s"], "first_verdict_s": out["first_verdict_s"],
            "no_verdict_why": out["no_verdict_why"], **budget}


def _session_gain(out: dict) -> None:
    """The session's gain of each cause the time budget measures, from the training budget's
    share of it and the steps' excess over the median step of the slowest rank (verdicts/causal.py:
    session_loss), in the primary and in its evidence. Run on the whole report (its budget and
    probe sections built)."""
    from gputop.verdicts.causal import fix_gain, session_basis, session_loss

    if not isinstance(out.get("verdicts"), dict):
        return
    shares = (((out.get("budget") or {}).get("training") or {}).get("shares")) or {}
    probe = out.get("probe") if isinstance(out.get("probe"), dict) else {}
    ranks = [r for r in probe.get("ranks") or [] if isinstance(r, dict)]
    slowest = ((probe.get("summary") or {}).get("slowest") or {}).get("pid")
    rank = next((r for r in ranks if r.get("pid") == slowest), ranks[0] if len(ranks) == 1 else None)
    excess = rank.get("slow_step_excess") if rank is not None else None
    for vid, v in out["verdicts"].items():
        loss = session_loss(vid, shares, excess)
        ev = v.get("evidence") or {}
        if loss is None or not isinstance(ev.get("fix_gain_pct"), (int, float)):
            continue
        ev["fix_gain_pct"] = round(fix_gain(loss) * 100.0, 1)
        p = out["primary_verdict"]
        if p is not None and p["id"] == vid:
            p["gain_pct"], p["gain_from"] = ev["fix_gain_pct"], session_basis(vid, shares, excess)
            if p["gain_from"] in ("steps", "idle"):
                sm = rank.get("step_ms") or {}
                p["gain_steps_ms"] = {"mean": sm.get("mean"), "p50": sm.get("p50")}


@dataclass
class _Summaries:
    """What a file's summary frames gave: statistics of the chunks before ``covers_to`` (a file
    offset), the verdict samples of the replay, and its end (None: not written, gputop killed)."""
    stats: StatsPartial
    covers_to: int
    verdicts: list[Sample]
    final: dict | None
    sections: list | None = None   # every frame's ``sections`` (None: a frame has none)


def _read_summaries(reader) -> _Summaries | None:
    """The summary frames merged, or None when the file has none or they cannot be trusted to
    give what reading every sample would (a damaged part: the samples are read instead)."""
    from gputop.verdicts.recording_summary import rules_fingerprint, verdict_samples

    idx = reader.index
    if not idx.summaries or idx.damaged or idx.bad_chunks:
        return None
    stats, verdicts, final, sections = StatsPartial(), [], None, []
    for ref in idx.summaries:
        obj = reader.read_summary(ref)
        if obj is None:
            return None
        try:
            stats.merge(StatsPartial.from_json(obj.get("stats")))
            verdicts.extend(verdict_samples(obj.get("verdicts")))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if isinstance(obj.get("final"), dict):
            final = obj["final"]
        if sections is not None:
            if "sections" in obj:
                sections.append(obj["sections"])
            else:
                sections = None
    if final is not None and (final.get("t_start") != idx.t_start or final.get("t_end") != idx.t_end):
        final = None   # the replay it summarizes is not of this file as it reads now
    if final is not None and final.get("rules") != rules_fingerprint():
        final = None   # judged by other rules (another gputop): today's are replayed
    if final is not None and not _final_ok(final):
        final = None   # not what a recorder writes: the verdicts are replayed from the samples
    return _Summaries(stats, idx.summaries[-1].offset, verdicts, final, sections)


# what the last summary frame's ``final`` may hold besides its times and fingerprint: the time
# budget's report keys (derive/budget_processor.budget_section), each of its own type
_FINAL_KEYS = {"startup": (dict, type(None)), "startup_s": (int, float, type(None)), "phases": (list,),
               "budget": (dict, type(None))}


def _final_ok(final: dict) -> bool:
    """``final`` is what a recorder writes: no key of the report's own (a hostile frame's
    "session" went into --json as it was), each of its type, the phases [{"t", "phase"}]."""
    extra = set(final) - set(_FINAL_KEYS) - {"t_start", "t_end", "rules"}
    if extra or not all(isinstance(final.get(k), types) for k, types in _FINAL_KEYS.items() if k in final):
        return False
    phases = final.get("phases") or []
    if not all(isinstance(p, dict) and isinstance(p.get("phase"), str) and type(p.get("t")) in (int, float)
               for p in phases):
        return False
    st = final.get("startup")
    if st is not None and not (type(st.get("seconds")) in (int, float) and isinstance(st.get("parts"), dict)
                               and all(isinstance(k, str) and type(v) in (int, float) for k, v in st["parts"].items())):
        return False
    b = final.get("budget")
    if b is None:
        return True
    if not (isinstance(b.get("by_phase"), dict) and isinstance(b.get("gpu_source"), (str, type(None)))):
        return False
    return all(_budget_data_ok(d) for d in [b.get("training"), *b["by_phase"].values()] if d is not None)


def _budget_data_ok(d) -> bool:
    """One budget's JSON form (derive/budget.Budget.to_data) as the text report reads it."""
    return (isinstance(d, dict) and type(d.get("seconds")) in (int, float) and isinstance(d.get("shares"), dict)
            and all(v is None or type(v) in (int, float) for v in d["shares"].values())
            and isinstance(d.get("frames", {}), dict)
            and all(isinstance(fs, list) and all(isinstance(f, list) and f and isinstance(f[0], str) for f in fs)
                    for fs in d.get("frames", {}).values()))


def build_report(path: str, recompute_verdicts: bool = True) -> dict:
    """The report of a recording as a JSON-able dict. Raises RecordingError for bad files.

    Every value is checked on the way in (session/sanitize.py): one of the wrong type or out of
    range is None in the report, and ``session.bad_values`` says which fields and why."""
    specs = _specs_by_field()
    want_kinds = {k for s in SECTIONS for k in s.kinds}
    section_samples: list[Sample] = []
    meta_bad, bad = BadValues(), BadValues()
    verdict_keys = None
    with RecordingReader(path) as reader:
        meta = clean_meta(reader.meta, meta_bad)
        index = reader.index
        summaries = _read_summaries(reader)
        agg = summaries.stats if summaries is not None else StatsPartial()
        covers_to = summaries.covers_to if summaries is not None else -1
        merged = _merged_frames(summaries)   # the sections from the summaries, if they can be
        for ref in index.chunks:
            covered = ref.offset < covers_to    # its statistics are in the summaries
            if covered and (not want_kinds or merged is not None):
                continue
            mine = BadValues() if covered else bad
            for series in reader.read_series(ref):
                series = clean_series(*series, mine)
                if series is None:
                    continue
                kind, key, ts, cols = series
                if not covered:
                    agg.add(kind, key, ts, cols)
                if kind in want_kinds:
                    names = list(cols)
                    for i, t in enumerate(ts):
                        section_samples.append(Sample(float(t), kind, key, {n: cols[n][i] for n in names}))
            if not covered and bad:
                agg.add_bad(bad.counts, bad.reasons)
                bad = BadValues()
        if recompute_verdicts and summaries is not None and summaries.final is not None and not index.damaged:
            final = summaries.final
            verdict_keys = _verdict_keys(summaries.verdicts, index.t_start, index.t_end,
                                         {k: v for k, v in final.items() if k not in ("t_start", "t_end", "rules")})
        truncated, clean_end = index.truncated, index.end is not None
        damaged, damage = [d.as_dict() for d in index.damaged], damage_line(index)
        unreadable_end = index.tail.as_dict() if index.tail is not None else None
    bad = meta_bad   # the metadata's bad values first, then the samples', in the order found
    for where, n in agg.bad_counts.items():
        bad.counts[where] = bad.counts.get(where, 0) + n
        bad.reasons.setdefault(where, agg.bad_reasons.get(where, ""))
    n_samples, t_first, t_last = agg.n_samples, agg.t_first, agg.t_last
    health_last, health_worst = agg.health_last, agg.health_worst
    gpu_rows, clock_events = agg.gpu_rows, agg.clock_events

    duration = (t_last - t_first) if n_samples else 0.0
    start_wall = meta.get("start_wall")
    report: dict = {
        "report_version": REPORT_VERSION,
        "session": {
            "file": path,
            "gputop_version": meta.get("gputop_version"),
            "format": meta.get("format"),
            "host": meta.get("host"),
            "target": meta.get("target") if isinstance(meta.get("target"), dict) else None,
            "start_wall": start_wall,
            "start_iso": _iso(start_wall),
            "duration_s": round(duration, 3),
            "samples": n_samples,
            "clean_end": clean_end,
            "truncated": truncated,
            "damaged": damaged,   # parts skipped: byte offset, length, what, why, time span
            "damage": damage,     # the same in one line, or None
            # the file ends in bytes that cannot be read and are not a frame cut short (junk, a
            # damaged end frame): not "gputop was killed"
            "unreadable_end": unreadable_end,
            "rates": {name: src.get("rates") for name, src in (meta.get("sources") or {}).items()
                      if isinstance(src, dict) and src.get("rates")},
        },
        "sources": {k: {"state": v["state"], "message": v["message"],
                        **({"earlier": {"state": health_worst[k]["state"], "message": health_worst[k]["message"]}}
                           if health_worst[k]["state"] == "failed" and v["state"] != "failed" else {})}
                    for k, v in sorted(health_last.items())},
        "gpus": [],
        "host": {},
    }

    for key in sorted({k for (kind, k) in agg.values if kind == KIND_GPU} | {k for (kind, k) in agg.last if kind == KIND_GPU_INFO},
                      key=_key_order):
        info = agg.last.get((KIND_GPU_INFO, key), {})
        rows = gpu_rows.get(key, 0)
        report["gpus"].append({
            "index": _num_key(key),
            "name": info.get("name"),
            "uuid": info.get("uuid"),
            "driver": info.get("driver"),
            "watched": info.get("watched"),
            "gpm": info.get("gpm"),
            "na": info.get("na") if isinstance(info.get("na"), dict) else {},
            "metrics": _metrics(KIND_GPU, agg.values.get((KIND_GPU, key), {}), specs),
            "clock_events_share": {ev: round(n / rows, 4) for ev, n in sorted(clock_events.get(key, {}).items())} if rows else {},
        })

    host: dict = {}
    if (KIND_SYSTEM, "host") in agg.values:
        host["system"] = {"metrics": _metrics(KIND_SYSTEM, agg.values[(KIND_SYSTEM, "host")], specs)}
    if agg.tree_ticks:
        # a calm host tick stands for its calm_factor ticks of the full rate (derive/record_stats.py)
        w = agg.tick_weights
        ticks = [t for at, t in agg.tree_ticks.items() for _ in range(w.get(at, 1))]
        host["target_tree"] = {"metrics": {
            "cpu_pct": {**summarize(t[0] for t in ticks), "unit": "%"},
            "rss": {**summarize(t[1] for t in ticks), "unit": "B"},
            "processes": {**summarize(t[2] for t in ticks), "unit": ""},
        }}
    procs = []
    for (kind, key), cols in agg.values.items():
        if kind != KIND_PROC:
            continue
        info = agg.last.get((KIND_PROC_INFO, key)) or agg.last.get((KIND_PROC, key), {})
        cpu, rss = (cols.get(n, FieldStats()).summary() for n in ("cpu_pct", "rss"))
        procs.append({"pid": _num_key(key), "name": info.get("name"), "role": info.get("role"),
                      "cpu_pct_mean": cpu["mean"], "cpu_pct_max": cpu["max"], "rss_max": rss["max"]})
    if procs:
        procs.sort(key=lambda p: -(p["cpu_pct_mean"] or 0))
        host["processes"] = procs
    target_meta = meta.get("target") if isinstance(meta.get("target"), dict) else {}
    target = agg.last.get((KIND_TARGET, str(target_meta.get("pid"))))
    if target:
        host["target_state"] = target.get("state")
    report["host"] = host

    if recompute_verdicts:
        report.update(verdict_keys if verdict_keys is not None else _verdict_section(path))
    if merged is not None:
        merged.set_tail(section_samples)
    for section in SECTIONS:
        try:
            if merged is not None:
                got = _merged_section(merged, section, report, path)
            else:
                mine = [s for s in section_samples if s.kind in section.kinds]
                mine.sort(key=lambda s: s.t)
                got = section.build(mine, report)
        except Exception as e:  # one broken section must not hide the rest of the report
            got = {"error": f"{type(e).__name__}: {e}"}
        if got is not None:
            report[section.name] = got
    if recompute_verdicts:
        _session_gain(report)
    if bad:
        report["session"]["bad_values"] = bad.summary()
    return json_safe(report)


def _merged_frames(summaries: _Summaries | None):
    """The summary frames' section partials, when every section can be built from them."""
    from gputop.derive.report_partials import MergedFrames

    if summaries is None or not summaries.sections:
        return None
    try:
        merged = MergedFrames(summaries.sections)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return merged if all(merged.can_build(s) for s in SECTIONS if s.kinds) else None


def _merged_section(merged, section: ReportSection, report: dict, path: str) -> dict | None:
    """One section from the summary frames; a partial that is not what a recorder writes (a
    damaged or hostile file) has the section built from the file's samples instead."""
    try:
        return merged.build(section, report)
    except Exception:   # any damage (IndexError, OverflowError ...): the samples decide
        mine = []
        with RecordingReader(path) as reader:
            for ref in reader.index.chunks:
                for series in reader.read_series(ref):
                    series = clean_series(*series, BadValues())
                    if series is not None and series[0] in section.kinds:
                        mine.extend(series_samples(*series))
        mine.sort(key=lambda s: s.t)
        return section.build(mine, report)


def _num_key(key):
    try:
        return int(key)
    except (TypeError, ValueError):
        return key


def _key_order(key) -> tuple:
    """GPU keys in number order; a key that is not a number (a damaged file) after them."""
    k = _num_key(key)
    return (0, k, "") if isinstance(k, int) else (1, 0, str(k))


def _iso(wall) -> str | None:
    if not is_number(wall):
        return None
    try:
        return _dt.datetime.fromtimestamp(wall, _dt.timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return None


# ---------------------------------------------------------------------------------------------
# Text rendering: plain text a person can paste into a ticket.

def fmt_value(v, unit: str) -> str:
    if not is_number(v) or not math.isfinite(v):
        return "n/a"
    if unit == "B":
        return fmt_bytes(v)
    if unit == "B/s":
        return fmt_bytes(v) + "/s"
    if unit in ("%",):
        return f"{v:.1f}%"
    if abs(v) >= 100:
        s = f"{v:.0f}"
    elif abs(v) >= 10:
        s = f"{v:.1f}"
    else:
        s = f"{v:.2f}"
    return f"{s} {unit}".rstrip()


def fmt_bytes(v: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024.0
    return f"{v:.1f} TiB"


def _metric_table(metrics: dict, specs: dict, kind: str) -> list[str]:
    rows = []
    for name, st in metrics.items():
        spec = specs.get((kind, name))
        label = spec.label if spec else name
        unit = st.get("unit", "")
        rows.append((label, name, *(fmt_value(st.get(k), unit) for k in ("mean", "p50", "p95", "max"))))
    if not rows:
        return ["  (no samples)"]
    w0 = max(len(r[0]) for r in rows)
    out = [f"  {'metric':<{w0}}  {'mean':>11} {'p50':>11} {'p95':>11} {'max':>11}"]
    out += [f"  {r[0]:<{w0}}  {r[2]:>11} {r[3]:>11} {r[4]:>11} {r[5]:>11}" for r in rows]
    return out


TEXT_STRING_MAX = 500   # a recorded string longer than this is cut, with an ellipsis, in the text


# The target tree's rows are sums over its processes, not catalogue fields: their labels here.
TREE_SPECS = {(KIND_PROC, f): MetricSpec(KIND_PROC, f, u, label, "") for f, u, label in (
    ("cpu_pct", "%", "CPU (100% = 1 core)"), ("rss", "B", "memory (RSS)"), ("processes", "", "process count"))}


def _explained(metrics: dict, specs: dict, kind: str, prefixes: tuple[str, ...]) -> list[str]:
    """What the terse rows mean (stall, cgroup), in the catalogue's words, below their table."""
    out = []
    for name in metrics:
        spec = specs.get((kind, name))
        if spec is not None and spec.help and name.startswith(prefixes):
            out.append(f"    {spec.label}: {spec.help}")
    return ["  what these rows mean:", *out] if out else []


def render_text(report: dict) -> str:
    """The report as plain text. Recorded strings are made safe for a terminal first (control
    characters and escape sequences written out, at most TEXT_STRING_MAX characters)."""
    report = printable_tree(report, TEXT_STRING_MAX)
    text = _render_text(report)
    # A section's own text may format something that was not in the report: no control
    # character reaches the terminal whatever it is.
    return "\n".join(printable(line, 10 * TEXT_STRING_MAX) for line in text.split("\n"))


def _render_text(report: dict) -> str:
    specs = _specs_by_field()
    s = report["session"]
    target = s.get("target") if isinstance(s.get("target"), dict) else {}
    cmdline = target.get("cmdline") if isinstance(target.get("cmdline"), list) else []
    # one line (a -c script's newlines), made printable
    cmd = printable(one_line([str(c) for c in cmdline], 2000), TEXT_STRING_MAX) or target.get("name") or "?"
    lines = [
        f"gputop report — {s['file']}",
        f"  target   PID {target.get('pid', '?')}: {cmd}",
        f"  host     {s.get('host')}   started {s.get('start_iso')}   duration {s['duration_s']:.1f} s   "
        f"gputop {s.get('gputop_version')}",
    ]
    if (s.get("truncated") or not s.get("clean_end")) and not s.get("unreadable_end"):
        lines.append("  note     the recording did not end cleanly (gputop was killed, or it is still "
                     "being written): it covers up to its last complete second")
    if s.get("damage"):
        lines.append(f"  damaged  {s['damage']}")
    if s.get("bad_values"):
        lines.append("  note     some recorded values are of the wrong type or out of range; they show as n/a:")
        lines.extend(f"             {where}: {why}" for where, why in s["bad_values"].items())
    for name, h in report.get("sources", {}).items():
        if h["state"] != "ok":
            lines.append(f"  source   {name}: {h['state'] or 'n/a'} — {h['message']}")
    if "startup" in report or "budget" in report:
        from gputop.derive.budget_processor import render_budget_text

        lines.append("")
        lines.extend(_guarded(render_budget_text, report, "time budget"))
    if "verdicts" in report:
        from gputop.verdicts.summary import render_verdicts_text

        lines.append("")
        lines.extend(_guarded(render_verdicts_text, report, "verdicts"))
    for g in report["gpus"]:
        lines.append("")
        flag = "" if g.get("watched") in (None, True) else " (not used by the target)"
        lines.append(f"GPU {g['index']}: {g.get('name') or '?'}{flag}")
        lines.extend(_metric_table(g["metrics"], specs, KIND_GPU))
        if g.get("clock_events_share"):
            evs = ", ".join(f"{k} {v * 100:.0f}%" for k, v in g["clock_events_share"].items())
            lines.append(f"  clock events (share of samples): {evs}")
        for fld, why in (g.get("na") or {}).items():
            lines.append(f"  n/a {fld}: {why}")
    host = report.get("host") or {}
    if "system" in host:
        lines.append("")
        lines.append("Host")
        lines.extend(_metric_table(host["system"]["metrics"], specs, KIND_SYSTEM))
        lines.extend(_explained(host["system"]["metrics"], specs, KIND_SYSTEM, ("psi_", "cgroup_")))
    if "target_tree" in host:
        lines.append("")
        lines.append("Target process tree (sum over processes)")
        lines.extend(_metric_table(host["target_tree"]["metrics"], TREE_SPECS, KIND_PROC))
    if host.get("processes"):
        lines.append("")
        lines.append(f"  {'pid':>7}  {'role':<18} {'name':<16} {'cpu mean':>9} {'cpu max':>8} {'rss max':>10}")
        for p in host["processes"][:12]:
            lines.append(f"  {p['pid']:>7}  {(p.get('role') or '-'):<18} {(p.get('name') or '?')[:16]:<16} "
                         f"{fmt_value(p['cpu_pct_mean'], '%'):>9} {fmt_value(p['cpu_pct_max'], '%'):>8} "
                         f"{fmt_value(p['rss_max'], 'B'):>10}")
    if host.get("target_state") == "exited":
        lines.append("  the target exited during the session")
    for sec in SECTIONS:
        if sec.name in report:
            lines.append("")
            if sec.text:
                lines.extend(_guarded(sec.text, report[sec.name], sec.name))
            else:
                lines.append(f"{sec.name}: {report[sec.name]}")
    return "\n".join(lines) + "\n"


def _guarded(render: Callable[[dict], list[str]], data: dict, name: str) -> list[str]:
    try:
        return list(render(data))
    except Exception as e:  # one part's damaged data must not hide the rest of the report
        return [f"{name}: cannot be shown ({type(e).__name__})"]


# ---------------------------------------------------------------------------------------------
# Sections contributed by the derivations (Python stacks, the in-process probe).

def _stacks_text(sec: dict) -> list[str]:
    lines = ["Python threads (py-spy stacks + kernel wait states)"]
    if not sec.get("available"):
        lines.append(f"  not available: {sec.get('why')}")
        return lines
    main = sec.get("main_thread") or {}
    # (thread states cover the whole session, start-up included: the time budget above is the
    # training phase's, so the two can differ, and the label says which is which)
    lines.append(f"  main thread over the whole session (start-up included): running "
                 f"{fmt_value(sec.get('running_pct'), '%')}, GIL wait "
                 f"{fmt_value(sec.get('gil_wait_pct'), '%')}, DataLoader wait {fmt_value(sec.get('data_wait_pct'), '%')}, "
                 f"CUDA sync wait {fmt_value(sec.get('sync_wait_pct'), '%')}, collectives "
                 f"{fmt_value(sec.get('collective_pct'), '%')}")
    if main.get("where"):
        lines.append(f"  main thread is mostly in: {main['where']}")
    others = [t for t in sec.get("threads") or [] if t.get("role") == "thread"][:6]
    for t in others:
        lines.append(f"  thread {str(t.get('name') or t.get('tid'))[:24]:<24} running {fmt_value(t.get('running_pct'), '%'):>6}"
                     f"  GIL {fmt_value(t.get('gil_pct'), '%'):>6}  idle {fmt_value(t.get('idle_pct'), '%'):>6}")
    workers = sec.get("dataloader_workers") or []
    if workers:
        cpus = ", ".join(fmt_value(w.get("cpu_pct"), "%") for w in workers[:8])
        lines.append(f"  DataLoader worker processes seen over the session ({len(workers)}; a loader restarts "
                     f"its workers each epoch unless persistent): CPU {cpus}")
    rows = (sec.get("top_frames") or {}).get("main_thread") or []
    if rows:
        lines.append("  hottest functions of the main thread (self share of samples):")
        for r in rows[:5]:
            lines.append(f"    {fmt_value(r.get('self_pct'), '%'):>6}  {r.get('func')} ({r.get('file')}:{r.get('line')})")
    return lines


def _register_builtin_sections() -> None:
    from gputop.derive import ranks, steps, threads
    from gputop.model import KIND_HEALTH as _H
    from gputop.sources.probe_client import PROBE_KINDS
    from gputop.sources.stacks import KIND_STACKS, KIND_THREAD_KERNEL

    def parts(name: str) -> dict:   # the section's mergeable form (derive/report_partials.py)
        return {"partial": PARTIALS[name].partial, "merge": PARTIALS[name].merge}

    register_section(ReportSection("stacks", (KIND_STACKS, KIND_THREAD_KERNEL, _H),
                                   lambda samples, report: threads.report_section(samples), _stacks_text,
                                   **parts("stacks")))
    register_section(ReportSection("probe", (*PROBE_KINDS, _H),
                                   lambda samples, report: steps.report_section(samples), steps.report_lines,
                                   **parts("probe")))
    register_section(ReportSection("ranks", ranks.REPORT_KINDS, ranks.report_section, ranks.report_lines,
                                   **parts("ranks")))
    from gputop.derive import efficiency
    register_section(ReportSection("efficiency", efficiency.KINDS, efficiency.report_section,
                                   efficiency.report_lines, **parts("efficiency")))
    from gputop.derive import stall
    register_section(ReportSection("stall", (stall.KIND_STALL_SNAPSHOT,), stall.report_section, stall.report_lines,
                                   **parts("stall")))


_register_builtin_sections()
