#!/usr/bin/env bash
# Everything gputop measures on the H200 test machine, in one go.
#
# From the repository root on the GPU machine (after the install line of shared/h200/README.md):
#     bash benchmarks/h200.sh [PHASE ...]        # default: every phase
# (The run tool carries at most 64 MiB of working tree: move benchmarks/results/ out of the tree for the call, back after.)
# Phases: env nvml drivertests host cost monitors steady profile fixtures scenarios captures stacks launchcost probe ranks export real corpus kernelbusy
# Each phase runs its benchmarks as `$PY -m benchmarks NAME ARGS` (the registry: benchmarks/__init__.py;
# `python -m benchmarks --list` names them all, with where they run and their goals).
# Results go to $OUT/h200/ (one folder per phase) and are packed into $OUT/h200.tgz; a short
# table of the headline numbers is printed at the end (also in $OUT/h200/summary.txt).
set -u
OUT=${OUT:-/tmp/gputop-out}
# Results are kept outside $OUT and packed into $OUT/h200.tgz after every phase: only a few
# files come back from the GPU machine, and a run cut short still returns what it finished.
RES=${RES:-/tmp/gputop-h200/h200}
mkdir -p "$RES"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
SUMMARY=$RES/summary.txt
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

phase_env() {
  local d=$RES/env; mkdir -p "$d"
  {
    date -u; uname -a; nproc; free -m; df -h /tmp | tail -1
    nvidia-smi || true
    nvidia-smi -q -d CLOCK,POWER,PERFORMANCE | head -80 || true
    $PY -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
    $PY -c "import pynvml; print('nvidia-ml-py', getattr(pynvml, '__version__', '?'))" 2>&1
    py-spy --version; $PY -m gputop --version
    echo "--- cgroups"; cat /proc/self/cgroup; mount | grep cgroup; ls /sys/fs/cgroup | head -30
    echo "--- pressure"; ls /proc/pressure && cat /proc/pressure/memory /proc/pressure/io /proc/pressure/cpu
    echo "--- swap"; cat /proc/swaps
    echo "--- ptrace"; cat /proc/sys/kernel/yama/ptrace_scope 2>&1
  } > "$d/env.txt" 2>&1
  note "env: $(grep -m1 -o 'NVIDIA H[0-9]*[^|]*' "$d/env.txt" | head -1) | $(nproc) cores | $(grep -m1 '^python' "$d/env.txt")"
}

phase_nvml() {
  local d=$RES/nvml; mkdir -p "$d"
  timeout 120 $PY -m benchmarks nvml_check "$d" > "$d/log.txt" 2>&1; echo "nvml_check rc=$?" >> "$d/log.txt"
  tail -40 "$d/log.txt"
}

phase_drivertests() {
  # the tests that need an NVIDIA driver (skipped on CI): NVML's contract fields, the calm rates,
  # GPM's gaps, and another job on the target's GPU named in gpu_procs.others (gpu_shared)
  local d=$RES/drivertests; mkdir -p "$d"
  timeout 300 $PY -m pytest -q -p no:cacheprovider tests/test_nvml_source.py tests/test_gpm_rate.py > "$d/log.txt" 2>&1
  echo "driver tests rc=$?" >> "$d/log.txt"
  tail -15 "$d/log.txt"; tail -1 "$d/log.txt" >> "$SUMMARY"
}

phase_host() {
  local d=$RES/host; mkdir -p "$d"
  timeout 120 $PY -m benchmarks host_cost "$d" > "$d/log.txt" 2>&1; echo "host_cost rc=$?" >> "$d/log.txt"
  tail -15 "$d/log.txt"
}

