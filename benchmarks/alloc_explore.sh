# Exploring allocator thrash (issue 30): benchmarks/corpus/alloc_thrash_varlen.py bare, 8 s each,
# as it is and with expandable_segments, at the edge of memory and with the GPU left free.
# The steady steps/s of each log given (corpus_run's reading of the job's rate lines), and with two
# logs (as it is, fixed) the fix's gain: "RATE ... GAIN", the gain -1 where a rate is missing.
steady() {
  python3 - "$@" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
from corpus_run import steady_rate
rates = [steady_rate(open(p, errors="replace").read())[0] for p in sys.argv[1:]]
gain = rates[1] / rates[0] - 1 if len(rates) == 2 and all(rates) else -1
print(*rates, f"{gain:.3f}" if len(rates) == 2 else "")
PY
}

case "${1:-}" in
  ""|steady|margins) ;;
  *) echo "alloc_explore.sh: no form '$1': run it with no argument, 'steady OUT' or 'margins OUT'" >&2; exit 2 ;;
esac

# First form, `bash benchmarks/alloc_explore.sh` (no argument)
if [ -z "${1:-}" ]; then
for cfg in 512,8,64,512 512,4,16,256; do for head in 0.03 none; do for v in "" --fixed; do
  echo "cfg $cfg headroom $head $v"
  ALLOC_SIZE=$cfg ALLOC_HEADROOM=$head timeout 60 python3 benchmarks/corpus/alloc_thrash_varlen.py --seconds 8 $v 2>&1 \
    | grep -E "^(rate|ooms)" | tail -2
done; done; done
fi

# Second form (fourth session of 2026-12-06), `bash benchmarks/alloc_explore.sh steady OUT`: the
# pressure kept (ALLOC_ON_OOM=skip: an OOM drops its batch, the headroom stays), 20 s each, bare;
# each config's steady steps/s (corpus_run's reading of the rate lines) as it is and fixed; then
# the config with the largest steady gain, run under gputop as corpus_run's issue30 pair.
if [ "${1:-}" = steady ]; then
  out=${2:-/tmp/alloc-steady}; mkdir -p "$out"
  best= ; best_gain=-1
  for cfg in "512,96,32,1024 0.003" "512,96,32,1024 0.01" "1024,48,16,2048 0.005"; do
    set -- $cfg
    tag=${1//,/x}_$2   # (a file name with a comma does not come back from the GPU machine)
    for v in as_is fixed; do
      flag=; [ $v = fixed ] && flag=--fixed
      ALLOC_ON_OOM=skip ALLOC_SIZE=$1 ALLOC_HEADROOM=$2 timeout 90 python3 benchmarks/corpus/alloc_thrash_varlen.py \
        --seconds 20 $flag > "$out/${tag}_$v.log" 2>&1
    done
    gain=$(steady "$out/${tag}_as_is.log" "$out/${tag}_fixed.log" | awk '{print $NF}')
    echo "cfg $1 headroom $2: steady gain $gain | $(grep -h '^ooms' "$out/${tag}_as_is.log") | fixed: $(grep -h '^ooms' "$out/${tag}_fixed.log")" | tee -a "$out/summary.txt"
    if python3 -c "import sys; sys.exit(0 if float('$gain') > float('$best_gain') else 1)"; then best="$1 $2"; best_gain=$gain; fi
  done
  echo "best: ${best:-none} ($best_gain)" | tee -a "$out/summary.txt"
  # (an as-is run that stops stepping has a steady rate of its first seconds only: read the logs'
  # last lines before trusting "best"; with no rate at all there is no best to run)
  [ -n "$best" ] || exit 1
  set -- $best
  ALLOC_ON_OOM=skip ALLOC_SIZE=$1 ALLOC_HEADROOM=$2 python3 -m benchmarks corpus_run "$out/corpus-issue30" --set issue30 \
    --jobs alloc_thrash_varlen --seconds 20 --budget-s 150 2>&1 | tee -a "$out/summary.txt"
fi

# Third form (first session of 2026-12-07), `bash benchmarks/alloc_explore.sh margins OUT`: the deep
# shape that thrashed on the H200 (512,96,32,1024: +44% fixed in a bare 10 s run) kept at its
# pressure (skip) at wider margins, where a flush can still succeed: a longer batch than any block
# the cache holds needs fresh segments, and at a margin below the activations' share of the peak
# the cache cannot hold two steps' worth, so it is flushed about once a step without running out.
# 20 s each, as it is and fixed; then as it is with ALLOC_TRACE=1 (the flushes timed from torch's
# memory history, and what recording the segment events costs the job). ALLOC_SIZE picks another
# shape (a small one checks the script on a CPU), ALLOC_MARGINS the margins. Run on an H100 on
# 2026-12-07 (benchmarks/results/h100-alloc-skip-1207/): first every as-is run livelocked (the job
# drew a failed batch's length again, fixed since), then at 5% and 10% the fix gained +2.5% and
# +0.4%: retries at the rates this job reaches cost a few percent.
if [ "${1:-}" = margins ]; then
  out=${2:-/tmp/alloc-margins}; mkdir -p "$out"
  for head in ${ALLOC_MARGINS:-0.05 0.1 0.2}; do
    for v in as_is fixed; do
      flag=; [ $v = fixed ] && flag=--fixed
      ALLOC_ON_OOM=skip ALLOC_SIZE=${ALLOC_SIZE:-512,96,32,1024} ALLOC_HEADROOM=$head timeout 80 python3 \
        benchmarks/corpus/alloc_thrash_varlen.py --seconds 20 $flag > "$out/m${head}_$v.log" 2>&1
    done
    gain=$(steady "$out/m${head}_as_is.log" "$out/m${head}_fixed.log")   # as-is fixed gain
    echo "margin $head: steady $gain | $(grep -h '^ooms' "$out/m${head}_as_is.log") | fixed: $(grep -h '^ooms' "$out/m${head}_fixed.log")" | tee -a "$out/summary.txt"
  done
  head=${ALLOC_TRACE_MARGIN:-0.1}
  ALLOC_TRACE=1 ALLOC_ON_OOM=skip ALLOC_SIZE=${ALLOC_SIZE:-512,96,32,1024} ALLOC_HEADROOM=$head timeout 80 python3 \
    benchmarks/corpus/alloc_thrash_varlen.py --seconds 20 > "$out/m${head}_trace.log" 2>&1
  echo "margin $head traced: $(steady "$out/m${head}_trace.log") steps/s | $(grep -h '^ooms\|^trace' "$out/m${head}_trace.log" | tr '\n' ' ') | $(tail -2 "$out/m${head}_trace.log" | tr '\n' ' ')" | tee -a "$out/summary.txt"
fi
