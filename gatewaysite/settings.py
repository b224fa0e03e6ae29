"""One settings file, configured from the environment (SPEC §2)."""

import base64
import binascii
import logging
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# A file of settings only when GATEWAY_ENV_FILE names one (variables already in the environment win).
# manage.py names the checkout's .env, where `make run` leaves DJANGO_DEBUG=true so that a second
# terminal's commands start without a secret; the server (gatewaysite.server, any ASGI server of
# gatewaysite.asgi) names none, so that development file can never turn debug on for a production start.
_env_file = env.str("GATEWAY_ENV_FILE", default="")
if _env_file and Path(_env_file).is_file():
    environ.Env.read_env(_env_file)

DEV_SECRET_KEY = "dev-only-insecure-secret-key-do-not-deploy"

DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY is required when DJANGO_DEBUG is false")
    SECRET_KEY = DEV_SECRET_KEY
elif SECRET_KEY == DEV_SECRET_KEY and not DEBUG:
    raise ImproperlyConfigured("the development secret key may not be used with DJANGO_DEBUG=false")

ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])

INSTALLED_APPS = [
    "daphne",
    "gatewaysite.apps.GatewayAdminConfig",  # django.contrib.admin with the gateway's site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "pools",
    "catalog",
    "gatewayconfig",
    "routing",
    "proxy",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "gatewaysite.staticfiles.WhiteNoiseMiddleware",  # WhiteNoise's, asynchronous under ASGI
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "gatewaysite.urls"
ASGI_APPLICATION = "gatewaysite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'var' / 'gateway.sqlite3'}"),
}
# The request path's queries run on runtime.db's few threads (and the ledger writer's), each keeping
# its connection, and on PostgreSQL its read before dispatch on the event loop's own pool (runtime.loopdb,
# kept as long); the health check reconnects after a database restart (runtime.db.reuse runs it only on
# a connection that may be broken, not before every call).
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=300))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Fail fast (a typed 503) instead of hanging when the database host stops answering: on connect,
    # and on a pooled connection whose peer went silent (keepalives, TCP user timeout).
    options = DATABASES["default"].setdefault("OPTIONS", {})
    for name, value in {
        "connect_timeout": 3,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 2,
        "tcp_user_timeout": 5000,
    }.items():
        options.setdefault(name, value)
    # Prepared statements (server-side binding; Django turns them off by default): psycopg prepares
    # a statement once a connection has run it five times, so the statements every request runs (the
    # key and health read, the ledger's inserts) are parsed and planned once per connection, not on
    # every call (measured: about a fifth of the backend CPU of the request's read). Behind PgBouncer
    # in transaction mode, this needs its prepared statement support (max_prepared_statements, 1.21+).
    options.setdefault("server_side_binding", True)
    options.setdefault("prepare_threshold", 5)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the request path read while the ledger writer commits (the default journal makes
    # readers wait out every commit); the busy timeout waits for the lock instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            # Take the write lock when a transaction starts: a read that later upgrades to a write
            # fails at once with "database is locked", without waiting out the busy timeout.
            "transaction_mode": "IMMEDIATE",
        }
    )
    # The test database is a file like production's, not Django's default in-memory shared cache: a
    # shared cache has table locks that fail at once instead of waiting out the busy timeout, so the
    # request path's reads and its write pool made requests fail at random in tests with 503s that
    # production (WAL, busy timeout) never sees.
    DATABASES["default"].setdefault("TEST", {}).setdefault(
        "NAME", str(BASE_DIR / "var" / "test-gateway.sqlite3")
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="")
# Where per-key limits keep their counts in Redis (proxy.limits): keys start with this prefix, so
# several gateways (or test runs) can share one Redis database.
GATEWAY_REDIS_PREFIX = env.str("GATEWAY_REDIS_PREFIX", default="gateway")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# One date-time format in the admin, to the second and in UTC (gatewaysite/formats/en/formats.py).
FORMAT_MODULE_PATH = ["gatewaysite.formats"]
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
# WhiteNoise scans STATIC_ROOT at startup; an empty one is fine, a missing one only warns.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve admin assets straight from the app directories, so no collectstatic step is needed to run.
WHITENOISE_USE_FINDERS = True

SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True

# The request's log line is the hot path's one log call (proxy.ledger.recorder.record): no caller lookup (a
# stack walk) and no thread, process or multiprocessing name in each record, which neither format
# (gatewaysite.logformat) shows: about a quarter of the line's cost (the logging HOWTO's optimisations).
logging._srcfile = None
logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
# Python's warnings through logging (`py.warnings`), so they are printed in GATEWAY_LOG_FORMAT too.
logging.captureWarnings(True)
# A database error is logged as its class and SQLSTATE, never its message (which carries rows): a log
# record factory, installed before LOGGING is applied (gatewaysite.logsafe).
LOGGING_CONFIG = "gatewaysite.logsafe.configure"
# `json` (the default unless DEBUG): every line of every logger one JSON object with its time, level
# and logger (uvicorn's too: gatewaysite.server hands it gatewaysite/uvicorn_log.json); `text`: the
# message alone (gatewaysite.logformat).
GATEWAY_LOG_FORMAT = env.str("GATEWAY_LOG_FORMAT", default="text" if DEBUG else "json")
if GATEWAY_LOG_FORMAT not in ("json", "text"):
    raise ImproperlyConfigured(f"GATEWAY_LOG_FORMAT: expected json or text, got {GATEWAY_LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(message)s"},
        "json": {"()": "gatewaysite.logformat.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": GATEWAY_LOG_FORMAT}},
    # Any other logger's lines (a library's, Python's warnings) in the same format.
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        # Its own handler only: a server that configures the root logger (daphne) would print each line twice.
        "gateway": {
            "handlers": ["console"],
            "level": env.str("GATEWAY_LOG_LEVEL", default="INFO"),
            "propagate": False,
        },
        # Django's own (in place of its default handlers: a text one in DEBUG, mail to ADMINS).
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # Unhandled errors (a bug, never a client's mistake): path and traceback, never a body.
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}


