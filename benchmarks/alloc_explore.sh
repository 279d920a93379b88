# Exploring allocator thrash (issue 30): benchmarks/corpus/alloc_thrash_varlen.py bare, 8 s each,
# as it is and with expandable_segments, at the edge of memory and with the GPU left free.
for cfg in 512,8,64,512 512,4,16,256; do for head in 0.03 none; do for v in "" --fixed; do
  echo "cfg $cfg headroom $head $v"
  ALLOC_SIZE=$cfg ALLOC_HEADROOM=$head timeout 60 python3 benchmarks/corpus/alloc_thrash_varlen.py --seconds 8 $v 2>&1 \
    | grep -E "^(rate|ooms)" | tail -2
done; done; done
