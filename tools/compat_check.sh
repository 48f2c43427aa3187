#!/usr/bin/env bash
# Files an older tvr wrote, read by this checkout: the same outputs. Exports OLD_REV (default: 2e128fb, main before
# issue 50 resolved configs once and moved the presets) with `git archive`, and with the same .venv:
#   - renders a small synthetic set and trains cpu/proxy and cpu/clip4clip for one epoch with the old code;
#   - evaluates each old checkpoint with both: metrics.json must be identical (timings aside);
#   - resumes each old run folder with this checkout (its config.yaml must equal this checkout's resolution; a changed
#     setting must be named);
#   - trains this checkout on a feature cache the old code wrote;
#   - searches an index the old code wrote: the JSON answer must be identical;
#   - and the identities computed by hashing config dicts: an index the old code built with the offline default
#     encoder (no --model; its stamp is a hash of the resolved two_tower/zero_shot config and every weight) is searched
#     with an identical answer and not refused, and `tvr index` run again on it embeds nothing (every video reused);
#     a bench folder the old code ran (tiny synth, 1 method, 3 seeds, 1 epoch) is run again: every run is kept (its
#     run_identity unchanged), no feature cache is added (feature_key unchanged), nothing in runs/, features/ or data/
#     changes, and results.json's results_sha256 is the same.
# Old and new code keep separate caches (TVR_CACHE_DIR) in the temporary folder: this checkout recomputes every
# stamp itself instead of reading a query export the old code left (and the user's ~/.cache is not touched).
# Usage: bash tools/compat_check.sh [OLD_REV]     (2 to 3 minutes on 2 cores; works in a temporary folder)
set -Eeuo pipefail
# fd 3: the script's stderr, which a failing command's own redirection (2>/dev/null) does not swallow
exec 3>&2
trap 'echo "compat_check: FAILED at line $((BASH_LINENO[0] ? BASH_LINENO[0] : LINENO)): $BASH_COMMAND" >&3' ERR
repo="$(cd "$(dirname "$0")/.." && pwd)"
rev="${1:-2e128fb}"
py="$repo/.venv/bin/python"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/old"
git -C "$repo" archive "$rev" | tar -x -C "$work/old"
old() { TVR_CACHE_DIR="$work/cache_old" PYTHONPATH="$work/old" "$py" -m tvr "$@"; }
new() { TVR_CACHE_DIR="$work/cache_new" PYTHONPATH="$repo" "$py" -m tvr "$@"; }
field() { "$py" -c "import json,sys,functools; print(functools.reduce(lambda d,k: d[k], sys.argv[2].split('.'), json.load(open(sys.argv[1]))))" "$1" "$2"; }
digests() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
metrics() { "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); [d.pop(k,None) for k in ('info','scoring_seconds')]; print(json.dumps(d,sort_keys=True))" "$1"; }
cd "$work"
old synth --out data --num-videos 40 --num-test 10 >/dev/null 2>&1
data=(--set data.annotations=data --set data.video_dir=data/videos --set train.epochs=1)
for head in proxy clip4clip; do
  old train --config "cpu/$head" "${data[@]}" --out "run_$head" >/dev/null 2>&1
  old eval --checkpoint "run_$head/best.pt" --out "old_$head" >/dev/null 2>&1
  new eval --checkpoint "run_$head/best.pt" --out "new_$head" >/dev/null 2>&1
  [ "$(metrics "old_$head/metrics.json")" = "$(metrics "new_$head/metrics.json")" ]
  echo "eval $head: a checkpoint written by $rev gives identical metrics"
  new train --config "cpu/$head" "${data[@]}" --resume --out "run_$head" >/dev/null 2>&1
  echo "resume $head: the run folder's config.yaml equals this checkout's resolution"
  if new train --config "cpu/$head" "${data[@]}" --set train.epochs=2 --resume --out "run_$head" >changed.log 2>&1; then
    echo "resume $head: a changed setting was not refused" >&2; exit 1
  fi
  grep -q "other settings (train.epochs: 1 in the run, 2 now)" changed.log
  echo "resume $head: a changed setting is named (train.epochs), nothing else"
