#!/usr/bin/env bash
# `make run`: migrate the database, load the configuration, start the demo upstreams (unless
# GATEWAY_CONFIG names a real configuration), and serve the gateway with uvicorn as production runs it
# (gatewaysite/server.py: uvicorn plus the gateway's header deadline and websocket message limit).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
PORT=${PORT:-8000}
# The demo is a local development run: debug on and the development secret, unless the operator says otherwise.
export DJANGO_DEBUG=${DJANGO_DEBUG:-true}
mkdir -p var

children=()
cleanup() { for pid in "${children[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

"$PY" manage.py migrate --noinput
if [ -n "${GATEWAY_CONFIG:-}" ]; then
  "$PY" manage.py load_gateway_config "$GATEWAY_CONFIG"
else
  # Two demo upstreams: `demo-a` rejects gpt-x with model_not_found, `demo-b` serves it.
  "$PY" -m tests.fakes.demo --port 9101 --name demo-a --reject gpt-x &
  children+=($!)
  "$PY" -m tests.fakes.demo --port 9102 --name demo-b &
  children+=($!)
  export GATEWAY_UPSTREAM_DEMO_KEY=${GATEWAY_UPSTREAM_DEMO_KEY:-sk-demo-upstream}
  "$PY" manage.py load_gateway_config gatewaysite/demo_config.yaml
fi
echo "gateway: http://127.0.0.1:$PORT  (admin: http://127.0.0.1:$PORT/admin/)"
"$PY" -m gatewaysite.server --host 127.0.0.1 --port "$PORT" &
children+=($!)
wait -n
