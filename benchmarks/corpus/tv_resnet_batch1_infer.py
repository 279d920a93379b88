"""Offline inference with a torchvision ResNet-50 at batch size 1 (eval, inference_mode, a bf16
model in channels_last): one image at a time, top-1 labels kept on the GPU, read every 100.

Cause (launch_bound): a forward is ~170 small kernels (conv, batch norm, ReLU, add) of a few
microseconds each at batch 1; issuing them from Python takes longer than running them.
Fix (--fixed): capture the forward once in a torch.cuda.CUDAGraph and replay it per image.
"""
import sys, os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: E401,E702

import torchvision

from common import Meter, parse, pick, torch_and_device

args = parse(__doc__)
torch, device = torch_and_device()
gpu = device.type == "cuda"
torch.backends.cudnn.benchmark = True
dtype = torch.bfloat16 if gpu else torch.float32
size = pick(224, 64)

model = torchvision.models.resnet50(weights=None).eval().to(device, dtype, memory_format=torch.channels_last)
# A queue of already preprocessed single-image requests, on the device.
images = torch.randn(100, 1, 3, size, size, device=device, dtype=dtype)
images = [im.contiguous(memory_format=torch.channels_last) for im in images]
labels = torch.empty(100, dtype=torch.long, device=device)

forward = model
if args.fixed and gpu:
    # The fix, as the CUDA graphs docs show: warm up on a side stream, then capture the forward
    # with a static input and output; each request is copied in and the graph replayed.
    static_in = torch.zeros_like(images[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        static_out = model(static_in)

    def forward(x):
        static_in.copy_(x)
        graph.replay()
        return static_out

meter = Meter(args.seconds, args.report_every)
i, done = 0, []
with torch.inference_mode():
    while True:
        labels[i % 100] = forward(images[i % 100]).argmax(1)[0]
        i += 1
        if i % 100 == 0:
            done.extend(labels.tolist())  # hand a block of results on (one sync per 100 images)
        if not meter.step():
            break
meter.done()
