"""``gputop diff`` as plain text: the conclusion first, then the tables it rests on."""

from __future__ import annotations

from gputop.report import fmt_value
from gputop.session.sanitize import printable

COL = 14


def render_text(d: dict) -> str:
    lines = [f"gputop diff — A: {d['a']['file']}", f"              B: {d['b']['file']}"]
    lines += [f"  warning  {w}" for w in d["warnings"]]
    lines += ["", d["conclusion"], ""]
    st = d["steps"]
    lines.append(_row("", "A", "B", "change"))
    lines.append(_row("steps/s (training)", _v(st.get("a"), "/s"), _v(st.get("b"), "/s"), _change(st)))
    sm = st.get("step_ms") or {}
    if sm:
        lines.append(_row("step time, mean", _v(sm.get("a"), "ms"), _v(sm.get("b"), "ms"), _change(sm)))
    for side in ("a", "b"):
        s = d[side]
        windows = f", {st.get('windows_' + side)} windows of {st['window_s']:.1f} s" if st.get("window_s") else ""
        lines.append(f"  {side.upper()}: {s['steps']} timed steps over {_v(s.get('training_s'), 's')} of training"
                     + windows)
    if st.get("why_none"):
        lines.append(f"  no interval: {st['why_none']}")
    else:
        lines.append(f"  interval: {st['method']} ({st['level'] * 100:.0f}%; no change when it includes 0 or lies "
                     f"within +-{st['equivalence_pct']:.0f}%)")
    if d["step_split"]:
        lines += ["", "Per step (probe)"]
        lines += [_row(r["name"], _v(r["a"], r["unit"]), _v(r["b"], r["unit"]), _delta(r["a"], r["b"], r["unit"]))
                  for r in d["step_split"] if r["name"] != "step time"]
    bud = d["budget"]
    if bud["rows"]:
        lines += ["", "Time budget of training (share of wall time)"]
        lines += [_row(r["label"], _v(_pc(r["a"]), "%"), _v(_pc(r["b"]), "%"), _delta(_pc(r["a"]), _pc(r["b"]), "pt"))
                  for r in bud["rows"]]
    else:
        missing = " and ".join(n for n in ("A", "B") if not bud[n.lower()]) or "A and B"
        lines += ["", f"Time budget of training: n/a in {missing} (it needs Python stacks from py-spy)"]
    ver = d["verdicts"]
    if ver["rows"]:
        lines += ["", f"Verdicts (active share of the judged time; present at >= {ver['present_share'] * 100:.0f}%)"]
        for r in ver["rows"]:
            mark = "  appeared" if r["id"] in ver["appeared"] else "  vanished" if r["id"] in ver["vanished"] else ""
            lines.append(_row(r["id"], _v(_pc(r["a"]), "%"), _v(_pc(r["b"]), "%"), mark.strip()))
        prim = ver["primary"]
        lines.append(f"  primary: A {prim['a'] or 'none'}, B {prim['b'] or 'none'}")
    changed = d["settings"]["changed"]
    lines += ["", f"Settings ({len(d['settings']['compared'])} compared, {len(changed)} changed)"]
    for c in changed:
        a, b = _show(c["a"]), _show(c["b"])
        if max(len(a), len(b)) > COL:   # a command line: one line per side
            lines += [f"  {c['name']}", f"    A: {a}", f"    B: {b}"]
        else:
            lines.append(_row(c["name"], a, b, ""))
    if not changed:
        lines.append("  none changed")
    if d["gpu"]:
        lines += ["", "GPU counters over the training part (mean; power summed over the GPUs)"]
        lines += [_row(r["label"], _v(r["a"], r["unit"]), _v(r["b"], r["unit"]), _delta(r["a"], r["b"], r["unit"]))
                  for r in d["gpu"]]
    en = d["energy"]
    lines += ["", f"Energy per step: A {_v(en.get('a'), 'J')}, B {_v(en.get('b'), 'J')}"
              + (f" ({en['method']})" if not en.get("why_none") else f" (n/a: {en['why_none']})")]
    return "\n".join(printable(line, 2000) for line in lines) + "\n"


def _row(name: str, a: str, b: str, c: str) -> str:
    return f"  {name[:34]:<34} {a[:COL * 2]:>{COL}} {b[:COL * 2]:>{COL}}  {c}".rstrip()


def _v(x, unit: str) -> str:
    if x is None:
        return "n/a"
    if unit == "%":
        return f"{x:.1f}%"
    return fmt_value(x, unit)


def _pc(x):
    return None if x is None else x * 100


def _change(st: dict) -> str:
    if st.get("change_pct") is None:
        return ""
    ci = st.get("ci_pct")
    return f"{st['change_pct']:+.1f}%" + (f" (CI {ci[0]:+.1f}% to {ci[1]:+.1f}%)" if ci else "")


def _delta(a, b, unit: str) -> str:
    if a is None or b is None:
        return ""
    if unit in ("%", "pt"):
        return f"{b - a:+.1f} pt"
    return f"{(b / a - 1) * 100:+.0f}%" if a else ""


def _show(v) -> str:
    return "n/a" if v is None else str(v)
