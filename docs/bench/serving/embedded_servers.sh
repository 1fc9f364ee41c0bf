# Sourced by final.sh and plain_plain.sh (from the repository root): the embedded pair's server flags (64 slots),
# the started servers' pids killed on exit, and wait_port PORT (until GET /health answers, 20 minutes at most).
common="--slots=64 --max_input_length=64 --max_new_tokens=64 --modes=greedy --log_level=warning"
pids=()
trap 'kill ${pids[*]} 2>/dev/null || true' EXIT
wait_port() { for _ in $(seq 1 600); do curl -sf http://127.0.0.1:$1/health >/dev/null && return 0; sleep 2; done; }
