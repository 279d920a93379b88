"""Small scenes whose threads sit in known places, for capturing real py-spy output
(tests/data/pyspy/capture.py) and for the kernel wait-class tests (tests/test_stacks.py).

    python stacks_scenes.py waits      # threads blocked in well-known ways, named after them
    python stacks_scenes.py item       # main thread on a line ending in .item() (CPU tensors)
    python stacks_scenes.py gloo       # 2 ranks on torch.distributed/gloo: rank 0 in barrier()
    python stacks_scenes.py cuda       # main thread in torch.cuda.synchronize() (needs CUDA)
    python stacks_scenes.py cuda-item  # main thread in loss.item() after GPU work (needs CUDA)

Prints one JSON line once everything is in place: {"pid": ..., "threads": {name: native id}}.
"""

from __future__ import annotations

import json
import os
import queue
import select
import socket
import sys
import threading
import time

READY: dict[str, int] = {}


def ready(name: str) -> None:
    READY[name] = threading.get_native_id()


def announce(pid: int | None = None) -> None:
    sys.stdout.write(json.dumps({"pid": pid or os.getpid(), "threads": READY}) + "\n")
    sys.stdout.flush()


def t_sleep() -> None:
    ready("sleeper")
    while True:
        time.sleep(10)


def t_queue(q: queue.Queue) -> None:
    ready("queue_get")
    q.get()


def t_event(e: threading.Event) -> None:
    ready("event_wait")
    e.wait()


def t_lock(lock) -> None:
    ready("lock_acquire")
    lock.acquire()


def t_select(r: int) -> None:
    ready("select")
    select.select([r], [], [])


def t_read(r: int) -> None:
    ready("pipe_read")
    os.read(r, 1)


def t_accept(srv: socket.socket) -> None:
    ready("socket_accept")
    srv.accept()


def t_spin() -> None:
    ready("spinner")
    x = 0
    while True:
        x += 1


def waits() -> None:
    ready("main")
    held = threading.Lock()
    held.acquire()
    r1, _w1 = os.pipe()
    r2, _w2 = os.pipe()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    targets = [(t_sleep, ()), (t_queue, (queue.Queue(),)), (t_event, (threading.Event(),)), (t_lock, (held,)),
               (t_select, (r1,)), (t_read, (r2,)), (t_accept, (srv,)), (t_spin, ())]
    for fn, args in targets:
        threading.Thread(target=fn, args=args, name=fn.__name__[2:], daemon=True).start()
    while len(READY) < len(targets) + 1:
        time.sleep(0.01)
    time.sleep(0.2)
    announce()
    x = 0
    while True:  # the main thread: pure Python, contending with the spinner for the GIL
        x = (x + 1) % 1000003


def item() -> None:
    import torch
    torch.set_num_threads(1)
    big = torch.ones(4_000_000)
    ready("main")
    announce()
    total = 0.0
    while True:
        total += (big * 1.5).sum().item()


def gloo() -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    port = _free_port()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    other = ctx.Process(target=_gloo_rank, args=(1, port, q), daemon=True)
    other.start()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=2)
    ready("main")
    announce()
    while True:
        dist.barrier()  # rank 1 arrives only every 30 s: rank 0 waits here


def _gloo_rank(rank: int, port: int, q) -> None:
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    while True:
        time.sleep(30)
        dist.barrier()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cuda(kind: str) -> None:
    import torch
    m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ready("main")
    announce()
    while True:
        for _ in range(20):
            y = m @ w
        if kind == "cuda":
            torch.cuda.synchronize()
        else:
            loss = y.float().mean()
            loss.item()


if __name__ == "__main__":
    scene = sys.argv[1] if len(sys.argv) > 1 else "waits"
    if scene == "waits":
        waits()
    elif scene == "item":
        item()
    elif scene == "gloo":
        gloo()
    elif scene in ("cuda", "cuda-item"):
        cuda(scene)
    else:
        raise SystemExit(f"unknown scene {scene!r}")
