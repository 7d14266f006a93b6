#!/usr/bin/env bash
# Runs a command and samples memory every 2 s while it runs (free's "used", and the largest process's
# RSS with its name); prints the peaks when the command ends and exits with its status.
#   bash bench/peak_memory.sh python bench/ppo_iteration.py --model smollm2-135m --skip-trl ...
set -uo pipefail
if [ "$#" -eq 0 ]; then echo "usage: bash bench/peak_memory.sh COMMAND [ARGS...]" >&2; exit 2; fi
"$@" &
pid=$!
max_used=0 max_rss=0 max_name=""
while kill -0 "$pid" 2>/dev/null; do
  used=$(free -b | awk '/^Mem:/ {print $3}')
  read -r rss name < <(ps -eo rss=,comm= --sort=-rss | head -1)
  (( used > max_used )) && max_used=$used
  (( rss > max_rss )) && { max_rss=$rss; max_name=$name; }
  sleep 2
done
wait "$pid"
status=$?
awk -v u="$max_used" -v r="$max_rss" -v n="$max_name" \
  'BEGIN { printf "[peak_memory] machine used %.2f GiB at most; largest process %.2f GiB RSS (%s); sampled every 2 s\n", u / 2^30, r / 2^20, n }'
exit "$status"
