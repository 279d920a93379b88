"""Hostile summary frames (issue 32): a recording's S frame is read like its samples, every field
checked, so a frame no recorder writes costs its own use (the report reads the samples instead)
and never a traceback, a wrong report or a diff that exits 1 ("B is slower")."""

from __future__ import annotations

import copy
import json
import pathlib
import subprocess
import sys

import pytest

from gputop.session.recording_format import _FRAME_HEADER, FRAME_SUMMARY, json_frame
from gputop.session.recording_reader import RecordingReader
from gputop.verdicts.recording_summary import rules_fingerprint

SRC = pathlib.Path(__file__).resolve().parent / "data" / "h200" / "calm4" / "hf_trainer-pid.gtrec"


def _hostile(tmp_path, name: str, mutate) -> pathlib.Path:
    """SRC with its last summary frame rewritten by ``mutate`` (checksum made right again, so the
    reader trusts the frame and only its content is wrong)."""
    data = SRC.read_bytes()
    with RecordingReader(str(SRC)) as r:
        ref = r.index.summaries[-1]
        obj = copy.deepcopy(r.read_summary(ref))
    obj["final"]["rules"] = rules_fingerprint()   # as if today's gputop had written it
    mutate(obj)
    out = data[:ref.offset] + json_frame(FRAME_SUMMARY, obj) + data[ref.offset + _FRAME_HEADER.size + ref.length:]
    p = tmp_path / f"{name}.gtrec"
    p.write_bytes(out)
    return p


def _no_state(o):
    for row in o["stats"]["health"]:
        row[2].pop("state", None)


def _worst_none(o):
    for row in o["stats"]["health"]:
        row[1] = None


def _final_report_keys(o):
    o["final"]["session"] = "x"
    o["final"]["primary_verdict"] = {"id": "gpu_bound"}


def _gpu_name_dict(o):
    o["stats"]["last"] = [[k, kk, ({**v, "name": {"a": 1}} if k == "gpu_info" else v)]
                          for k, kk, v in o["stats"]["last"]]


@pytest.fixture(scope="module")
def good() -> dict:
    """The report of SRC itself (the same for every mutation: made once)."""
    return json.loads(subprocess.run([sys.executable, "-m", "gputop", "report", str(SRC), "--json"],
                                     capture_output=True, text=True, timeout=120).stdout)


@pytest.mark.parametrize("mutate", [_no_state, _worst_none, _final_report_keys, _gpu_name_dict],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_hostile_summary_frame_costs_its_own_use_only(tmp_path, mutate, good):
    path = _hostile(tmp_path, mutate.__name__.strip("_"), mutate)
    for args in (["report", str(path)], ["report", str(path), "--json"], ["diff", str(path), str(SRC)]):
        out = subprocess.run([sys.executable, "-m", "gputop", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (args, out.stderr[-2000:])
        assert "Traceback" not in out.stderr
        if args[-1] == "--json":
            rep = json.loads(out.stdout)
            assert isinstance(rep["session"], dict) and rep["session"]["file"] == str(path)
            assert rep["primary_verdict"]["id"] == good["primary_verdict"]["id"]
            assert all(isinstance(g.get("name"), (str, type(None))) for g in rep["gpus"])
            assert all(isinstance(v.get("state"), str) for v in rep["sources"].values())
