# Sourced by the install tests: the 1-shard 2-worker job they run, and its check.
# ps_run_job RUN_DIR COMMAND...: runs `COMMAND launch` (300 steps per worker) into RUN_DIR.
ps_run_job() {
  local run_dir=$1
  shift
  timeout 300 "$@" launch --shards=1 --workers=2 --steps=300 --max_seconds=240 --hidden=32 \
    --progress_seconds=5 --run_dir="$run_dir"
}

# ps_check_job RUN_DIR: both workers did every step and the evaluator's last accuracy is above
# 0.6 (chance is 0.1; this job reaches about 0.8).
ps_check_job() {
  local run_dir=$1 r last
  for r in 0 1; do
    last=$(tail -n 1 "$run_dir/worker-$r.csv" | cut -d, -f1)
    [ "$last" = 299 ] || { echo "worker $r stopped at step '$last', not 299"; return 1; }
  done
  tail -n 1 "$run_dir/evaluator.csv" \
    | awk -F, '{ print "final test accuracy " $4; exit !($4 > 0.6) }'
}
