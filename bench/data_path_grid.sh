#!/bin/bash
# data_path_grid.sh: aggregate data-path throughput of W clients x S shards on this host
# (load_bench: async, momentum, each client pulling the whole model and pushing a gradient in a
# loop), as a table of payload GB/s (pushes/s x 2 directions x 4 bytes x parameters), with the
# ratio to single-stream loopback TCP measured by iperf3 in the same run. Every cell must finish
# with no error and acknowledged == applied on every shard, or the script says which did not.
#
#   bench/data_path_grid.sh PARAMS "W..." "S..." SECONDS [more load_bench flags]
#   bench/data_path_grid.sh 10000000 "1 2 4 8" "1 2 4 8" 8
#   bench/data_path_grid.sh 10000000 "1 2 4 8" "1 2 4 8" 8 --ps_flags=--shm_clients=0  # gRPC only
set -euo pipefail
cd "$(dirname "$0")/.."
params=$1 workers=$2 shards=$3 seconds=$4
shift 4
bin=build/bin

port=$((20000 + RANDOM % 20000))
iperf3 -s -1 -p "$port" > /dev/null 2>&1 &
sleep 0.5
tcp=$(iperf3 -c 127.0.0.1 -p "$port" -t 3 -J | python3 -c \
  'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9)')
wait
printf 'single-stream loopback TCP (iperf3, 3 s): %.2f GB/s; %d parameters (%d MB each way)\n' \
  "$tcp" "$params" $((params * 4 / 1000000))
printf '| S \\ W |'; for w in $workers; do printf ' %s |' "$w"; done; echo
printf '|---|'; for w in $workers; do printf -- '---|'; done; echo
failed=""
for s in $shards; do
  printf '| %s |' "$s"
  for w in $workers; do
    out=$("$bin/load_bench" --clients="$w" --shards="$s" --params="$params" --seconds="$seconds" \
      "$@" 2>/dev/null) || true
    rate=$(echo "$out" | awk -F'|' '/pushes\/s/ {gsub(/ /, "", $3); print $3}')
    errors=$(echo "$out" | awk -F'|' '/errors/ {gsub(/ /, "", $3); print $3}')
    match=$(echo "$out" | awk -F'|' '/acknowledged == applied/ {gsub(/ /, "", $3); print $3}')
    if [ -z "$rate" ] || [ "$errors" != "0" ] || [ "$match" != "yes" ]; then
      failed="$failed W=$w,S=$s"
      printf ' failed |'
      continue
    fi
    python3 -c "r=$rate*2*4*$params/1e9; print(' %.2f (%.2f of TCP) |' % (r, r/$tcp), end='')"
  done
  echo
done
if [ -n "$failed" ]; then
  echo "data_path_grid: cells with errors or lost updates:$failed"
  exit 1
fi
