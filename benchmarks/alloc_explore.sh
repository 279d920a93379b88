# Exploring allocator thrash (issue 30): benchmarks/corpus/alloc_thrash_varlen.py bare, 8 s each,
# as it is and with expandable_segments, at the edge of memory and with the GPU left free.
if [ "${1:-}" != steady ]; then
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
    gain=$(python3 - "$out/${tag}_as_is.log" "$out/${tag}_fixed.log" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
from corpus_run import steady_rate
a, f = (steady_rate(open(p, errors="replace").read())[0] for p in sys.argv[1:])
print(f"{f / a - 1:.3f}" if a and f else "-1")
PY
)
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