def _upstream_timeouts(raw: str) -> tuple[float, float]:
    """`GATEWAY_UPSTREAM_TIMEOUT_S` is `connect/read` seconds, or one number for both."""
    parts = [p.strip() for p in raw.split("/")]
    try:
        values = [float(p) for p in parts]
    except ValueError as exc:
        raise ImproperlyConfigured(f"GATEWAY_UPSTREAM_TIMEOUT_S: not a number: {raw!r}") from exc
    if len(values) == 1:
        return values[0], values[0]
    if len(values) == 2:
        return values[0], values[1]
    raise ImproperlyConfigured(f"GATEWAY_UPSTREAM_TIMEOUT_S: expected 'connect/read', got {raw!r}")


def _credentials_keys(keys: list[str]) -> list[str]:
    """`GATEWAY_CREDENTIALS_KEY`: Fernet keys (32 url-safe base64 bytes), the first encrypts. A bad one
    stops the start, named by its position, never by its value."""
    for position, key in enumerate(keys, start=1):
        try:
            valid = len(base64.urlsafe_b64decode(key.encode())) == 32
        except (ValueError, binascii.Error):
            valid = False
        if not valid:
            raise ImproperlyConfigured(
                f"GATEWAY_CREDENTIALS_KEY: key {position} is not a Fernet key (32 url-safe base64 bytes; "
                "make one with `python manage.py rotate_credentials --new-key`)"
            )
    return keys


GATEWAY_UPSTREAM_CONNECT_TIMEOUT_S, GATEWAY_UPSTREAM_READ_TIMEOUT_S = _upstream_timeouts(
    env.str("GATEWAY_UPSTREAM_TIMEOUT_S", default="10/600")
)
# Seconds open streams may run on after a stop signal before they end with a typed terminal event;
# keep it below the server's own graceful-shutdown timeout.
# After a stream's first visible event the client's deadline no longer applies; the stream ends when
# the upstream sends nothing for this long (SPEC §6.0).
GATEWAY_STREAM_IDLE_S = env.float("GATEWAY_STREAM_IDLE_S", default=300.0)
GATEWAY_SHUTDOWN_GRACE_S = env.float("GATEWAY_SHUTDOWN_GRACE_S", default=20.0)
GATEWAY_MAX_BODY_BYTES = env.int("GATEWAY_MAX_BODY_BYTES", default=8 * 1024 * 1024)
# The largest file upload (POST /v1/files), streamed to the upstream, never held whole (SPEC §4).
GATEWAY_MAX_UPLOAD_BYTES = env.int("GATEWAY_MAX_UPLOAD_BYTES", default=512 * 1024 * 1024)
# Where ledger records wait while the database is unreachable (one append-only file per process).
GATEWAY_LEDGER_SPOOL_DIR = env.str("GATEWAY_LEDGER_SPOOL_DIR", default=str(BASE_DIR / "var" / "spool"))
# The largest plain upstream answer relayed (decoded); larger is a typed 502 (SPEC §4).
GATEWAY_MAX_RESPONSE_BYTES = env.int("GATEWAY_MAX_RESPONSE_BYTES", default=64 * 1024 * 1024)
# A client's headers, and each part of its body, must arrive within this; the whole body within
# GATEWAY_BODY_TIMEOUT_S (a client that drips is dropped, SPEC §11).
GATEWAY_CREDENTIALS_KEY = _credentials_keys(env.list("GATEWAY_CREDENTIALS_KEY", default=[]))
GATEWAY_CLIENT_TIMEOUT_S = env.float("GATEWAY_CLIENT_TIMEOUT_S", default=10.0)
GATEWAY_BODY_TIMEOUT_S = env.float("GATEWAY_BODY_TIMEOUT_S", default=60.0)
# Django refuses to read a larger body before our own check could give the typed 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = GATEWAY_MAX_BODY_BYTES
# Request records (and their attempts) older than this are deleted by `manage.py prune_ledger`.
GATEWAY_LEDGER_RETENTION_DAYS = env.int("GATEWAY_LEDGER_RETENTION_DAYS", default=30)
if GATEWAY_LEDGER_RETENTION_DAYS < 1:
    raise ImproperlyConfigured("GATEWAY_LEDGER_RETENTION_DAYS: must be at least 1")
# The pool's load-sharing features (SPEC §5.4): the weighted draw among equal candidates, headroom
# demotions from the upstreams' rate-limit headers and the cache affinity of the clients' own
# conversation keys. `false` turns all three off (a priority list, as `make bench-pool` compares).
GATEWAY_POOL_FEATURES = env.bool("GATEWAY_POOL_FEATURES", default=True)
GATEWAY_CONFIG = env.str("GATEWAY_CONFIG", default=str(BASE_DIR / "gatewaysite" / "demo_config.yaml"))