phase_cost() {
  # gputop's own CPU with the NVML and host sources (issue 2), then with everything (issue 3)
  local d=$RES/cost; mkdir -p "$d"
  timeout 200 $PY -m benchmarks monitor_cost "$d" --scenario gpu_bound --alternations 3 --window 10 \
      --gputop-args=--no-stacks --label spine-gpu_bound > "$d/spine.txt" 2>&1
  tail -8 "$d/spine.txt" | tee -a "$SUMMARY"
  timeout 200 $PY -m benchmarks monitor_cost "$d" --scenario gpu_bound --alternations 3 --window 10 \
      --label full-gpu_bound > "$d/full.txt" 2>&1
  tail -8 "$d/full.txt" | tee -a "$SUMMARY"
}

phase_monitors() {
  # issue 14: nvitop (default, --interval 0.25), gputop headless and the UI (120x40 ptys) side by
  # side against the GPU-bound loop, three rounds, gputop measured from 28 s after its start (in
  # steady state, past the stack source's short py-spy windows: WARM_S, until the job, already
  # training, has been watched ~20 s), nvitop from 4 s (it has no warm-up)
  local d=$RES/monitors; mkdir -p "$d"
  timeout 540 $PY -m benchmarks monitor_cost "$d" --scenario gpu_bound --window 12 --alternations "${ALTS:-3}" \
      --monitors nvitop,nvitop_fast,headless,ui --settle "${SETTLE:-28}" --nvitop-settle "${NVITOP_SETTLE:-4}" \
      --label monitors-gpu_bound > "$d/monitors.txt" 2>&1
  tail -7 "$d/monitors.txt" | tee -a "$SUMMARY"
  rm -f "$d"/*.gtrec
}

phase_steady() {
  # issue 14, calm sampling: every monitor started at once on the GPU-bound loop and measured
  # together from STEADY_SETTLE s after their start (default 100: past the warm-up and the minute
  # the job must hold still to be calm), 6 windows of 15 s; BEFORE=TREE adds another checkout's
  # headless gputop in the same windows
  local d=$RES/steady; mkdir -p "$d"
  timeout 420 $PY -m benchmarks monitor_steady "$d" --scenario gpu_bound --settle "${STEADY_SETTLE:-100}" \
      --window 15 --windows "${STEADY_WINDOWS:-6}" --monitors nvitop,nvitop_fast,headless,ui \
      ${BEFORE:+--before "$BEFORE"} --label steady-gpu_bound > "$d/steady.txt" 2>&1
  tail -8 "$d/steady.txt" | tee -a "$SUMMARY"
  rm -f "$d"/*.gtrec
}

phase_profile() {
  # issue 14: the headless cost by thread and component, in steady state (after PROFILE_WARMUP s, default 25;
  # the 2 s warm-up windows last until the job has trained 20 s)
  local d=$RES/profile; mkdir -p "$d"
  timeout 170 $PY -m benchmarks cpu_profile "$d" --scenario gpu_bound --seconds 30 --warmup "${PROFILE_WARMUP:-25}" \
      --label headless-gpu_bound > "$d/cpu_profile.txt" 2>&1
  head -30 "$d/cpu_profile.txt" | tee -a "$SUMMARY"
  rm -f "$d"/*.gtrec
}

# run_headless NAME SECONDS DIR EXTRA_GPUTOP_ARGS... : start scenario NAME with the probe loaded
# (as `gputop demo` does), let it warm up, attach gputop headless for SECONDS, record into DIR.
run_headless() {
  local name=$1 secs=$2 dir=$3; shift 3
  mkdir -p "$dir"
  rm -f "$dir/$name.gtrec"
  $PY - "$name" > "$dir/$name.rates" 2> "$dir/$name.workload.err" <<'PY' &
import os, sys
from gputop.session.launch import probe_env
os.execvpe(sys.executable, [sys.executable, "-m", "gputop.demo.workload", "--scenario", sys.argv[1],
                            "--report-every", "0.5"], probe_env())
PY
  local w=$!
  # Attach to a job that is training, as a user would: wait for its third rate line (its
  # set-up, CUDA init and first steps are behind it), then a little more.
  for _ in $(seq 1 180); do
    [ "$(grep -c '^rate' "$dir/$name.rates" 2>/dev/null)" -ge 3 ] && break
    sleep 0.5
  done
  sleep "${WARMUP:-1}"
  $PY -m gputop --pid $w --headless --duration "$secs" --record "$dir/$name.gtrec" --json "$@" \
      > "$dir/$name.json" 2> "$dir/$name.gputop.err"
  echo "gputop rc=$?" >> "$dir/$name.gputop.err"
  kill $w 2>/dev/null; wait $w 2>/dev/null
}

phase_fixtures() {
  local d=$RES/fixtures
  for s in gpu_bound input_bound; do
    run_headless $s 20 "$d"
    note "fixture $s: $(ls -l "$d/$s.gtrec" 2>/dev/null | awk '{print $5}') bytes"
  done
}

phase_scenarios() {
  local d=$RES/scenarios
  if [ -n "${WITH_GIL:-}" ]; then  # CPU-only accuracy runs beside the GPU scenarios (16 cores)
    mkdir -p "$RES/stacks"
    ( timeout 420 $PY -m benchmarks gil_accuracy "$RES/stacks/gil" --repeats 2 > "$RES/stacks/gil.txt" 2>&1 ) &
  fi
  for s in ${SCENARIOS:-gpu_bound input_bound h2d_copy_bound launch_bound gil_contention sync_stall memory_bound host_memory_pressure gpu_idle}; do
    run_headless $s 30 "$d"
    note "scenario $s: $($PY - "$d/$s.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("no report:", e); raise SystemExit
pv = r.get("primary_verdict") or {}
print(pv.get("id"), "| primary", pv.get("share"), "| first verdict", r.get("first_verdict_s"), "s |",
      " ".join(f"{k}:{v.get('active_share')}" for k, v in (r.get("verdicts") or {}).items()))
PY
)"
  done
  wait
  [ -n "${WITH_GIL:-}" ] && tail -25 "$RES/stacks/gil.txt" | tee -a "$SUMMARY"
}

phase_captures() {
  # real py-spy captures of CUDA waits for the classification tests (tests/data/pyspy/)
  local d=$RES/captures; mkdir -p "$d"
  timeout 120 $PY tests/data/pyspy/capture.py --gpu --scenes cuda,cuda-item --out "$d" > "$d/log.txt" 2>&1
  echo "capture rc=$?" >> "$d/log.txt"; tail -3 "$d/log.txt"
}

phase_stacks() {
  # target slowdown with the stack source attached, side by side; then gputop's cost and size
  local d=$RES/stacks; mkdir -p "$d"
  timeout 220 $PY -m benchmarks stacks_overhead "$d/ovh" --modes gpu,cuda-launch,launch --pairs "${PAIRS:-4}" --phase 5 \
      > "$d/overhead.txt" 2>&1
  [ "${STACKS_COST:-1}" = 1 ] && timeout 150 $PY -m benchmarks stacks_overhead "$d/cost" --modes "" --cost-matrix \
      --recording 20 > "$d/cost.txt" 2>&1
  tail -20 "$d/overhead.txt" "$d/cost.txt" 2>/dev/null | tee -a "$SUMMARY"
}

phase_launchcost() {
  # the <= 3% goal on launch-heavy loops (issue 3), with designs that cancel the machine's drift:
  # twin targets pinned to CPUs 2 and 3, watched in turn; then more, shorter alternations on one
  local d=$RES/launchcost; mkdir -p "$d"
  grep -E '^cpu ' /proc/stat > "$d/stat-before.txt"  # steal time: how noisy the machine's CPUs are
  timeout 300 $PY -m benchmarks stacks_overhead "$d/twin-launch" --modes launch --twin --pin 2,3 \
      --pairs "${TWIN_PAIRS:-12}" --phase "${TWIN_PHASE:-5}" > "$d/twin-launch.txt" 2>&1
  tail -4 "$d/twin-launch.txt" | tee -a "$SUMMARY"
  timeout 300 $PY -m benchmarks stacks_overhead "$d/twin-cuda" --modes cuda-launch --twin --pin 2,3 \
      --pairs "${TWIN_PAIRS:-12}" --phase "${TWIN_PHASE:-5}" > "$d/twin-cuda.txt" 2>&1
  tail -4 "$d/twin-cuda.txt" | tee -a "$SUMMARY"
  if [ "${ALT_PAIRS:-10}" -gt 0 ]; then
    timeout 150 $PY -m benchmarks stacks_overhead "$d/alt-cuda" --modes cuda-launch --pairs "${ALT_PAIRS:-10}" \
        --phase 4 > "$d/alt-cuda.txt" 2>&1
    tail -4 "$d/alt-cuda.txt" | tee -a "$SUMMARY"
  fi
  grep -E '^cpu ' /proc/stat > "$d/stat-after.txt"
}

phase_probe() {
  local d=$RES/probe; mkdir -p "$d"
  timeout 200 $PY -m benchmarks probe_overhead "$d" --reps 3 > "$d/overhead.txt" 2>&1
  timeout 150 $PY -m benchmarks probe_accuracy "$d" --seconds "${PROBE_S:-8}" > "$d/accuracy.txt" 2>&1
  tail -25 "$d/overhead.txt" "$d/accuracy.txt" 2>/dev/null | tee -a "$SUMMARY"
}

phase_ranks() {
  # a 2-rank torchrun job sharing the GPU: ranks, their GPU and SM active (issue 6)
  local d=$RES/ranks; mkdir -p "$d"
  timeout 90 $PY -m benchmarks ranks_h200 "$d" > "$d/log.txt" 2>&1; echo "ranks_h200 rc=$?" >> "$d/log.txt"
  tail -15 "$d/log.txt" | tee -a "$SUMMARY"
}

phase_export() {
  # the Prometheus exporter serving real NVML data: one scrape of /metrics while gputop runs
  local d=$RES/export; mkdir -p "$d"
  $PY -m gputop.demo.workload --scenario gpu_bound --duration 40 > /dev/null 2>&1 &
  local w=$!
  sleep 12
  $PY -m gputop --pid $w --headless --duration 12 --prometheus 127.0.0.1:9464 --record "$d/export.gtrec" \
      > "$d/report.txt" 2> "$d/gputop.err" &
  local g=$!
  sleep 8
  $PY -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=5).read().decode())" \
      > "$d/metrics.txt" 2>&1
  wait $g; kill $w 2>/dev/null; wait $w 2>/dev/null
  note "export: $(grep -c '^gputop_' "$d/metrics.txt") series; $(grep -m1 '^gputop_gpu_sm_active' "$d/metrics.txt")"
}

# Real training code (issue 11): each loop watched from its very start, as a user would, by
# `gputop --pid` (no probe: stacks + GPU) and, for some, by `gputop run` (with the probe).
# Recordings and reports land in $RES/real/; the rates files are the loops' own step counts.
phase_real() {
  local d=$RES/real; mkdir -p "$d"
  # REAL_SECS: seconds each loop is watched (default 35, HF Trainer 50); REAL_PID / REAL_RUN: which
  # loops (an empty REAL_RUN runs none under `gputop run`)
  for s in ${REAL_PID-hf_trainer lightning checkpoint_stall cpu_work eval_phase slow_startup periodic_stall}; do
    local secs=${REAL_SECS:-35}; [ "$s" = hf_trainer ] && [ -z "${REAL_SECS:-}" ] && secs=50
    setsid $PY -m gputop.demo.workload --scenario $s --report-every 0.5 > "$d/$s-pid.rates" 2> "$d/$s-pid.workload.err" &
    local w=$!
    $PY -m gputop --pid $w --headless --duration $secs --record "$d/$s-pid.gtrec" --json \
        > "$d/$s-pid.json" 2> "$d/$s-pid.gputop.err"
    kill -- -$w 2>/dev/null; wait $w 2>/dev/null
    note "real $s (pid): $(real_line "$d/$s-pid.json")"
  done
  for s in ${REAL_RUN-hf_trainer lightning checkpoint_stall}; do
    local secs=${REAL_SECS:-35}; [ "$s" = hf_trainer ] && [ -z "${REAL_SECS:-}" ] && secs=50
    # (headless --json: the job's own output comes out on stderr, beside gputop's "gputop:" lines)
    $PY -m gputop run --headless --stop-with-gputop --duration $secs --record "$d/$s-run.gtrec" --json -- \
        $PY -m gputop.demo.workload --scenario $s --report-every 0.5 > "$d/$s-run.json" 2> "$d/$s-run.gputop.err"
    grep -v '^gputop' "$d/$s-run.gputop.err" > "$d/$s-run.rates"
    note "real $s (run): $(real_line "$d/$s-run.json")"
  done
  # the newcomer's first command on a GPU box
  $PY -m gputop demo --headless --duration 15 --record "$d/demo.gtrec" --json > "$d/demo.json" 2> "$d/demo.err"
  note "demo --headless --duration 15: $(real_line "$d/demo.json")"
}

# Issue 15: FLOPs/MFU against the analytic count and energy per step against power x time (a GPT in
# bf16 and a ResNet-50); a GPU loop that stops stepping (sleep, lock, a collective) named `stalled`.
phase_mfu() {
  local d=$RES/mfu; mkdir -p "$d"
  timeout 300 $PY -m benchmarks mfu_h200 "$d" --train-s ${MFU_TRAIN_S:-20} > "$d/log.txt" 2>&1; echo "rc=$?" >> "$d/log.txt"
  tail -25 "$d/log.txt" | tee -a "$SUMMARY"
  rm -f "$d"/*.gtrec.tmp
}
phase_stall() {
  local d=$RES/stall; mkdir -p "$d"
  timeout 300 $PY -m benchmarks stall_h200 "$d" > "$d/log.txt" 2>&1; echo "rc=$?" >> "$d/log.txt"
  tail -20 "$d/log.txt" | tee -a "$SUMMARY"
}
# Issue 16: the agent finds two training processes started after it, exports both, forgets the first.
phase_agent() {
  local d=$RES/agent; mkdir -p "$d"
  timeout 300 $PY -m benchmarks agent_h200 "$d" --first ${AGENT_FIRST:-70} --overlap ${AGENT_OVERLAP:-45} \
      > "$d/log.txt" 2>&1; echo "rc=$?" >> "$d/log.txt"
  tail -20 "$d/log.txt" | tee -a "$SUMMARY"
}
# Issue 17 on one GPU: the DDP comm hook installs on NCCL and costs nothing measurable (probe on/off
# alternated). Multicast stays off (the script sets the variables for every program it starts).
phase_ddp1() {
  local d=$RES/ddp1; mkdir -p "$d"
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    timeout 240 $PY -m benchmarks ddp_nccl "$d" --nproc 1 --reps 3 > "$d/log.txt" 2>&1; echo "rc=$?" >> "$d/log.txt"
  tail -20 "$d/log.txt" | tee -a "$SUMMARY"
}
# Issue 17 on a multi-GPU kind when one is lent: DDP/FSDP straggler, balanced, communication-bound.
phase_ddpN() {
  local d=$RES/ddpN; mkdir -p "$d"
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    timeout 500 $PY -m benchmarks ddp_nccl "$d" --nproc ${NPROC:-$(nvidia-smi -L | wc -l)} > "$d/log.txt" 2>&1
  echo "rc=$?" >> "$d/log.txt"; tail -30 "$d/log.txt" | tee -a "$SUMMARY"
}

phase_corpus() {
  # issue 29: every corpus job as it is and fixed under `gputop run --headless`, recorded; the
  # gain of each fix from the job's own rate lines (benchmarks/corpus_run.py). CORPUS_JOBS picks
  # jobs (comma-separated), CORPUS_SECS the training seconds of each variant, CORPUS_ORDER
  # holdout-first runs the held-out third first, CORPUS_START=JOB:VARIANT goes on from there (the
  # next device call), CORPUS_BUDGET starts no variant past that many seconds, CORPUS_VARIANTS
  # (default as_is,fixed) runs only some variants, CORPUS_SET=issue30 the jobs of issue 30's causes
  # (in their own folder: d=$RES/corpus-issue30). Scored offline:
  # python -m benchmarks corpus_score [--set issue30] DIR
  local d=$RES/corpus; [ "${CORPUS_SET:-corpus}" = corpus ] || d=$RES/corpus-$CORPUS_SET; mkdir -p "$d"
  $PY -m benchmarks corpus_run "$d" --set "${CORPUS_SET:-corpus}" --jobs "${CORPUS_JOBS:-}" --seconds "${CORPUS_SECS:-14}" \
      --variants "${CORPUS_VARIANTS:-as_is,fixed}" --order "${CORPUS_ORDER:-manifest}" --start "${CORPUS_START:-}" --budget-s "${CORPUS_BUDGET:-0}" 2>&1 | tee -a "$d/run.txt"
  tail -3 "$d/run.txt" >> "$SUMMARY"
}

phase_kernelbusy() {
  # Issue 29's launch-bound gains: the GPU's kernel time per step from a CUDA kernel timeline
  # (torch.profiler, CUDA activity only, three 1 s windows) against the unprofiled step time, on
  # the corpus's launch-bound jobs as they are and with their launch overhead removed (CUDA
  # graphs), and on a GPU-bound job (does the job stay slower once CUPTI has been on?).
  # KB_JOBS overrides the list (job:flag,...; flag "-" for none).
  local d=$RES/kernelbusy${KB_TAG:-}; mkdir -p "$d"
  for jf in ${KB_JOBS:-tv_resnet_batch1_infer:- tv_resnet_batch1_infer:--fixed small_mlp_launch:- small_mlp_launch:--graph-step rnn_lstmcell_loop:- rnn_lstmcell_loop:--graph-step accelerate_gpu_bound:-}; do
    local job=${jf%%:*} flag=${jf#*:}; [ "$flag" = - ] && flag=
    # KB_ARGS: the sampler's own options (e.g. "--window 0.3 --windows 1"); the environment passes
    # on (TEARDOWN_CUPTI=1: kineto finalizes CUPTI when a trace stops)
    timeout 120 $PY -m benchmarks kernel_busy --after 8 ${KB_ARGS:-} -- "benchmarks/corpus/$job.py" --seconds 24 $flag \
      > "$d/$job${flag//-/_}.log" 2>&1
    note "kernelbusy $job $flag: $(grep -h '^kernel_busy' "$d/$job${flag//-/_}.log" | $PY -c '
import json, sys
for l in sys.stdin:
    d = json.loads(l.split(" ", 1)[1]); w = d.get("windows") or [{}]
    print("step %.3f ms -> after %.3f ms | kernel/step %s ms | busy %s | launch gain %s%% | enter %.0f exit %.0f parse %.0f ms" % (
        d["step_ms_before"], d["step_ms_after"], [round(x["kernel_ms_per_step"] or 0, 3) for x in w],
        round(d.get("kernel_busy_share", -1), 3), round(d.get("launch_gain_pct", -1)), w[0].get("enter_ms", -1),
        w[0].get("exit_ms", -1), w[0].get("parse_ms", -1)))' 2>&1 | tail -1)"
  done
}

real_line() {
  $PY - "$1" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("no report:", e); raise SystemExit
pv = r.get("primary_verdict") or {}
print(pv.get("id"), "| primary", pv.get("share"), "| first verdict", r.get("first_verdict_s"), "s |",
      " ".join(f"{k}:{v.get('active_share')}" for k, v in (r.get("verdicts") or {}).items()))
PY
}

phases=${*:-env nvml host cost scenarios captures}
mkdir -p "$OUT"
for p in $phases; do
  echo "=== phase $p ($(date -u +%T))"
  "phase_$p"
  tar -czf "$OUT/h200.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"
done
cp "$SUMMARY" "$OUT/summary.txt"
echo "=== summary"; cat "$SUMMARY"
