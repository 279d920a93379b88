"""What the probe client publishes from the in-process probe: the numeric fields of its samples.

Kept apart from gputop/sources/probe_client.py (which needs psutil) so that the exporter, the UI
and the docs test can read them. docs/metrics.md ("In-process probe") says how each is measured.
"""

from __future__ import annotations

from gputop.catalogue import KIND_PROBE_MEMORY, KIND_PROBE_STEP, KIND_PROBE_SYNC, MetricSpec


def _spec(kind: str, field: str, unit: str, label: str, help: str, prom: str, prom_help: str,
          counter: bool = False) -> MetricSpec:
    return MetricSpec(kind=kind, field=field, unit=unit, label=label, help=help, aggregate=not counter,
                      prom=prom, prom_help=prom_help, counter=counter)


# The probe's copies between host and GPU, per step (gputop/probe/flops.py): one home for the
# field names, ``copy_<way>_<what>``, read by probe_messages, derive/steps and the specs below.
COPY_WAYS = (("d2h", "device->host"), ("h2d", "host->device"))
COPY_WHATS = ("bytes", "pageable_bytes", "ms", "n")
COPY_FIELDS = tuple(f"copy_{way}_{what}" for way, _ in COPY_WAYS for what in COPY_WHATS)


def _step(*args, **kw) -> MetricSpec:
    return _spec(KIND_PROBE_STEP, *args, **kw)


def _memory(*args, **kw) -> MetricSpec:
    return _spec(KIND_PROBE_MEMORY, *args, **kw)