done
old features --config cpu/clip4clip "${data[@]}" --splits train,val,test --out cache >/dev/null 2>&1
new train --config cpu/clip4clip "${data[@]}" --set data.features_dir=cache --set model.freeze_backbone=true \
  --out run_cached >/dev/null 2>&1
echo "features: a cache written by $rev trains this checkout"
old index data/videos --out idx --model run_clip4clip/best.pt >/dev/null 2>&1
old search idx "a red circle" --json -k 5 >old_search.json 2>/dev/null
new search idx "a red circle" --json -k 5 >new_search.json 2>/dev/null
cmp -s old_search.json new_search.json
echo "search: an index written by $rev answers identically"

old index data/videos --out idx_default >/dev/null 2>&1
[ "$(field idx_default/settings.json model.encoder) $(field idx_default/settings.json model.name)" = "config two_tower/zero_shot" ]
# both with the full model (the numpy query side old index wrote is documented as not bit-identical): this checkout
# rebuilds the model from the stamp's config, hashes it (weights_sha256) and must find the stamp's id
TVR_QUICK_QUERIES=0 old search idx_default "a red circle" --json -k 5 >old_default.json 2>/dev/null
TVR_QUICK_QUERIES=0 new search idx_default "a red circle" --json -k 5 >new_default.json 2>/dev/null
cmp -s old_default.json new_default.json
echo "search: an index written by $rev with the offline default encoder (config stamp) answers identically"
digests idx_default/shards >shards_before.txt
new index data/videos --out idx_default >/dev/null 2>&1
[ "$(field idx_default/report.json embedded)" = 0 ] && [ "$(field idx_default/report.json reused)" = 40 ]
[ "$(field idx_default/report.json windows_embedded)" = 0 ]
digests idx_default/shards | cmp -s shards_before.txt -
echo "index: run again on that index, this checkout's default encoder has its stamp and embeds nothing (40 reused)"

cat >bench.yaml <<'YAML'
name: compat
description: tools/compat_check.sh's bench (identities, not methods)
synth: {num_videos: 16, num_test: 4, captions_per_video: 2, size: 32, fps: 4, seconds: 2.0, val_fraction: 0.25, seed: 0}
run:
  data: {max_words: 16, max_frames: 4, frame_rate: 2.0, image_size: 32}
  model:
    clip: tiny
    temporal: meanP
    tiny: {embed_dim: 16, text_width: 16, text_layers: 1, text_heads: 2, vision_width: 16, vision_layers: 1,
           vision_heads: 2, image_size: 32, patch_size: 16}
  train: {batch_size: 8, lr: 1.0e-3, device: cpu, num_threads: 1, log_every: 0, select_metric: t2v/R1}
  eval: {batch_size: 64}
methods:
  - {name: clip4clip, head: {name: clip4clip}}
seeds: 3
epochs: 1
YAML
# 16 videos cannot make validation like the test: the bench is allowed to go on (it checks identities, not methods)
old bench --config bench.yaml --out bench --allow-unlike-validation >/dev/null 2>&1
cp bench/results.json old_results.json
for part in runs features data; do digests "bench/$part"; done >bench_before.txt
new bench --config bench.yaml --out bench --allow-unlike-validation >new_bench.log 2>&1
[ "$(awk '/^clip4clip seed [012]: kept from an earlier run$/ {n++} END {print n+0}' new_bench.log)" = 3 ]
for part in runs features data; do digests "bench/$part"; done | cmp -s bench_before.txt -
echo "bench: a bench folder written by $rev is resumed as finished (3 runs kept, same feature cache, nothing retrained)"
[ "$(field old_results.json results_sha256)" = "$(field bench/results.json results_sha256)" ]
echo "bench: results.json's results_sha256 is identical"
