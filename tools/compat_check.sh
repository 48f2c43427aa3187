#!/usr/bin/env bash
# Files an older tvr wrote, read by this checkout: the same outputs. Exports OLD_REV (default: 2e128fb, main before
# issue 50 resolved configs once and moved the presets) with `git archive`, and with the same .venv:
#   - renders a small synthetic set and trains cpu/proxy and cpu/clip4clip for one epoch with the old code;
#   - evaluates each old checkpoint with both: metrics.json must be identical (timings aside);
#   - resumes each old run folder with this checkout (its config.yaml must equal this checkout's resolution; a changed
#     setting must be named);
#   - trains this checkout on a feature cache the old code wrote;
#   - searches an index the old code wrote: the JSON answer must be identical.
# Usage: bash tools/compat_check.sh [OLD_REV]     (about 2 minutes on 2 cores; works in a temporary folder)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
rev="${1:-2e128fb}"
py="$repo/.venv/bin/python"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/old"
git -C "$repo" archive "$rev" | tar -x -C "$work/old"
old() { PYTHONPATH="$work/old" "$py" -m tvr "$@"; }
new() { PYTHONPATH="$repo" "$py" -m tvr "$@"; }
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