METRICS: list[MetricSpec] = [
    _step("steps_per_s", "/s", "steps/s", "training steps per second (optimizer steps or gputop.probe.step())",
          "probe_steps_per_second", "Training steps per second over the probe's last window (~1 s)."),
    _step("step_ms_mean", "ms", "step", "wall time between step boundaries, mean over the window",
          "probe_step_seconds_mean", "Mean wall time of a step in the last window, in seconds."),
    _step("step_ms_p50", "ms", "step p50", "median wall time between step boundaries in the window",
          "probe_step_seconds_p50", "Median step time in the last window, in seconds."),
    _step("step_ms_max", "ms", "step max", "longest step in the window",
          "probe_step_seconds_max", "Longest step in the last window, in seconds."),
    _step("data_wait_ms", "ms", "data wait ms", "time per step blocked in next() on a DataLoader",
          "probe_data_wait_seconds_per_step",
          "Time per step the loop waited for the DataLoader (blocked in next()), in seconds."),
    _step("data_wait_share", "", "data wait", "share of step time blocked in next() on a DataLoader",
          "probe_data_wait_ratio", "Share of step time spent waiting for data, 0-1."),
    _step("gpu_ms_mean", "ms", "GPU", "span on the CUDA stream from the step's first batch to its end (CUDA events)",
          "probe_gpu_seconds_per_step", "GPU time span per step on the current CUDA stream (CUDA events), in seconds."),
    _step("other_ms", "ms", "other", "step time minus data wait minus GPU time: host work the GPU did not cover",
          "probe_other_seconds_per_step",
          "Step time neither waiting for data nor covered by GPU time (Python, launches), in seconds."),
    _step("batches_per_s", "/s", "batches/s", "DataLoader batches handed to the loop per second",
          "probe_batches_per_second", "DataLoader batches handed to the loop per second."),
    _step("samples_per_s", "/s", "samples/s", "samples per second (leading dimension of each batch)",
          "probe_samples_per_second", "Samples (leading batch dimension) per second."),
    _step("syncs_per_step", "", "syncs/step", "implicit device syncs per step (CUDA sync debug mode)",
          "probe_implicit_syncs_per_step", "Implicit host-device synchronisations per step (torch's sync debug mode)."),
    _step("compile_s", "s", "compiling", "seconds torch.compile spent compiling in the window (dynamo's own record)",
          "probe_compile_seconds", "Seconds torch.compile spent compiling in the probe's last window."),
    _step("recompiles_total", "", "recompiles", "torch.compile recompiles (failed guards) since the probe loaded",
          "probe_recompiles", "torch.compile recompiles (a guard failed) since the probe loaded.", counter=True),
    _step("dropped", "", "dropped steps", "steps lost from the probe's bounded buffer in the window",
          "probe_dropped_steps", "Steps lost from the probe's bounded buffer in the last window."),
    _step("probe_cpu_pct", "%", "probe CPU", "CPU time of the probe's own thread in the training process (100 = one core)",
          "probe_thread_cpu_seconds_per_second",
          "CPU time of the probe's own thread in the training process, seconds per second."),
    _step("window_s", "s", "probe window", "length of the probe's window", "probe_window_seconds",
          "Length of the probe's last window, in seconds."),
    _step("step_total", "", "steps", "steps since the probe loaded in the process", "probe_steps",
          "Steps since the probe loaded in the process.", counter=True),
    _step("batch_total", "", "batches", "DataLoader batches since the probe loaded", "probe_batches",
          "DataLoader batches since the probe loaded.", counter=True),
    _step("sample_total", "", "samples", "samples since the probe loaded", "probe_samples",
          "Samples since the probe loaded.", counter=True),
    # One counted step's FLOPs (gputop/probe/flops.py), repeated in every window until a re-count.
    MetricSpec(KIND_PROBE_STEP, "flops_per_step", "FLOP", "FLOPs/step",
               "model FLOPs of one training step, counted by torch's FlopCounterMode on one sampled step",
               aggregate=False, prom="probe_flops_per_step",
               prom_help="Model FLOPs of one training step (fwd+bwd+optimizer), counted in the job by "
                         "torch.utils.flop_counter.FlopCounterMode on one sampled step."),
    MetricSpec(KIND_PROBE_STEP, "flops_dtype", "", "compute dtype",
               "dtype class (bf16, fp16, tf32, fp32, fp8) of most of the counted FLOPs", aggregate=False),
    MetricSpec(KIND_PROBE_STEP, "flops_by_dtype", "FLOP", "FLOPs by dtype",
               "the counted step's FLOPs per dtype class (a dict)", aggregate=False),
    MetricSpec(KIND_PROBE_STEP, "flops_step", "", "FLOPs counted at", "the step whose FLOPs were counted",
               aggregate=False),
    MetricSpec(KIND_PROBE_STEP, "flops_count_ms", "ms", "FLOP count cost",
               "wall time of the counted step (under FlopCounterMode): compare with step_ms_mean",
               aggregate=False, prom="probe_flops_counted_step_seconds",
               prom_help="Wall time of the one step counted under FlopCounterMode, in seconds (its cost)."),
    MetricSpec(KIND_PROBE_STEP, "flops_varies", "", "shapes vary",
               "the batches' shapes kept changing: the count is of the latest counted step's shapes", aggregate=False),
    MetricSpec(KIND_PROBE_STEP, "flops_off", "", "FLOPs n/a", "why there is no FLOP count (None when there is)",
               aggregate=False),
    # The latest kernel trace (gputop/probe/kernel_sample.py; opt-in), repeated in every window.
    MetricSpec(KIND_PROBE_STEP, "kernel_ms_per_step", "ms", "kernels/step",
               "the GPU's kernel time per step: the kernels of a short CUDA trace back to back (their union, the "
               "GPU's own gap between two counted) over the steps it saw (GPUTOP_KERNEL_SAMPLE=1)", aggregate=False, prom="probe_kernel_seconds_per_step",
               prom_help="GPU kernel time per training step from the probe's latest CUDA kernel trace, in seconds."),
    MetricSpec(KIND_PROBE_STEP, "kernel_sample_age_s", "s", "kernel sample age",
               "seconds since that trace", aggregate=False),
    MetricSpec(KIND_PROBE_STEP, "kernel_off", "", "kernels n/a", "why there is no kernel sample (None when there is)",
               aggregate=False),
    # The counted step's copies between host and GPU (gputop/probe/flops.py), per step, repeated
    # until a re-count: bytes each way, the part from or to pageable host memory, the host time.
    *(MetricSpec(KIND_PROBE_STEP, f"copy_{way}_{what}", unit, f"{way.upper()} {label}",
                 f"{words} per step, {what_help} (the counted step)", aggregate=False,
                 prom=f"probe_copy_{way}_{prom}" if prom else "",
                 prom_help=f"{words} per training step, {what_help}, counted on one sampled step." if prom else "")
      for way, words in ((w, "host-to-device copies" if w == "h2d" else "device-to-host copies") for w, _ in COPY_WAYS)
      for what, unit, label, what_help, prom in (
          ("bytes", "B", "copied", "bytes", "bytes_per_step"),
          ("pageable_bytes", "B", "pageable", "bytes from or to pageable (unpinned) host memory",
           "pageable_bytes_per_step"),
          ("ms", "ms", "copy time", "host time the copies held their thread (an upper bound)",
           "seconds_per_step"),
          ("n", "", "copies", "copy ops", "ops_per_step"))),
    _memory("allocated", "B", "CUDA allocated", "CUDA caching allocator: memory allocated now",
            "probe_cuda_memory_allocated_bytes", "CUDA caching allocator: memory allocated now, in bytes."),
    _memory("reserved", "B", "CUDA reserved", "CUDA caching allocator: memory reserved now",
            "probe_cuda_memory_reserved_bytes", "CUDA caching allocator: memory reserved now, in bytes."),
    _memory("peak_allocated", "B", "CUDA peak alloc", "peak allocated memory since the process started (or its last reset)",
            "probe_cuda_memory_peak_allocated_bytes",
            "Peak allocated memory since the process started (or its last reset_peak_memory_stats), in bytes."),
    _memory("peak_reserved", "B", "CUDA peak reserved", "peak reserved memory", "probe_cuda_memory_peak_reserved_bytes",
            "Peak reserved memory, in bytes."),
    _memory("alloc_retries", "", "alloc retries", "cudaMalloc retries after freeing cached memory",
            "probe_cuda_alloc_retries", "cudaMalloc retries after freeing cached memory.", counter=True),
    _memory("ooms", "", "OOMs", "CUDA out-of-memory errors the allocator raised", "probe_cuda_ooms",
            "CUDA out-of-memory errors the allocator raised.", counter=True),
    _memory("device_allocs", "", "cudaMallocs", "cudaMalloc calls the caching allocator made (cuMemMap with "
            "expandable segments; before torch 2.13, the segments it created); none in a steady job once its cache "
            "is built", "probe_cuda_device_allocs",
            "cudaMalloc calls the CUDA caching allocator made.", counter=True),
    _memory("device_frees", "", "cudaFrees", "cudaFree calls the caching allocator made (cuMemUnmap with "
            "expandable segments; before torch 2.13, the segments it freed): a retry or empty_cache() frees its "
            "cached segments", "probe_cuda_device_frees",
            "cudaFree calls the CUDA caching allocator made.", counter=True),
    # Collectives of DDP / FSDP / explicit torch.distributed calls (gputop/probe/collectives.py).
    _step("collective_ms", "ms", "collectives", "time per step in collectives: the union of each op's issue-to-completion span",
          "probe_collective_seconds_per_step", "Time per step in torch.distributed collectives (DDP buckets, FSDP, "
          "explicit calls), union of their spans, in seconds."),
    _step("collective_exposed_ms", "ms", "coll exposed", "collective time per step no compute overlaps: sync calls plus "
          "the tail after the step's last async issue (DDP: after backward's last bucket)",
          "probe_collective_exposed_seconds_per_step",
          "Collective time per step not overlapped with compute (waited for), in seconds."),
    _step("collective_share", "", "coll share", "share of step time in collectives",
          "probe_collective_ratio", "Share of step time in torch.distributed collectives, 0-1."),
    _step("collective_wait_share", "", "coll wait", "share of step time waiting for collectives (exposed)",
          "probe_collective_wait_ratio", "Share of step time waiting for collectives (not overlapped with compute), 0-1."),
    _step("collective_mib_per_step", "MiB", "coll MiB/step", "bytes handed to collectives per step",
          "probe_collective_mebibytes_per_step", "MiB handed to torch.distributed collectives per step."),
    _step("collective_bucket_mib_max", "MiB", "DDP bucket max", "largest DDP gradient bucket in the window",
          "probe_ddp_bucket_mebibytes_max", "Largest DDP gradient bucket all-reduced in the last window, in MiB."),
    # Sent on change only; served with the labels of the process's probe_step series.
    _spec(KIND_PROBE_SYNC, "total", "", "implicit syncs", "implicit host-device syncs since the probe loaded",
          "probe_implicit_syncs",
          "Implicit host-device synchronisations since the probe loaded (torch's sync debug mode).", counter=True),
]

# The allocator fields a probe_memory sample carries: the client forwards each of these, the specs
# above say what each is (a field added to the probe is declared once, here)
MEMORY_FIELDS = tuple(m.field for m in METRICS if m.kind == KIND_PROBE_MEMORY)
