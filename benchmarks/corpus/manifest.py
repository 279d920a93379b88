"""The corpus of fixed-and-unfixed jobs (issue 29): every job, its known cause, its one-line fix.

Written before any rule was tuned to it. ``holdout`` jobs (a third, chosen here across families
and causes before tuning) are never looked at while tuning; benchmarks/corpus_score.py reports
their score apart.

``cause`` is the verdict id that must be primary on the job as it is; None for a healthy job,
whose "fix" removes a trap (a busy side thread, pinning, logging, a rare checkpoint...) that costs
nothing: there gputop must name no cause with a predicted gain above 10%, with or without it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Job:
    name: str          # benchmarks/corpus/<name>.py
    family: str        # plain, torchvision, trainer, accelerate, lightning, timm, nanogpt, unet, rnn, recsys
    cause: str | None  # the verdict id that must be primary as it is; None: healthy
    about: str         # the job and its cause in a line
    fix: str           # the one-line fix behind --fixed
    holdout: bool = False
    seconds: float | None = None   # training seconds of each variant, where the run's default is too short
    # other verdict ids accepted as naming the cause: a verdict made after the corpus was written
    # whose advice is the job's own fix. Each was added after seeing the job judged: the score
    # counts such a job right and lists it apart (benchmarks/corpus_score.py, "right under
    # another name")
    also: tuple[str, ...] = ()
    # a second fix, tried where the label's fix left gputop's verdict standing or refuted it: the
    # job's flags for it (benchmarks/corpus_run.py's "second" variant) and what it does. Reported
    # apart by benchmarks/corpus_score.py: the score is always the label's fix's
    second_flags: tuple[str, ...] = ()
    second_fix: str = ""
    # the verdict id of the cause the second fix removes: a label's fix counts as partial (the call
    # on its fixed job right) only where gputop named this cause there, and the second fix measures
    # it (written with the second fix, before the score read it: a review of the sixth session of
    # 2026-12-06 asked for it)
    second_cause: str | None = None
    # seconds the second fix adds before the job's first step (a torch.compile): the run's ceiling
    # grows by as much, so the compile does not eat the steps it is measured by
    second_startup_s: float = 0.0


JOBS: tuple[Job, ...] = (
    # -- a known cause ------------------------------------------------------------------------
    Job("tv_resnet_workers0", "torchvision", "input_bound",
        "torchvision classification reference, ResNet-18, per-sample CPU transforms, num_workers=0",
        "num_workers=10"),
    Job("accelerate_tokenize_main", "accelerate", "input_bound",
        "Accelerate loop on a GPT-2, texts tokenised in the main thread's collate_fn, num_workers=0",
        "num_workers=3"),
    Job("trainer_slow_dataset", "trainer", "input_bound",
        "HF Trainer on a GPT-2, a dataset whose __getitem__ does Python work, dataloader_num_workers=0",
        "dataloader_num_workers=6", holdout=True),
    Job("lightning_workers0", "lightning", "input_bound",
        "Lightning CNN on CPU-augmented images, num_workers=0", "num_workers=12"),
    Job("timm_vit_few_workers", "timm", "input_bound",
        "timm ViT-S with heavy per-sample CPU transforms and 2 DataLoader workers", "num_workers=12"),
    Job("plain_pageable_h2d", "plain", "h2d_copy_bound",
        "a small model fed large float32 batches from pageable host memory every step",
        "pin the host batches once and copy with non_blocking=True", holdout=True),
    Job("rnn_lstmcell_loop", "rnn", "launch_bound",
        "an RNN language model stepping nn.LSTMCell in a Python loop over the time steps",
        "nn.LSTM over the whole sequence (cuDNN)",
        # cuDNN also cuts the GPU's own work (+609% against +187% predicted): does removing the
        # launches alone give what gputop predicts?
        second_flags=("--graph-step",), second_fix="the cells' forward, loss and backward in one CUDA graph",
        second_cause="launch_bound"),
    Job("tv_resnet_batch1_infer", "torchvision", "launch_bound",
        "torchvision ResNet-50 inference at batch size 1", "capture the forward pass in a CUDA graph",
        # 14 s cropped 5 s into training left too little to judge (attached late: no verdict
        # before the end); run again for 30 s (third session of 2026-12-06)
        seconds=30.0),
    Job("small_mlp_launch", "plain", "launch_bound",
        "a 24-layer narrow MLP trained at batch 64: many tiny kernels",
        "torch.cuda.make_graphed_callables on the model", holdout=True,
        # the label's fix left the job launch_bound (CPU 98% busy, GPU 30%): gputop said +139% more
        second_flags=("--graph-step",),
        second_fix="forward, loss and backward in one CUDA graph, the fused optimizer outside",
        second_cause="launch_bound"),
    Job("sync_item_in_loop", "nanogpt", "sync_stall",
        "nanoGPT-style loop reading each layer's activation norm with .item() every step",
        "keep the norms on the GPU and read them every 50 steps",
        # the label's fix gained +1-5% (refuted); gputop named the model's own launches instead
        second_flags=("--compile",), second_fix="torch.compile(mode='reduce-overhead'), no norm watch",
        second_cause="launch_bound"),
    Job("lightning_sync_metrics", "lightning", "sync_stall",
        "Lightning module computing its metrics with .item() and .cpu().numpy() in every training_step",
        "log the metric tensors (self.log) without reading them on the host"),
    Job("gil_metrics_thread", "plain", "gil_contention",
        "a transformer loop beside a telemetry thread doing pure-Python work without pause",
        "the telemetry thread summarises every 5 s instead of spinning", holdout=True,
        # each GIL hand-off waits out the spinning thread's 5 ms switch interval: a step took
        # 3.5-13 s, so 14 s held 2 steps, all in warm-up (its 30 s ceiling); run again for 60 s
        # (third session of 2026-12-06)
        seconds=60.0),
    Job("host_cpu_augment", "plain", "host_bound",
        "a CNN loop that augments each batch with CPU tensor ops in the main thread",
        "augment on the GPU after the copy"),
    Job("recsys_cpu_embedding", "recsys", "host_bound",
        "a recommender whose large embedding tables stay on the CPU (lookups on the main thread)",
        "move the embedding tables to the GPU",
        # optimizer_offload (issue 30) came after this job was written: "SGD holds 100% of its
        # parameters on the CPU ... keep the optimizer there [on the GPU]" is this job's fix, the
        # tables with their sparse SGD moved to the GPU (third session of 2026-12-06)
        also=("optimizer_offload",),
        # the fixed job was judged h2d_copy_bound (+69% on the H200, +58% on an H100): its per-step index copies
        second_flags=("--fixed", "--gpu-batches"),
        second_fix="the tables on the GPU and the batches staged there once",
        second_cause="h2d_copy_bound"),
    Job("ckpt_every_2s", "nanogpt", "io_stall",
        "nanoGPT-style loop saving model and optimizer with torch.save every 2 s",
        "save every 10 minutes", holdout=True,
        # as tv_resnet_batch1_infer: 14 s left too little after a late attach; 30 s
        seconds=30.0),
    Job("trainer_save_steps", "trainer", "io_stall",
        "HF Trainer on a GPT-2 with save_steps=20", "save_steps=100000"),
    Job("push_metrics_blocking", "plain", "loop_blocked",
        "a GPU-bound loop that pushes metrics synchronously (a blocking call of ~0.3 s) every second",
        "push from a background thread"),
    Job("accelerate_log_sleep", "accelerate", "loop_blocked",
        "Accelerate loop whose logger waits on a lock held by a slow background flusher every step",
        "hand records to the flusher through a queue without waiting", holdout=True),
    # -- healthy, with traps ------------------------------------------------------------------
    Job("lightning_resnet_pin", "lightning", None,
        "Lightning ResNet-50, bf16, 8 workers with pin_memory=True (the pin thread waits for the GIL)",
        "pin_memory=False"),
    Job("nanogpt_item_every10", "nanogpt", None,
        "nanoGPT-style GPU-bound loop reading the loss with .item() every 10 steps", "no loss read"),
    Job("logger_thread_light", "plain", None,
        "a GPU-bound transformer with a logging thread waking every 20 ms", "no logging thread", holdout=True),
    Job("overlapped_pinned_copy", "plain", None,
        "large pinned batches copied non_blocking on a side stream while the GPU computes",
        "the data set preloaded on the GPU"),
    Job("trainer_gpt2_large_batch", "trainer", None,
        "HF Trainer on a GPT-2 with a large batch and logging_steps=1", "logging_steps=500"),
    Job("timm_vit_tqdm", "timm", None,
        "timm ViT-B at batch 256 in bf16 with a tqdm progress bar updated every step", "no progress bar",
        holdout=True),
    Job("unet_diffusion_ema", "unet", None,
        "a diffusion UNet (noise prediction) with an EMA of the weights updated every step",
        "EMA every 10 steps"),
    Job("memory_bound_elementwise", "plain", None,
        "a LayerNorm/GELU-heavy model whose kernels are limited by DRAM bandwidth, timed with a "
        "torch.cuda.synchronize() per step", "no synchronize"),
    Job("small_ckpt_every_5s", "lightning", None,
        "a GPU-bound Lightning model saving a 20 MB checkpoint every 5 s", "no checkpoint", holdout=True),
    Job("eval_every_5s", "nanogpt", None,
        "a GPU-bound loop that evaluates for ~1 s every 5 s of training", "no evaluation"),
    Job("accelerate_gpu_bound", "accelerate", None,
        "Accelerate on a GPT-2 with gradient accumulation and clip_grad_norm_ every step",
        "no gradient clipping"),
    Job("dataloader_keeps_up", "torchvision", None,
        "ResNet-50 fed by 8 workers doing moderate CPU transforms that keep up", "16 workers", holdout=True),
)

# Issue 30's causes, each as a job as it is and fixed (not part of issue 29's corpus, scored apart:
# ``--set issue30`` of corpus_run and corpus_score).
ISSUE30: tuple[Job, ...] = (
    Job("gpu_shared_second_job", "plain", "gpu_shared",
        "a GPU-bound GPT-style loop while a second job (detached, not its child) runs bf16 matmuls on the same GPU",
        "the second job runs elsewhere"),
    Job("offload_adamw_cpu", "plain", "optimizer_offload",
        "a bf16 transformer whose fp32 master weights and AdamW live on the host (ZeRO-Offload by hand)",
        "master weights and a fused AdamW on the GPU"),
    Job("amp_fp16_overflow", "plain", "skipped_steps",
        "fp16 autocast whose first matmul overflows: GradScaler skips every step", "bf16 autocast, no scaler"),
    Job("compile_varlen", "plain", "recompilation",
        "torch.compile(dynamic=False) fed a new sequence length every 10 steps", "pad every batch to one length",
        # on the H200 its first compile took 24 s and a recompile 15.7 s: 14 s held one (2026-12-06);
        # 60 s hold ~4, enough for a pattern
        seconds=60.0),
    Job("alloc_thrash_varlen", "plain", "allocator_thrash",
        "a transformer at the edge of GPU memory (~3% headroom) fed a new sequence length every step",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    # written in the fourth session of 2026-12-07, after retries near full memory were measured to cost a few
    # percent at most: the same churn by the user's own hand, without a retry
    Job("nanogpt_empty_cache", "nanogpt", "allocator_thrash",
        "nanoGPT-style loop (GPT-2 small, batch 16 x 1024) calling torch.cuda.empty_cache() after every step",
        "no empty_cache() in the loop"),
    Job("trainer_empty_cache_steps", "trainer", "allocator_thrash",
        "HF Trainer on a GPT-2 small (8 x 1024) with torch_empty_cache_steps=1: empty_cache() inside every step",
        "torch_empty_cache_steps=None"),
    # written after the two above were run and the rule's cost was set from the nanoGPT pair, before
    # this one ran: the unseen check of that cost
    Job("tv_resnet_empty_cache", "torchvision", "allocator_thrash",
        "torchvision ResNet-50 (batch 128, bf16, channels_last) with torch.cuda.empty_cache() after every step",
        "no empty_cache() in the loop"),
    # written after tv_resnet_empty_cache missed (host_bound +36% against +80%) and the cost became the host-side
    # idle plus the driver's work with a rebuild at >= 10 segments a step, before they ran: the second unseen check
    Job("lightning_empty_cache_callback", "lightning", "allocator_thrash",
        "Lightning transformer classifier with a callback calling torch.cuda.empty_cache() after every batch",
        "no cleanup callback"),
    Job("timm_vit_empty_cache", "timm", "allocator_thrash",
        "timm ViT-S/16 at batch 128 (bf16, AdamW) with torch.cuda.empty_cache() after every step",
        "no empty_cache() in the loop"),
    # written after run 3 and the review's changes, before it ran: the third unseen check
    Job("bert_mlm_empty_cache", "plain", "allocator_thrash",
        "BERT-base masked-LM pretraining (batch 32 x 256, bf16, fused AdamW) with torch.cuda.empty_cache() every step",
        "no empty_cache() in the loop"),
)

# Issue 29's second held-out corpus (2026-12-07, seventh session): eight jobs with a known cause, each
# written by a helper that read none of gputop's rules, docs or tests (only benchmarks/corpus/common.py
# and four corpus jobs for the form), from a line naming the recipe, the cause's label and the fix.
# Registered here, with their labels, before any of them ran under gputop; none has been tuned to. All
# are held out: their score is a first look at code nobody tuned the rules to (``--set unseen1207``;
# ``--set corpus,unseen1207`` scores both corpora as one). Listed in the order they run (a call's budget
# drops the last). Two writers timed their jobs bare on an H100 before registering them, and resized
# tv_mobilenet_graph (its gain was over the +20-300% asked) -- never under gputop.
UNSEEN1207: tuple[Job, ...] = (
    Job("tv_mobilenet_graph", "torchvision", "launch_bound",
        "MobileNetV3-Small at batch 64 on 128x128 images, capturable AdamW: hundreds of tiny kernels a step",
        "the whole step in one CUDA graph", holdout=True),
    Job("lightning_grad_norm_items", "lightning", "sync_stall",
        "Lightning GPT (185M, bf16-mixed, batch 16 x 512) logging each parameter's grad norm with .item() (196 a step)",
        "stack the norms on the GPU and log their max as a tensor", holdout=True,
        # second fixes for the three fixed unseen jobs gputop called host_bound (+20% to +57%), each
        # written after those verdicts were read and before it ran (ninth session of 2026-12-07)
        second_flags=("--fixed", "--foreach-norm"),
        second_fix="the label's fix with the norms in one torch._foreach_norm launch (its hottest line)",
        second_cause="host_bound"),
    Job("nvidia_smi_in_loop", "nanogpt", "loop_blocked",
        "nanoGPT GPT-2 small loop running nvidia-smi through subprocess every 5 steps to log memory",
        "torch.cuda.memory_allocated() instead of the subprocess", holdout=True),
    Job("tabular_features_in_loop", "recsys", "host_bound",
        "DLRM-style click model (batch 4096) whose features are hashed and crossed with numpy/md5 inline "
        "on the training thread", "featurize the table once before the loop, on the GPU", holdout=True),
    Job("accelerate_save_state_often", "accelerate", "io_stall",
        "Accelerate GPT-2 medium (bf16, batch 8 x 512) calling accelerator.save_state every 25 steps",
        "checkpointing_steps=5000", holdout=True,
        second_flags=("--fixed", "--compile"), second_fix="the label's fix and torch.compile(model)",
        second_cause="host_bound", second_startup_s=150.0),
    Job("tv_jpeg_decode_few_workers", "torchvision", "input_bound",
        "torchvision reference ResNet-50 (bf16, channels_last, batch 128) on in-memory JPEGs decoded and "
        "augmented by 2 DataLoader workers", "num_workers=14", holdout=True),
    Job("nanogpt_python_metrics_thread", "nanogpt", "gil_contention",
        "nanoGPT GPT-2 small loop handing each batch's targets to a thread counting n-grams in pure Python",
        "the same metrics in a multiprocessing.Process", holdout=True),
    Job("trainer_vit_transforms_workers0", "trainer", "input_bound",
        "HF Trainer ViT-Base/16 (bf16, batch 64) with a torchvision augment pipeline in __getitem__, "
        "dataloader_num_workers=0", "dataloader_num_workers=12", holdout=True,
        second_flags=("--fixed", "--compile"),
        second_fix="the label's fix and TrainingArguments(torch_compile=True)", second_cause="host_bound",
        second_startup_s=150.0),
)

# Issue 29's third held-out corpus (2026-12-07, ninth session): four jobs written the same way, by two
# helpers that read none of gputop's rules, docs or tests (only common.py and four corpus jobs for the
# form), from a line naming the recipe, the cause's label and the fix; none timed on a GPU. Registered
# here, with their labels, before any of them ran under gputop or on a GPU. All held out
# (``--set unseen1207c``).
UNSEEN1207C: tuple[Job, ...] = (
    Job("timm_debug_dump_every_step", "timm", "io_stall",
        "timm ResNet-50 (bf16, channels_last, batch 256 made on the GPU) torch.save-ing ~260 MB of the batch's "
        "images, features and logits with fsync every 5 steps (a leftover debugging hook)",
        "dump every 5000 steps", holdout=True),
    Job("unet3d_pageable_volumes", "plain", "h2d_copy_bound",
        "MONAI-style 3D UNet (bf16) on 2 x 128^3 CT patches whose cache ships float32 images and float32 one-hot "
        "labels (252 MB a batch) from pageable memory with a blocking .to(device)",
        "ship the raw int16 CT and uint8 labels, scale and one-hot on the GPU", holdout=True),
    Job("lightning_audio_stft_workers2", "lightning", "input_bound",
        "Lightning PANNs Cnn14 audio tagging (bf16-mixed, batch 64 of 4 s clips) with resampling, STFT, log-mel "
        "and SpecAugment per sample in __getitem__, num_workers=2", "num_workers=14", holdout=True),
    Job("trainer_gpt2_habits_healthy", "trainer", None,
        "HF Trainer GPT-2 medium (bf16, batch 8 x 1024) with logging_steps=10, the progress bar, a JSON-lines "
        "metrics callback every 20 steps and a psutil sampler thread",
        "logging_steps=1000, no progress bar, no callback writes, no sampler thread", holdout=True),
)

# Issue 29's fourth held-out corpus (2026-12-08, tenth session): six jobs written the same way, by three
# helpers that read none of gputop's rules, docs or tests (only common.py and four corpus jobs for the
# form), from a line naming the recipe, the cause's label and the fix; none timed on a GPU. Registered
# here, with their labels, before any of them ran under gputop or on a GPU, with the rules of the
# commit that registers them. All held out (``--set unseen1208``).
UNSEEN1208: tuple[Job, ...] = (
    Job("moe_expert_loop_sync", "plain", "sync_stall",
        "Mixtral-style MoE LM (8 layers, 32 experts top-4, bf16, batch 8 x 1024) dispatching tokens per expert "
        "with torch.where / index_select (256 device-to-host syncs a forward)",
        "static-shape dispatch: cumsum positions and a scatter into [experts, capacity, d]", holdout=True),
    Job("accelerate_gil_rouge_thread", "accelerate", "gil_contention",
        "Accelerate GPT-2 small (bf16, batch 16 x 512) with a thread scoring each batch's texts with pure-Python "
        "ROUGE-1/2/L", "the same scorer in a multiprocessing process", holdout=True),
    Job("lightning_psutil_stats_callback", "lightning", "loop_blocked",
        "Lightning ViT-B/16 (bf16-mixed, batch 128, 8 workers) with a callback logging "
        "psutil.cpu_percent(interval=0.1) every batch", "psutil.cpu_percent(interval=None)", holdout=True),
    Job("lightning_checkpoint_every_n_steps", "lightning", "io_stall",
        "Lightning GPT-2 medium (bf16-mixed, batch 8 x 1024) with ModelCheckpoint(every_n_train_steps=50, "
        "save_top_k=-1) writing 4.3 GB of full state", "every_n_train_steps=1000", holdout=True),
    Job("trainer_foreach_off_small_bert", "trainer", "launch_bound",
        "HF Trainer small BERT (12 layers, hidden 256, 201 tensors, bf16, batch 16 x 128) with "
        "AdamW(foreach=False) passed as the optimizer", "AdamW(fused=True)", holdout=True),
    Job("accelerate_grad_accum_healthy", "accelerate", None,
        "Accelerate GPT-2 medium (bf16, 4 accumulation steps of 8 x 1024) with tqdm, a loss.item() log every 10 "
        "steps, max_memory_allocated() every step and an evaluation every 40 steps",
        "no tqdm, no .item() log, no memory read", holdout=True),
)

SETS = {"corpus": JOBS, "unseen1207": UNSEEN1207, "unseen1207c": UNSEEN1207C, "unseen1208": UNSEEN1208,
        "issue30": ISSUE30}
BY_NAME = {j.name: j for j in JOBS + UNSEEN1207 + UNSEEN1207C + UNSEEN1208}
