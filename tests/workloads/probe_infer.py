"""A small CPU inference job for the probe's forward steps: no optimizer, a model called once per
batch from a DataLoader under inference_mode, and a second instance of the same class called
beside it (a teacher, an EMA copy: not the model the loop is about). It measures itself.

After --seconds of calls it checks, as a user's code would, that the model can still be deep
copied and saved with torch.save (the probe must leave nothing of its own on the instance), then
writes a JSON file (--out): the monotonic time at the end of each call of the model, the class's
``__call__`` as it found it then, and the saved model's byte count.

  --wait-monitor S   wait up to S seconds for a probe monitor before the loop.
  --hold-file PATH   after writing --out, wait until PATH exists.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import sys
import time

import torch


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.body(x))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--sample-ms", type=float, default=0.5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--wait-monitor", type=float, default=0.0)
    ap.add_argument("--hold-file", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch.utils.data as tud

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from probe_train import Slow

    torch.manual_seed(0)
    model, teacher = Classifier().eval(), Classifier().eval()
    loader = tud.DataLoader(Slow(args.sample_ms / 1000.0), batch_size=args.batch_size)
    if args.wait_monitor:
        import gputop.probe
        deadline = time.monotonic() + args.wait_monitor
        while time.monotonic() < deadline and not gputop.probe.status().get("monitoring"):
            time.sleep(0.05)

    calls: list[float] = []
    agree = 0
    end = time.monotonic() + args.seconds
    with torch.inference_mode():
        for x, _ in loader:
            pred = model(x).argmax(1)
            calls.append(time.monotonic())
            agree += int((teacher(x).argmax(1) == pred).sum())
            if time.monotonic() >= end:
                break
    call_seen = type(model).__dict__.get("__call__")
    twin = copy.deepcopy(model)            # an EMA copy, as a user makes one
    buf = io.BytesIO()
    torch.save(model, buf)                 # the whole module pickled, hooks dicts included
    with torch.inference_mode():
        again = model(x)                   # (a call of the model too: its time is kept)
        calls.append(time.monotonic())
        twin_ok = bool(torch.equal(twin(x), again))
    result = {"pid": os.getpid(), "calls": calls, "agree": agree,
              "class_call": getattr(call_seen, "__qualname__", None),
              "hooks_on_model": len(model._forward_hooks) + len(model._forward_pre_hooks),
              "twin_ok": twin_ok,
              "saved_bytes": buf.tell()}
    with open(args.out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(args.out + ".tmp", args.out)
    if args.hold_file:
        deadline = time.monotonic() + 60
        while not os.path.exists(args.hold_file) and time.monotonic() < deadline:
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
