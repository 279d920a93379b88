"""Which Python frames mean "waiting": the table the thread-state derivation classifies with.

A py-spy stack (root first) is put in one category:

    data        blocked in (or running inside) the DataLoader iterator: time in next(loader)
    collective  inside a torch.distributed collective (all_reduce, barrier, ...)
    cuda        waiting for the GPU: torch.cuda.synchronize, Event/Stream.synchronize, or an
                innermost line that forces a sync: .item(), .cpu(), .tolist(), .numpy(), .to("cpu")
    idle        the innermost frame is a known blocking call (sleep, lock, queue, select, join...)
    python      none of the above: running Python (or native code called from it), or waiting
                for the GIL there; the kernel samples tell those apart (gputop.derive.threads)
    unknown     py-spy saw the thread but no Python frame

Categories are tried in the order of ``PRIORITY``: a ``time.sleep`` inside a Dataset's
``__getitem__`` run by a single-process DataLoader is data wait, not idle, because the user is
waiting in ``next()``. Frame rules with ``where="any"`` match any frame of the stack; ``"leaf"``
rules and the line rules look at the innermost Python frame only.

To extend: add a ``FrameRule`` (a file path suffix and function names) or a ``LineRule`` (a
regular expression over the innermost line's source text) below; tests/test_threads_rules.py
runs every rule over real captured py-spy output. Recordings keep the raw stacks, so a replay
picks up new rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

DATA, COLLECTIVE, CUDA, IDLE, PYTHON, UNKNOWN = "data", "collective", "cuda", "idle", "python", "unknown"
PRIORITY = (DATA, COLLECTIVE, CUDA, IDLE)
CATEGORIES = (DATA, COLLECTIVE, CUDA, IDLE, PYTHON, UNKNOWN)


@dataclass(frozen=True)
class FrameRule:
    category: str
    file: str                  # path suffix, "/"-separated ("torch/utils/data/dataloader.py")
    funcs: frozenset[str]      # function names; empty: any function of the file
    where: str = "any"         # "any": any frame of the stack; "leaf": the innermost only
    why: str = ""

    def matches(self, name: str, path: str) -> bool:
        if not (path == self.file or path.endswith("/" + self.file)):
            return False
        if not self.funcs:
            return True
        # Python >= 3.11 gives qualified names ("Queue.get"), older ones the bare name.
        return name in self.funcs or name.rpartition(".")[2] in self.funcs


@dataclass(frozen=True)
class LineRule:
    category: str
    pattern: re.Pattern
    why: str = ""


def _f(category, file, funcs, where="any", why=""):
    return FrameRule(category, file, frozenset(funcs.split()), where, why)


_COLLECTIVES = ("all_reduce all_reduce_coalesced all_gather all_gather_into_tensor _all_gather_base "
                "all_gather_object all_gather_coalesced reduce_scatter reduce_scatter_tensor "
                "_reduce_scatter_base all_to_all all_to_all_single broadcast broadcast_object_list "
                "reduce gather gather_object scatter scatter_object_list barrier monitored_barrier "
                "send recv batch_isend_irecv")

FRAME_RULES: tuple[FrameRule, ...] = (
    # DataLoader: everything under the iterator's __next__ is time the loop waits for a batch
    # (in a single-process loader that includes running the Dataset itself).
    _f(DATA, "torch/utils/data/dataloader.py", "__next__", why="inside next(DataLoader iterator)"),
    _f(COLLECTIVE, "torch/distributed/distributed_c10d.py", _COLLECTIVES, why="torch.distributed collective"),
    _f(CUDA, "torch/cuda/__init__.py", "synchronize", why="torch.cuda.synchronize()"),
    _f(CUDA, "torch/cuda/streams.py", "synchronize", why="CUDA stream/event synchronize()"),
    # Known blocking calls of the standard library, when they are the innermost frame.
    _f(IDLE, "threading.py", "wait wait_for join _wait_for_tstate_lock acquire", "leaf", "threading wait"),
    _f(IDLE, "queue.py", "get put join", "leaf", "queue.Queue wait"),
    _f(IDLE, "selectors.py", "select", "leaf", "select/poll"),
    _f(IDLE, "multiprocessing/connection.py", "wait _poll poll _recv _recv_bytes recv_bytes recv accept",
       "leaf", "multiprocessing pipe wait"),
    _f(IDLE, "multiprocessing/queues.py", "get", "leaf", "multiprocessing queue wait"),
    _f(IDLE, "subprocess.py", "wait _wait _try_wait communicate _communicate", "leaf", "waiting for a child process"),
    _f(IDLE, "socket.py", "accept readinto recv_into", "leaf", "socket I/O"),
    _f(IDLE, "ssl.py", "read recv recv_into", "leaf", "TLS socket I/O"),
    _f(IDLE, "concurrent/futures/_base.py", "result wait as_completed", "leaf", "waiting for a future"),
    _f(IDLE, "asyncio/base_events.py", "_run_once", "leaf", "asyncio event loop idle"),
)

# Over the *innermost* frame's source line (the call the thread is in when that call is C code,
# which has no Python frame of its own).
LINE_RULES: tuple[LineRule, ...] = (
    LineRule(CUDA, re.compile(r"\.(item|cpu|tolist|numpy)\(\s*\)|\bsynchronize\(\s*\)"
                              r"|\.to\(\s*(device\s*=\s*)?['\"]cpu['\"]"),
             "a call that waits for the GPU (.item(), .cpu(), .tolist(), .numpy(), .to('cpu'), synchronize())"),
    # (select: the select module's, ``select.select(`` or a bare ``select(``; ``x.select(0, i)`` and
    # ``torch.select(`` index a tensor)
    LineRule(IDLE, re.compile(r"\bsleep\(|\.acquire\(|\.recv(_into|from)?\(|\.accept\("
                              r"|\bselect\.select\(|(?<![\w.])select\("),
             "a blocking call (sleep, lock acquire, socket receive, select)"),
    # ``with self.lock:`` acquires in C (no frame of its own): an uncontended acquire takes
    # nanoseconds, so a sample on that line is the thread waiting for the lock's holder (the
    # corpus's accelerate_log_sleep: a metrics client's log() waits ~35 ms a step for its
    # flusher's upload, and the second's kernel split gave that wait to the step's CPU code)
    LineRule(IDLE, re.compile(r"^\s*(async\s+)?with\s+[\w.]*\b_?(\w+_)?(r?lock|mutex)\b(?!\s*\()", re.I),
             "waiting to acquire a lock (with ...lock:)"),
)


def classify(frames: list, stack: list[int], leaf_code: str | None) -> tuple[str, str]:
    """(category, why) of one stack. ``frames`` is the sample's frame table ([name, file,
    line]); ``stack`` indexes into it, root first; ``leaf_code`` is the innermost line's text."""
    if not stack:
        return UNKNOWN, "no Python frame"
    leaf = len(stack) - 1
    found: dict[str, str] = {}
    for pos, i in enumerate(stack):
        if not (0 <= i < len(frames)):
            continue
        for rule in _frame_rules_matching(frames[i][0], frames[i][1]):
            if rule.category in found or (rule.where == "leaf" and pos != leaf):
                continue
            found[rule.category] = rule.why
    if leaf_code:
        for lr in LINE_RULES:
            if lr.category not in found and lr.pattern.search(leaf_code):
                found[lr.category] = lr.why
    for cat in PRIORITY:
        if cat in found:
            return cat, found[cat]
    return PYTHON, ""


