# Session 5, call 1 (one H200): chunk-major grids (the tiles of one chunk side by side) against the
# previous commit (copied into _ab/ by hand), with per-kernel profiles at (64,512,2,256).
source benchmarks/h200/setup.sh
export TRITON_CACHE_DIR=$PWD/.tcache
mkdir -p .tcache; [ -d .tcache_carry ] && cp -rn .tcache_carry/. .tcache/
S="64,512,2,256;64,512,2,64;8,2048,2,512"
timeout 200 python3 -m sandbox.cli bench kernels --check --no-family --no-torch --no-sse --gates diag \
  --shapes "$S" --deadline 190 --out $OUT/new.json > $OUT/new.txt 2>&1; grep -E "^shape|check|profile|^ +0" $OUT/new.txt | head -60
PYTHONPATH=/tmp/site:$PWD/_ab timeout 150 python3 -m sandbox.cli bench kernels --no-fla --no-torch --no-sse --gates diag \
  --shapes "$S" --deadline 140 --out $OUT/old.json > $OUT/old.txt 2>&1; grep -E "^shape|profile|^ +0" $OUT/old.txt | head -40
python3 -c "import sandbox; print(sandbox.__file__)"
