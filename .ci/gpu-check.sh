#!/bin/bash
# The measurement kit: what docs/gpu.md reports, measured on your CUDA machine with the project's own install, into
# one table. From the repository's root, after `make setup TORCH_SPEC=` over a CUDA build of torch (docs/gpu.md,
# "Setting up"):
#   make gpu-check                       or   bash .ci/gpu-check.sh [parts]
# parts from: bench trial preflight study tests (default: all five, about 15-25 minutes on one H100/H200)
#   bench      one attention layer against SDPA, fused and reference engines (linformer-lab bench)
#   trial      a trial pair of sweeps/bases/gpu.yaml, full attention and Linformer k = 128, 300 steps, as configured
#              (compiled, fused engine): tokens/s, mfu, first step, peak memory
#   preflight  sweep sweeps/random_vs_learned.yaml --preset gpu --preflight: every shape's s/step, peak memory and the
#              study's projected cost, nothing written
#   study      a tiny study of the gpu base (learned against random E/F, 2 seeds, 100 steps), its preflight included:
#              the measured wall time against the projection
#   tests      the default test suite (pytest -n <cores>)
# Writes into $OUT (default gpu-check-out/): table.md (one row per part: the commit, the device, the command, its exit
# code, its wall time and its figures), log.txt and each part's own files. Nothing here reads outside the repository.
set -u
OUT=${OUT:-gpu-check-out}; mkdir -p "$OUT"
W=$(mktemp -d)   # scratch: runs, the bench's folders
LL=".venv/bin/linformer-lab"; PY=".venv/bin/python"
[ -x "$LL" ] || { echo "no .venv: run make setup TORCH_SPEC= over a CUDA build of torch first (docs/gpu.md)"; exit 2; }
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
parts=${*:-bench trial preflight study tests}
exec > >(tee -a "$OUT/log.txt") 2>&1
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo +changes)
DEVICE=$($PY -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')")
echo "commit $COMMIT, device $DEVICE, torch $($PY -c 'import torch; print(torch.__version__, torch.version.cuda)')"
printf '| part | commit | device | command | exit | wall s | figures |\n|---|---|---|---|---|---|---|\n' > "$OUT/table.md"
row() {  # part, command, exit code, seconds, figures
  printf '| %s | %s | %s | `%s` | %s | %s | %s |\n' "$1" "$COMMIT" "$DEVICE" "$2" "$3" "$4" "$5" >> "$OUT/table.md"
}
timed() {  # part, command...: runs it, its output into $OUT/<part>.txt; sets RC and SEC
  local part=$1; shift
  echo; echo "=== $part: $*"
  local t0=$SECONDS
  "$@" > "$OUT/$part.txt" 2>&1; RC=$?
  SEC=$((SECONDS - t0)); tail -8 "$OUT/$part.txt"
}
figures() {  # the figures of one metrics.json
  $PY - "$1" <<'PY'
import json, sys
try:
    m = json.load(open(sys.argv[1]))
except OSError:
    print("no metrics.json"); sys.exit()
out = [f"{m.get('tokens_per_sec', 0):,.0f} tokens/s", f"mfu {m['mfu']:.3f}" if "mfu" in m else "no mfu",
       f"first step {m.get('warmup_s', 0):.1f} s", f"peak {m.get('peak_mem_mb', 0):,.0f} MB",
       f"compiled {m.get('compiled')}", f"val/masked_loss {m.get('val/masked_loss', float('nan')):.3f}"]
print(", ".join(out))
PY
}
if [[ $parts == *bench* ]]; then
  cmd="$LL bench --device cuda --levels layer --mode fwd,fwdbwd --n 512,2048,8192 --k 128 --variants learned,kv,causal --engines auto,reference --repeats 3 --out $W/bench"
  timed bench $cmd
  t=$(ls -d $W/bench/*/ 2>/dev/null | head -1); [ -n "$t" ] && cp "$t/table.md" "$OUT/bench_table.md"
  row bench "linformer-lab bench --device cuda --levels layer ... (bench_table.md)" $RC $SEC "SDPA time / Linformer time per n: bench_table.md"
fi
if [[ $parts == *trial* ]]; then
  for kind in full linformer; do
    cmd="$LL train sweeps/bases/gpu.yaml model.attention.kind=$kind seed=0 trainer.max_steps=300 trainer.val_check_interval=150 trainer.log_every_n_steps=50 output_dir=$W/runs experiment=trial_$kind"
    timed trial_$kind $cmd
    cp $W/runs/trial_$kind/version_0/metrics.json "$OUT/metrics_$kind.json" 2>/dev/null
    row "trial $kind" "linformer-lab train sweeps/bases/gpu.yaml model.attention.kind=$kind trainer.max_steps=300" $RC $SEC "$(figures "$OUT/metrics_$kind.json")"
  done
fi
if [[ $parts == *preflight* ]]; then
  cmd="$LL sweep sweeps/random_vs_learned.yaml --preset gpu --preflight"
  timed preflight $cmd
  row preflight "$cmd" $RC $SEC "$(grep -E '^plan:' "$OUT/preflight.txt" | head -2 | tr '\n' ' ' | tr '|' '/')"
fi
if [[ $parts == *study* ]]; then
  cat > $W/gpu_check.yaml <<YAML
study: gpu_check
base: $PWD/sweeps/bases/gpu.yaml
overrides: {model.attention.kind: linformer, trainer.max_steps: 100, trainer.val_check_interval: 50, output_dir: $W/runs}
space:
  seed: {type: categorical, choices: [0, 1]}
  model.attention.options.projection: {type: categorical, choices: [learned, random]}
objective: [{metric: val/masked_loss, direction: minimize}]
sampler: {kind: grid}
YAML
  timed study $LL sweep $W/gpu_check.yaml --workers 2
  row study "linformer-lab sweep gpu_check.yaml --workers 2 (4 trials of the gpu base, 100 steps)" $RC $SEC "$(grep -E '^plan: (measured|[0-9])' "$OUT/study.txt" | tr '\n' ' ' | tr '|' '/')"
fi
if [[ $parts == *tests* ]]; then
  timed tests $PY -m pytest -q -n "$(nproc)" -p no:cacheprovider -rf
  row tests "python -m pytest -q -n $(nproc)" $RC $SEC "$(tail -1 "$OUT/tests.txt" | tr '|' '/')"
fi
echo; cat "$OUT/table.md"
rm -rf "$W"