# The rules are matched once per distinct (function, file): a process's stacks repeat the same
# frames window after window, and a torch stack is ~100 frames deep against ~50 rules, so
# matching every frame of every stack again was most of the derive thread's CPU
# (benchmarks/cpu_profile.py). The answers depend on the name and path only.
_MEMO_FRAMES = 16384


def _memo(fn):
    cached = lru_cache(maxsize=_MEMO_FRAMES)(fn)

    def lookup(name, path):
        if type(name) is str and type(path) is str:
            return cached(name, path)
        return fn(name, path)   # a malformed frame of a damaged file: as before, uncached

    lookup.cache_clear = cached.cache_clear
    return lookup


@_memo
def _frame_rules_matching(name: str, path: str) -> tuple[FrameRule, ...]:
    """The FRAME_RULES (in their order) this frame matches, wherever it is on the stack."""
    return tuple(rule for rule in FRAME_RULES if rule.matches(name, path))


def is_dataloader_worker(frames: list, stack: list[int]) -> bool:
    """A torch DataLoader worker process's main loop is on this stack."""
    for i in stack:
        if 0 <= i < len(frames):
            name, path = frames[i][0], frames[i][1]
            if path.endswith("torch/utils/data/_utils/worker.py") and name.rpartition(".")[2] == "_worker_loop":
                return True
    return False


