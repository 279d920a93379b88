"""What a probe window's ``coll_*`` fields become in a ``probe_step`` sample (issue 17).

The probe side is gputop/probe/collectives.py (how each number is measured: docs/probe.md,
"Collectives"). Values are checked like every other probe number; a window without ``coll_*``
fields (a process that never used torch.distributed, an older probe) gives no collective fields
at all, so that "unknown" never reads as zero.
"""

from __future__ import annotations

from gputop.sources.probe_messages import MAX_STR, _int, _num, _r, _str

MIB = 1024.0 * 1024.0


def collective_step_data(w: dict, step_n: int, step_sum: float | None) -> dict:
    """The collective fields of a ``probe_step`` sample from window message ``w``."""
    if "coll_s" not in w and "coll_off" not in w:
        return {}
    off = _str(w.get("coll_off"))
    coll_s, exposed = _num(w.get("coll_s")), _num(w.get("coll_exposed_s"))
    if coll_s is None or exposed is None or coll_s < 0 or exposed < 0:
        return {"collective_off": off} if off else {}
    n = _int(w.get("coll_n")) or 0
    nbytes = _int(w.get("coll_bytes")) or 0
    buckets = _int(w.get("coll_bucket_n")) or 0
    ops = w.get("coll_ops") if isinstance(w.get("coll_ops"), dict) else {}
    clean_ops = {}
    for name, v in list(ops.items())[:16]:
        if isinstance(v, list) and len(v) == 3 and _int(v[0]) is not None and _num(v[2]) is not None:
            clean_ops[str(name)[:40]] = [_int(v[0]), _int(v[1]) or 0, _r(_num(v[2]), 6)]
    top = max(clean_ops.items(), key=lambda kv: kv[1][2])[0] if clean_ops else None

    def per_step(x, scale=1.0, nd=3):
        return _r(x / step_n * scale, nd) if (step_n and x is not None) else None

    return {
        "collective_steps": _int(w.get("coll_steps")),
        "collective_s_sum": _r(coll_s, 6),
        "collective_exposed_s_sum": _r(exposed, 6),
        "collective_ms": per_step(coll_s, 1000.0),
        "collective_exposed_ms": per_step(exposed, 1000.0),
        "collective_share": _r(min(1.0, coll_s / step_sum), 4) if step_sum else None,
        "collective_wait_share": _r(min(1.0, exposed / step_sum), 4) if step_sum else None,
        "collective_ops_per_step": per_step(n),
        "collective_mib_per_step": per_step(nbytes, 1.0 / MIB, 4),
        "collective_buckets_per_step": per_step(buckets),
        "collective_bucket_mib_max": _r((_int(w.get("coll_bucket_max")) or 0) / MIB, 4) if buckets else None,
        "collective_untimed": _int(w.get("coll_untimed")),
        "collective_ops": clean_ops,
        "collective_top_op": top[:MAX_STR] if top else None,
        "collective_off": off,
    }
