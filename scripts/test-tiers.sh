#!/usr/bin/env bash
# `make test` after `make up`: every check and test tier, in parallel where that is safe
# (docs/testing.md "How `make test` runs"):
#
#   phase 1, side by side:  [static: ruff, mypy, compat] -> [chaos, on its own stack]
#                           [unit] -> [security] -> [fuzz]
#                           [integration, not serial: pytest-xdist, $INTEGRATION_WORKERS]
#   phase 2, alone:         [serial tests: they stop and restart the stack]
#
# The chaos tier stops and restarts its services, so it runs on a second stack of its
# own: the same services on ports + $CHAOS_PORT_OFFSET (default 3000), its files under
# .local/chaos-stack (the jars are shared), started at once and stopped when this script
# ends, whatever happens.
#
# Each job writes its log to .local/test-logs/<job>.log; the logs are printed when the
# phase ends, then one line per job with its time, and a last line
# "tests: N passed, N failed". Exit 1 if any job failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
LOGS=.local/test-logs
WORKERS="${INTEGRATION_WORKERS:-3}"
mkdir -p "$LOGS"
rm -rf "$LOGS"/*.log "$LOGS"/*.rc "$LOGS"/*.s "$LOGS"/*.hung "$LOGS"/running

# A job that runs longer than $TIER_TIMEOUT seconds (default 40 min; a job takes at most
# about 15 on a 2-core box) is hung: pytest-timeout stops one test after 300 s, but not a
# hang outside a test or in C code that never returns to Python. The watchdog writes what
# every process of the job is doing (ps, then py-spy dump of each Python process) into the
# job's log, stops the job and lets the run go on, so a hang is a red tier with its stacks
# in the log, not a CI run killed at its limit with nothing printed.
TIER_TIMEOUT="${TIER_TIMEOUT:-2400}"

# tree PID: PID and every process below it, parents first
tree() {
  local child
  echo "$1"
  for child in $(pgrep -P "$1"); do tree "$child"; done
}

# watchdog NAME PID: after $TIER_TIMEOUT s, dump and stop the job PID (see above)
watchdog() {
  local name=$1 pid=$2 sleeper p
  sleep "$TIER_TIMEOUT" </dev/null >/dev/null 2>&1 &
  sleeper=$!
  trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
  wait "$sleeper"
  kill -0 "$pid" 2>/dev/null || exit 0
  # the tests its processes were in (tests/conftest.py writes them), for the summary
  for f in "$LOGS/running/$name"/*; do
    [ -e "$f" ] || continue
    echo "$(cat "$f") (for $(($(date +%s) - $(stat -c %Y "$f"))) s, pid $(basename "$f"))"
  done >"$LOGS/$name.hung"
  {
    echo; echo "=============================== $name: TIMEOUT after $TIER_TIMEOUT s; in the tests:"
    cat "$LOGS/$name.hung"
    echo "its processes:"
    ps -o pid,ppid,etime,time,args -p "$(tree "$pid" | paste -sd,)" || true
    for p in $(tree "$pid"); do
      if [[ "$(ps -o comm= -p "$p" 2>/dev/null)" == python* || "$(ps -o comm= -p "$p" 2>/dev/null)" == pytest* ]]; then
        echo "--- py-spy dump --pid $p"
        timeout 60 "$BIN/py-spy" dump --pid "$p" 2>&1 || true
      fi
    done
  } >>"$LOGS/$name.log" 2>&1
  # shellcheck disable=SC2046
  kill -TERM $(tree "$pid") 2>/dev/null
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 1; done
  # shellcheck disable=SC2046
  kill -KILL $(tree "$pid") 2>/dev/null
  exit 0
}

# run NAME CMD...: CMD with its output in $LOGS/NAME.log, exit code and seconds beside it;
# stopped by the watchdog after $TIER_TIMEOUT s
run() {
  local name=$1 started=$SECONDS rc pid dog
  shift
  INVOICING_TEST_RUNNING="$(realpath -m "$LOGS/running/$name")" "$@" >"$LOGS/$name.log" 2>&1 &
  pid=$!
  watchdog "$name" "$pid" </dev/null >/dev/null 2>&1 &
  dog=$!
  wait "$pid"
  rc=$?
  kill "$dog" 2>/dev/null
  wait "$dog" 2>/dev/null
  echo "$rc" >"$LOGS/$name.rc"
  echo $((SECONDS - started)) >"$LOGS/$name.s"
  return "$rc"
}

static() {
  run lint bash -c "$BIN/ruff check . && $BIN/ruff format --check ."
  run typecheck "$BIN/mypy"
  run compat "$BIN/invoicing" schemas check-compat ${COMPAT_ARGS:-}
}

show() {
  for name in "$@"; do
    [ -e "$LOGS/$name.log" ] || continue
    echo "=============================== $name ($(cat "$LOGS/$name.s") s, exit $(cat "$LOGS/$name.rc"))"
    cat "$LOGS/$name.log"
  done
}

CHAOS_PORT_OFFSET="${CHAOS_PORT_OFFSET:-3000}"
CHAOS_HOME="$PWD/.local/chaos-stack"
mkdir -p "$CHAOS_HOME"
bash scripts/ports-env.sh "$CHAOS_PORT_OFFSET" "$CHAOS_HOME/ports.env" >/dev/null
chaos_env() { (source "$CHAOS_HOME/ports.env" && INVOICING_STACK__STATE_DIR="$CHAOS_HOME" "$@"); }
trap 'chaos_env "$BIN/invoicing" stack down >/dev/null 2>&1 || true' EXIT
chaos_tier() {
  # $1: the exit code of the chaos stack's start
  [ "$1" = 0 ] || { echo "the chaos tier's stack did not start: see $LOGS/chaos-stack.log"; return 1; }
  chaos_env "$BIN/pytest" tests/chaos --durations=10
}

started=$SECONDS
# security: the security review's tests (tests/security, docs/security.md); quick, and
# like every stack tier it fails (never skips) when a service it needs is missing
(
  run chaos-stack chaos_env "$BIN/invoicing" stack up &
  stack_up=$!
  static
  wait "$stack_up"
  run chaos chaos_tier "$?"
) &
chain=$!
(
  run unit "$BIN/pytest" tests/unit
  run security "$BIN/pytest" tests/security
  run fuzz "$BIN/pytest" tests/fuzz -s ${FUZZ_ARGS:-}
) &
tiers=$!
run integration "$BIN/pytest" tests/integration -m "not serial" -n "$WORKERS" --dist loadgroup --durations=15 &
integration=$!
wait "$chain" "$tiers" "$integration"
chaos_env "$BIN/invoicing" stack down >/dev/null 2>&1 || true
phase1=$((SECONDS - started))
show lint typecheck compat unit security fuzz chaos-stack chaos integration

run serial "$BIN/pytest" tests/integration -m serial
show serial
total=$((SECONDS - started))

passed=0
failed=0
for name in unit security fuzz integration chaos serial; do
  line=$(grep -E '^=*.* in [0-9.]+s' "$LOGS/$name.log" | tail -1)
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | awk '{s += $1} END {print s + 0}')
  f=$(grep -oE '[0-9]+ (failed|errors?)' <<<"$line" | awk '{s += $1} END {print s + 0}')
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-0}))
done
status=0
echo "=============================== summary (phase 1 ${phase1} s, total ${total} s)"
for name in lint typecheck compat unit security fuzz chaos-stack chaos integration serial; do
  rc=$(cat "$LOGS/$name.rc" 2>/dev/null || echo missing)
  printf '  %-12s %5s s  exit %s\n' "$name" "$(cat "$LOGS/$name.s" 2>/dev/null || echo -)" "$rc"
  [ -s "$LOGS/$name.hung" ] && sed 's/^/      hung in: /' "$LOGS/$name.hung"
  [ "$rc" = 0 ] || status=1
done
[ "$status" = 0 ] || [ "$failed" -gt 0 ] || failed=1  # a failed lint or type check counts
echo "tests: $passed passed, $failed failed"
exit "$status"
