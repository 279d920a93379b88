"""A GPU-bound bf16 MLP loop that pushes its metrics to a collector over HTTP once a second.

Cause (loop_blocked): the push is a synchronous POST to a collector (a local server here) that
takes ~0.3 s to answer; the loop waits on the socket and the GPU idles ~30% of the time.
Fix (--fixed): the loop hands each record to a background thread's queue, which does the POST.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import http.server
import json
import queue
import threading
import time
import urllib.request

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"


class SlowCollector(http.server.BaseHTTPRequestHandler):
    """Stands in for a metrics gateway on the network that is slow to answer."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(0.3)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowCollector)
threading.Thread(target=server.serve_forever, name="collector", daemon=True).start()
URL = f"http://127.0.0.1:{server.server_address[1]}/metrics"


def push(record):
    body = json.dumps(record).encode()
    req = urllib.request.Request(URL, data=body, headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()


outbox = queue.Queue()


def pusher():
    while True:
        push(outbox.get())


threading.Thread(target=pusher, name="pusher", daemon=True).start()

width, depth, batch = pick((8192, 4, 8192), (256, 2, 256))
dtype = torch.bfloat16 if gpu else torch.float32
layers = []
for _ in range(depth):
    layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).to(device, dtype)
opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
x = torch.randn(batch, width, device=device, dtype=dtype)
y = torch.randint(0, 10, (batch,), device=device)

meter = Meter(args.seconds, args.report_every)
step, last_push = 0, time.time()
while True:
    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    step += 1
    if time.time() - last_push >= 1.0:
        last_push = time.time()
        record = {"step": step, "loss": loss.item(), "time": last_push}
        if args.fixed:
            outbox.put(record)  # the fix: the pusher thread waits on the collector, not the loop
        else:
            push(record)  # as is: the loop waits ~0.3 s for the collector's answer
    if not meter.step():
        break
meter.done()
