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
# The same development settings for every command of a second terminal (`.venv/bin/python manage.py ...`):
# manage.py reads .env (a variable set in the environment still wins). The server never reads it: this
# script passes DJANGO_DEBUG to its own children above, and a production start in this checkout stays
# out of debug (docs/operations.md).
if [ ! -f .env ]; then
  cat > .env <<ENV
# Written by \`make run\` for local development. Read only by manage.py in this checkout (a variable set
# in the environment wins; GATEWAY_ENV_FILE= reads none), never by the server.
DJANGO_DEBUG=true
ENV
fi

children=()
cleanup() { for pid in "${children[@]}"; do kill "$pid" 2>/dev/null || true; done; }
# A stop signal ends the script too (a trap alone would let it go on starting children), and the exit
# trap stops what was started.
trap cleanup EXIT
trap 'exit 143' INT TERM

"$PY" manage.py migrate --noinput
if [ -n "${GATEWAY_CONFIG:-}" ]; then
  "$PY" manage.py load_gateway_config "$GATEWAY_CONFIG"
else
  # Two demo upstreams: `demo-a` rejects gpt-x with model_not_found, `demo-b` serves it. Their ports
  # are free ones picked now, so a second `make run PORT=...` does not collide with the first.
  read -r port_a port_b < <("$PY" -c 'import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
  "$PY" -m devkit.demo --port "$port_a" --name demo-a --reject gpt-x &
  children+=($!)
  "$PY" -m devkit.demo --port "$port_b" --name demo-b &
  children+=($!)
  export GATEWAY_UPSTREAM_DEMO_KEY=${GATEWAY_UPSTREAM_DEMO_KEY:-sk-demo-upstream}
  sed -e "s#127.0.0.1:9101/#127.0.0.1:$port_a/#" -e "s#127.0.0.1:9102/#127.0.0.1:$port_b/#" \
    gatewaysite/demo_config.yaml > var/demo_config.yaml
  "$PY" manage.py load_gateway_config var/demo_config.yaml
fi
echo "gateway: http://127.0.0.1:$PORT  (admin: http://127.0.0.1:$PORT/admin/)"
"$PY" -m gatewaysite.server --host 127.0.0.1 --port "$PORT" &
children+=($!)
wait -n
