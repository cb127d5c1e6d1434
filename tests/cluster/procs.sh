# Sourced by tests/cluster/up.sh and tests/e2e/node.sh: runs components in the background and
# waits for them. The caller sets `me` (its name, for messages), `logs` (the folder of the
# components' logs) and the arrays `pids` and `names`, which its cleanup walks.

# start NAME ARGS...: runs a component in the background, its output in $logs/NAME.log.
start() {
  local name=$1; shift
  "$@" >>"$logs/$name.log" 2>&1 &
  pids+=($!); names+=("$name")
}

# wait_for WHAT SECONDS COMMAND...: polls COMMAND until it succeeds; fails if a component died.
wait_for() {
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs)) i
  until "$@" >/dev/null 2>&1; do
    for i in "${!pids[@]}"; do
      if ! kill -0 "${pids[$i]}" 2>/dev/null; then
        echo "$me: ${names[$i]} exited; last lines of $logs/${names[$i]}.log:" >&2
        tail -n 30 "$logs/${names[$i]}.log" >&2
        exit 1
      fi
    done
    if ((SECONDS >= deadline)); then
      echo "$me: $what not ready after $secs s (logs in $logs)" >&2
      exit 1
    fi
    sleep 0.2
  done
}