# ---------------------------------------------------------------------------------------------
# The time budget and the phases read two more tables. They do not change ``classify`` (the
# thread states), only how the budget names a moment of the main thread.

IO = "io"
# File I/O by the frames on the stack (any frame): writing or reading checkpoints, arrays,
# logs. Serialising a checkpoint is mostly CPU work (pickling, copying tensors to the host), so
# these frames name the moment "I/O" whatever the kernel says the thread was doing.
IO_RULES: tuple[FrameRule, ...] = (
    _f(IO, "torch/serialization.py", "", why="torch.save / torch.load"),
    _f(IO, "safetensors/torch.py", "", why="safetensors"),
    _f(IO, "numpy/lib/npyio.py", "", why="numpy save/load"),
    _f(IO, "numpy/lib/_npyio_impl.py", "", why="numpy save/load"),
    _f(IO, "numpy/lib/format.py", "", why="numpy .npy I/O"),
    _f(IO, "shutil.py", "copyfile copyfileobj copy copy2 copytree move rmtree", why="shutil file copy"),
    _f(IO, "logging/__init__.py", "emit flush", why="logging handler writing"),
    _f(IO, "transformers/trainer.py", "_save_checkpoint save_model _save _save_optimizer_and_scheduler",
       why="Trainer checkpoint"),
    _f(IO, "lightning/pytorch/trainer/connectors/checkpoint_connector.py", "", why="Lightning checkpoint"),
    _f(IO, "lightning/fabric/plugins/io/torch_io.py", "", why="Lightning checkpoint"),
)
IO_LINE = re.compile(r"\.(write|writelines|flush)\(|\bos\.fsync\(|\bjson\.dump\(|\bpickle\.dump\(")

# Phase hints. A moment of the main thread inside any of these frames says which phase the job
# is in; the phase tracker (gputop.derive.phases) turns them into phases over time.
TRAIN, EVAL, CHECKPOINT = "train", "eval", "checkpoint"
IMPORT, LOAD, BUILD, COMPILE, CUDA_INIT, DATA_START = "import", "load", "build", "compile", "cuda_init", "data_start"
STARTUP_PARTS = (IMPORT, LOAD, BUILD, COMPILE, CUDA_INIT, DATA_START)
STARTUP_LABELS = {IMPORT: "importing", LOAD: "loading weights", BUILD: "building the model", COMPILE: "compiling",
                  CUDA_INIT: "starting CUDA", DATA_START: "starting DataLoader workers", "other": "other"}

