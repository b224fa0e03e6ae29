# The gateway's image: the production server of README "Running it in production"
# (`python -m gatewaysite.server`: uvicorn with the gateway's header deadline, websocket limits and JSON
# logs) on port 8000, as a non-root user, on a slim Python base. Not built on the machines this
# repository is developed on (they have no container engine): tests/ops/test_container.py checks it,
# compose.yaml and deploy/k8s/ statically against the code.
#
#   docker build -t gateway .
#   docker run -e DJANGO_SECRET_KEY=... -e DATABASE_URL=postgres://... -p 8000:8000 gateway
#
# The same image runs the management commands: `docker run ... gateway python manage.py migrate`.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A system user without a shell; its numeric id is what Kubernetes' runAsNonRoot can verify.
RUN useradd --system --uid 10001 --user-group --home-dir /app --no-create-home \
    --shell /usr/sbin/nologin gateway

WORKDIR /app
# The runtime dependencies only (pyproject's `dependencies`: uvicorn with uvloop and httptools, psycopg's
# binary wheel, ...; every one ships manylinux wheels, so no compiler is needed). Editable, so that the
# settings' BASE_DIR is /app, where manage.py and the templates are. var/ holds the static files'
# directory the settings create and the ledger's spool (GATEWAY_LEDGER_SPOOL_DIR): the only place the
# server writes besides /tmp.
COPY . .
RUN pip install -e . \
    && mkdir -p var/spool \
    && chown -R gateway:gateway var

USER 10001:10001
EXPOSE 8000
# Liveness: the process answers HTTP (readiness, which checks the database, is /readyz). The Host it
# sends, 127.0.0.1, must be in DJANGO_ALLOWED_HOSTS (the default has it).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
# One worker per process by default; WEB_CONCURRENCY (or `--workers N` appended) runs more, and the
# server then sums their metrics itself.
CMD ["python", "-m", "gatewaysite.server", "--host", "0.0.0.0", "--port", "8000"]
