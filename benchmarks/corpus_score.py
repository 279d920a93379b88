"""Score the corpus (issue 29) from recordings made by benchmarks/corpus_run.py, with today's
rules: each recording replayed, its report's primary verdict and predicted gain against the
job's known cause and the gain its fix measured (the job's own steps/s, fixed against as is).

    python -m benchmarks corpus_score DIR [DIR ...] [--json OUT]

Prints one row per job and the goals of issue 29, for the tuning jobs and the held-out third
apart:
- the right primary on the job as it is (``cause``; a healthy job: no cause-naming primary with
  a predicted gain above 10%);
- on the fixed job: no cause-naming primary with a predicted gain above 10%;
- the predicted gain within +-30% relative or +-5 points of the measured one (cause jobs);
- a cause job whose own fix gained under 10% is refuted (its label was not its cause): shown
  with ``--`` and counted in none of the above;
- the same primary when gputop attaches once the job trains (the recording cut ATTACH_S after
  the first training step, with the state a fresh attach would read) as when it watched from the
  start.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "corpus"))
sys.path.insert(0, str(HERE))   # corpus_run, beside this file (also when imported as benchmarks.corpus_score)
from manifest import SETS  # noqa: E402
from corpus_run import steady_rate  # noqa: E402

from gputop.model import Sample  # noqa: E402
from gputop.report import build_report  # noqa: E402
from gputop.session.recorder import Recorder, RecordingWriter  # noqa: E402
from gputop.session.recording_format import RecordingError  # noqa: E402
from gputop.session.recording_reader import RecordingReader  # noqa: E402
from gputop.verdicts.causal import NO_GAIN  # noqa: E402
from gputop.verdicts.registry import specs  # noqa: E402

GAIN_NOTE = 0.10       # a cause-naming primary predicting more than this on a healthy or fixed job is wrong
GAIN_REL = 0.30        # predicted gain within 30% of the measured one ...
GAIN_ABS = 0.05        # ... or within 5 points
ATTACH_S = 5.0         # the late attach: this long after the first training step
# kinds a fresh attach reads at once (sent at the start and on change): kept, as of the cut
STATE_KINDS = ("gpu_info", "proc_info", "probe_config", "target", "rank", "health", "probe_memory")
CAUSES = {s.id for s in specs() if s.names_cause}


def _first_step(rep: dict) -> float | None:
    for p in rep.get("phases") or ():
        if p.get("phase") in ("warmup", "training", "running", "checkpointing"):
            return p.get("t")
    return None


def crop(src: str, dst: str, t_from: float) -> None:
    """``src`` as if gputop had attached at ``t_from``: its samples from then on, and the newest
    state sample of each kind and key before then (at ``t_from``)."""
    with RecordingReader(src) as r:
        state: dict = {}
        rec = Recorder(RecordingWriter(dst, dict(r.meta)))
        for ref in r.index.good_chunks():
            samples = r.read_chunk(ref)
            keep = []
            for s in samples:
                if s.t < t_from:
                    if s.kind in STATE_KINDS:
                        state[(s.kind, s.key)] = s
                    continue
                t0 = s.data.get("t0")
                if isinstance(t0, (int, float)) and t0 < t_from:
                    continue   # a py-spy window or kernel second that began before the attach
                keep.append(s)
            if keep and state:
                keep = [Sample(t_from, s.kind, s.key, s.data) for s in state.values()] + keep
                state = {}
            if keep:
                rec.on_samples(keep)
                rec.flush()
        rec.stop({"clean": True, "cropped_from": src, "t_from": t_from})


def judge(path: pathlib.Path) -> dict:
    rep = build_report(str(path))
    p = rep.get("primary_verdict") or {}
    gain = p.get("gain_pct")
    return {"primary": p.get("id"), "gain": None if gain is None else gain / 100.0, "share": p.get("share"),
            "first_step_t": _first_step(rep), "why_none": rep.get("no_verdict_why"),
            "notes": [n["id"] for n in rep.get("notes") or ()],
            "primary_changes": rep.get("primary_changes"), "judged_s": rep.get("judged_s")}


def wrong_cause(j: dict) -> bool:
    """A cause-naming primary that predicts more than GAIN_NOTE (on a job where none should)."""
    return j["primary"] in CAUSES and (j["gain"] or 0.0) > GAIN_NOTE


def score_job(job, dirs: list[pathlib.Path], results: dict) -> dict | None:
    name = job.name
    recs = {v: next((d / f"{name}-{v}.gtrec" for d in dirs if (d / f"{name}-{v}.gtrec").exists()), None)
            for v in ("as_is", "fixed")}
    if recs["as_is"] is None:
        return None
    row = {"job": name, "family": job.family, "cause": job.cause, "holdout": job.holdout}
    a = judge(recs["as_is"])
    row["as_is"] = a
    rates = {v: (results.get((name, v)) or {}).get("steps_per_s") for v in ("as_is", "fixed")}
    row["rates"] = rates
    row["measured_gain"] = (rates["fixed"] / rates["as_is"] - 1.0) if rates["as_is"] and rates["fixed"] else None
    # a cause whose own fix, tried and measured, gained under GAIN_NOTE was not the job's cause:
    # the label is refuted by the ground truth. Where gputop named another cause, what the job's
    # cause is stays unmeasured (a second fix would tell): scored apart, in neither count. Where
    # gputop named the refuted cause, it predicted a gain the fix did not bring: a miss, counted
    row["refuted"] = (job.cause is not None and job.cause not in NO_GAIN and row["measured_gain"] is not None
                      and row["measured_gain"] < GAIN_NOTE and a["primary"] != job.cause
                      and a["primary"] not in job.also)
    if job.cause is None:
        row["right"] = not wrong_cause(a)
    else:
        named = a["primary"] == job.cause or a["primary"] in job.also
        row["also"] = a["primary"] != job.cause and named
        row["right"] = named and not (
            job.cause not in NO_GAIN and row["measured_gain"] is not None and row["measured_gain"] < GAIN_NOTE)
    if recs["fixed"] is not None:
        f = judge(recs["fixed"])
        row["fixed"] = f
        row["fixed_ok"] = not wrong_cause(f)
    measured = row["measured_gain"]
    if job.cause is not None and job.cause not in NO_GAIN and measured is not None and row["right"] \
            and a["gain"] is not None:
        m, g = row["measured_gain"], a["gain"]
        row["gain_ok"] = abs(g - m) <= max(GAIN_ABS, GAIN_REL * abs(m))
    t1 = a["first_step_t"]
    if t1 is not None:
        with tempfile.TemporaryDirectory() as tmp:
            late = pathlib.Path(tmp) / "late.gtrec"
            crop(str(recs["as_is"]), str(late), t1 + ATTACH_S)
            row["late"] = judge(late)
        row["attach_same"] = row["late"]["primary"] == a["primary"]
    return row


def second_fixes(jobs, dirs: list[pathlib.Path], results: dict, rows: dict) -> list[str]:
    """The second fixes (the manifest's ``second_flags``): the gain each measured over the job as
    it is and over the label's fix, beside gputop's predictions on those two recordings, and what
    gputop names on the job with the second fix. Two things are marked on the job's row for the
    score (``summary``): ``partial_fix`` where the second fix gained ``GAIN_NOTE`` or more over the
    label's fix, on which gputop named a cause (the label's fix left part of the cause: the ground
    truth, a fix tried and measured, says that call was right); ``second_pairs``, each (predicted,
    measured, within) pair that the second fix measures (from the job as it is, and from the
    label's fix where gputop named a cause on it) -- apart from the headline's pairs."""
    out = []
    for job in jobs:
        row = rows.get(job.name)
        rate = {v: (results.get((job.name, v)) or {}).get("steps_per_s") for v in ("as_is", "fixed", "second")}
        if not job.second_flags or row is None or not rate["second"]:
            continue
        rec = next((d / f"{job.name}-second.gtrec" for d in dirs if (d / f"{job.name}-second.gtrec").exists()), None)
        second = judge(rec) if rec is not None else {}

        def measured(a):
            return rate["second"] / rate[a] - 1.0 if rate[a] else None

        def gain(a):
            m = measured(a)
            return "-" if m is None else f"{m * 100:+.0f}%"

        def pred(j):
            j = j or {}
            if j.get("gain") is not None:
                return f"{j['primary']} {j['gain'] * 100:+.0f}%"
            return j.get("primary") or "nothing"
        fixed = row.get("fixed") or {}
        m_fixed = measured("fixed")
        # (the cause gputop named on the label's fix must be the one the second fix removes)
        named_second = bool(fixed) and fixed.get("primary") == job.second_cause
        row["partial_fix"] = bool(named_second and wrong_cause(fixed) and m_fixed is not None and m_fixed >= GAIN_NOTE)
        row["second_pairs"] = []
        # (a pair only where the call was right: the label's cause as it is, the second's on the fix)
        # (as it is: the second fix removes the label's cause only where that is its cause too --
        # the recommender's removes the offload and the copies: its gain is not the offload's alone)
        as_is_right = row["right"] and job.second_cause in (job.cause, row["as_is"].get("primary"))
        for variant, j, right in (("as_is", row["as_is"], as_is_right), ("fixed", fixed, named_second)):
            m = measured(variant)
            if right and m is not None and j.get("primary") in CAUSES and j.get("gain") is not None:
                row["second_pairs"].append((j["gain"], m, abs(j["gain"] - m) <= max(GAIN_ABS, GAIN_REL * abs(m))))
        out.append(f"  {job.name}: second fix ({job.second_fix}) {gain('as_is')} over as it is "
                   f"(gputop: {pred(row['as_is'])}), {gain('fixed')} over the label's fix "
                   f"(gputop on it: {pred(fixed)}); with it gputop names {pred(second)}")
    return ["second fixes (a fix that removes only the named cause, or the rest of it):", *out] if out else []


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100.0 * n / d:.0f}%)" if d else "0/0"


def summary(rows: list[dict]) -> list[str]:
    refuted = [r["job"] for r in rows if r["refuted"]]
    rows = [r for r in rows if not r["refuted"]]
    causes = [r for r in rows if r["cause"] is not None]
    fixed = [r for r in rows if "fixed_ok" in r]
    partial = [r for r in fixed if not r["fixed_ok"] and r.get("partial_fix")]
    second_pairs = [p for r in rows for p in r.get("second_pairs") or ()]
    gains = [r for r in causes if "gain_ok" in r]
    # (a cause with no steps/s gain, skipped_steps, has no gain to compare: its share skipped is the check)
    pairs = [r for r in causes if r["measured_gain"] is not None and r["cause"] not in NO_GAIN]
    attach = [r for r in rows if "attach_same" in r]
    return [f"  right primary as is:            {_pct(sum(r['right'] for r in rows), len(rows))}"
            f"  (cause jobs {_pct(sum(r['right'] for r in causes), len(causes))})",
            f"  fixed: no cause > {GAIN_NOTE:.0%} gain:      {_pct(sum(r['fixed_ok'] for r in fixed), len(fixed))}"
            + (f"; {_pct(sum(r['fixed_ok'] for r in fixed) + len(partial), len(fixed))} counting the label's fixes"
               f" that left the cause, as their second fix measured: {', '.join(r['job'] for r in partial)}"
               if partial else ""),
            f"  gain within +-30%/5 pt:         {_pct(sum(r['gain_ok'] for r in gains), len(pairs))}"
            f" (of pairs with a measured gain; {len(gains)} had the right primary)"
            + (f"; the second fixes' own pairs: {_pct(sum(p[2] for p in second_pairs), len(second_pairs))}"
               f" ({', '.join(f'{p[0] * 100:+.0f}% vs {p[1] * 100:+.0f}%' for p in second_pairs)})"
               if second_pairs else ""),
            f"  same primary attached late:     {_pct(sum(r['attach_same'] for r in attach), len(attach))}",
            f"  refuted by their own fix (< {GAIN_NOTE:.0%}), not counted: {', '.join(refuted) or 'none'}",
            f"  right under another name (manifest's also), counted: "
            f"{', '.join(r['job'] for r in rows if r.get('also')) or 'none'}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--set", default="corpus",
                    help="corpus: issue 29's 30 jobs; unseen1207: its second held-out corpus, written blind to "
                         "the rules; unseen1207c: its third, written the same way; issue30: the jobs of issue "
                         "30's causes; several, comma-separated, are scored as one (corpus,unseen1207)")
    args = ap.parse_args()
    names = list(dict.fromkeys(n.strip() for n in args.set.split(",") if n.strip()))   # (a set named twice: once)
    unknown = [n for n in names if n not in SETS]
    if not names or unknown:
        print(f"corpus_score: no such set: {', '.join(unknown) or repr(args.set)} "
              f"(choose from {', '.join(sorted(SETS))})", file=sys.stderr)
        return 2
    jobs = tuple(j for n in names for j in SETS[n])
    dirs = [pathlib.Path(d) for d in args.dirs]
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        print(f"corpus_score: no such folder: {', '.join(missing)} (give corpus_run's folders)", file=sys.stderr)
        return 2
    # one rule for every variant: the first directory that has it (its recording, its log, its row)
    results = {}
    for d in dirs:
        f = d / "results.jsonl"
        if f.exists():
            for line in f.read_text().splitlines():
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if (d / f"{r['job']}-{r['variant']}.gtrec").exists() or (d / f"{r['job']}-{r['variant']}.log").exists():
                    results.setdefault((r["job"], r["variant"]), r)
    # the steps/s are read again from each job's own log (the raw evidence), so a better reading
    # of the logs (a rate line after a progress bar's carriage return) applies to old runs too,
    # and a variant whose call was cut short (its log, no row) is measured too
    for job in jobs:
        for variant in ("as_is", "fixed", "second"):
            stem = f"{job.name}-{variant}.log"
            log = next((d / stem for d in dirs if (d / stem).exists()), None)
            if log is not None:
                row = results.setdefault((job.name, variant), {"job": job.name, "variant": variant})
                row["steps_per_s"] = steady_rate(log.read_text(errors="replace"))[0]
    rows = []
    for j in jobs:
        try:
            row = score_job(j, dirs, results)
        except (RecordingError, OSError) as e:   # a damaged recording: that job is not judged, the rest are
            print(f"corpus_score: {j.name} not judged: {e}", file=sys.stderr)
            continue
        if row is not None:
            rows.append(row)
    print(f"{'job':26s} {'cause':15s} {'as is':15s} {'pred':>6s} {'meas':>6s} {'fixed':15s} {'late':15s}")
    for r in rows:
        a, f = r["as_is"], r.get("fixed") or {}
        pred = f"{a['gain'] * 100:.0f}%" if a.get("gain") is not None else "-"
        meas = f"{r['measured_gain'] * 100:.0f}%" if r["measured_gain"] is not None else "-"
        mark = "--" if r["refuted"] else "ok" if r["right"] else "XX"
        print(f"{r['job'][:26]:26s} {str(r['cause'])[:15]:15s} {str(a['primary'])[:12]:12s} {mark} {pred:>6s} "
              f"{meas:>6s} {str(f.get('primary'))[:15]:15s} {str((r.get('late') or {}).get('primary'))[:15]:15s}"
              + (" H" if r["holdout"] else ""))
    seconds = second_fixes(jobs, dirs, results, {r["job"]: r for r in rows})
    for label, sel in (("tuning", [r for r in rows if not r["holdout"]]),
                       ("held out", [r for r in rows if r["holdout"]]), ("all", rows)):
        print(f"{label} ({len(sel)} jobs):")
        print("\n".join(summary(sel)))
    if seconds:
        print("\n".join(seconds))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