PHASE_RULES: tuple[FrameRule, ...] = (
    # training: a backward pass or an optimizer step is on the stack (plain loops, HF, Lightning)
    _f(TRAIN, "torch/autograd/__init__.py", "backward"),
    _f(TRAIN, "torch/_tensor.py", "backward"),
    _f(TRAIN, "torch/autograd/graph.py", "_engine_run_backward"),
    # (the optimizer's step and zero_grad; constructing one is set-up, not training)
    _f(TRAIN, "torch/optim/optimizer.py", "profile_hook_step.<locals>.wrapper _use_grad step zero_grad"),
    _f(TRAIN, "transformers/trainer.py", "training_step _inner_training_loop"),
    _f(TRAIN, "accelerate/accelerator.py", "backward"),
    _f(TRAIN, "lightning/pytorch/loops/training_epoch_loop.py", ""),
    _f(TRAIN, "lightning/pytorch/loops/optimization/automatic.py", ""),
    # evaluation
    _f(EVAL, "transformers/trainer.py", "evaluate evaluation_loop prediction_step predict"),
    _f(EVAL, "lightning/pytorch/loops/evaluation_loop.py", ""),
    _f(EVAL, "lightning/pytorch/loops/prediction_loop.py", ""),
    # checkpointing
    _f(CHECKPOINT, "torch/serialization.py", "save _save"),
    _f(CHECKPOINT, "safetensors/torch.py", "save save_file save_model"),
    _f(CHECKPOINT, "transformers/trainer.py", "_save_checkpoint save_model"),
    _f(CHECKPOINT, "lightning/pytorch/trainer/connectors/checkpoint_connector.py", ""),
    # start-up
    _f(LOAD, "torch/serialization.py", "load _load"),
    _f(LOAD, "safetensors/torch.py", "load load_file"),
    _f(LOAD, "transformers/modeling_utils.py", "from_pretrained _load_pretrained_model load_state_dict"),
    # compiling: frames on the stack only while torch.compile compiles (dynamo's cache miss goes
    # through convert_frame; inductor's lowering, its code cache, Triton's compile at a kernel's
    # first launch). Not eval_frame.py: its wrapper calls the compiled code on every call, so
    # every forward of a compiled model would read as compiling, and restart the warm-up (the
    # H200's compile_varlen; a compiled job then stayed in warm-up until WARMUP_MAX_S)
    _f(COMPILE, "torch/_dynamo/convert_frame.py", ""),
    _f(COMPILE, "torch/_dynamo/symbolic_convert.py", ""),
    _f(COMPILE, "torch/_inductor/compile_fx.py", ""),
    _f(COMPILE, "torch/_inductor/codecache.py", "load load_by_key_path _load_triton_kernel_from_source compile"),
    _f(COMPILE, "torch/_inductor/async_compile.py", ""),
    _f(COMPILE, "torch/_inductor/runtime/triton_heuristics.py",
       "precompile _precompile_config _precompile_worker autotune_to_one_config benchmark_all_configs"),
    _f(COMPILE, "triton/compiler/compiler.py", "compile"),
    _f(CUDA_INIT, "torch/cuda/__init__.py", "_lazy_init init"),
    _f(DATA_START, "torch/utils/data/dataloader.py", "__iter__ _get_iterator"),
    _f(BUILD, "torch/nn/modules/module.py", "__init__ to _apply cuda half bfloat16 float"),
    _f(BUILD, "torch/nn/modules/linear.py", "__init__ reset_parameters"),
    _f(BUILD, "torch/nn/init.py", ""),
    _f(BUILD, "transformers/modeling_utils.py", "post_init init_weights _init_weights"),
)
# user functions whose names say what they are, in any file
PHASE_NAMES = {EVAL: frozenset("evaluate evaluation eval_epoch eval_loop run_eval validate validation "
                               "validation_step validation_loop test_step predict_step".split()),
               CHECKPOINT: frozenset("save_checkpoint save_model checkpoint save_state".split()),
               TRAIN: frozenset("training_step train_step".split())}
PHASE_PRIORITY = (CHECKPOINT, EVAL, TRAIN, LOAD, COMPILE, CUDA_INIT, DATA_START, BUILD, IMPORT)


def is_import_frame(name: str, path: str) -> bool:
    return path.startswith("<frozen importlib") or path.endswith("importlib/__init__.py")


@_memo
def _io_rule_why(name: str, path: str) -> str | None:
    """The why of the first IO_RULES rule this frame matches, or None."""
    for rule in IO_RULES:
        if rule.matches(name, path):
            return rule.why
    return None


def io_why(frames: list, stack: list[int], leaf_code: str | None) -> str | None:
    """Why this stack is file I/O, or None."""
    for i in stack:
        if 0 <= i < len(frames):
            why = _io_rule_why(frames[i][0], frames[i][1])
            if why is not None:
                return why
    if leaf_code and IO_LINE.search(leaf_code):
        return "a file write"
    return None


@_memo
def _phase_hints_of(name: str, path: str) -> frozenset[str]:
    """Every phase hint one frame gives: its function's name, the PHASE_RULES it matches, an
    import frame."""
    found: set[str] = set()
    short = name.rpartition(".")[2]
    for hint, names in PHASE_NAMES.items():
        if short in names:
            found.add(hint)
    for rule in PHASE_RULES:
        # a module's own top level running is its import, never what its functions do (torch
        # imports dynamo's convert_frame lazily, at a job's first optimizer step)
        if name != "<module>" and rule.matches(name, path):
            found.add(rule.category)
    if is_import_frame(name, path):
        found.add(IMPORT)
    return frozenset(found)


def phase_hint(frames: list, stack: list[int]) -> str | None:
    """The phase this stack says the job is in (TRAIN, EVAL, CHECKPOINT or a start-up part), or
    None when it says nothing (data loading, sleeping and the like happen in every phase)."""
    found: set[str] = set()
    for i in stack:
        if 0 <= i < len(frames):
            found |= _phase_hints_of(frames[i][0], frames[i][1])
    for hint in PHASE_PRIORITY:
        if hint in found:
            return hint
    return None
