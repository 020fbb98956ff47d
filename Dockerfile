# syntax=docker/dockerfile:1
# The keyshard coordinator image.
#   docker build -t keyshard:0.1.0 .
#   docker run --rm -p 7171:7171 -p 7172:7172 -e KEYSHARD_BOOTSTRAP_SERVERS=kafka:9092 keyshard:0.1.0
# Every flag of `keyshard coordinator` can be set through its KEYSHARD_* variable (README).
# tests/deploy/test_dockerfile.py runs this file's ENV, COPY and RUN steps in a fresh
# virtualenv and starts the entrypoint, so keep the steps plain shell.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/keyshard
ENV PATH="$VIRTUAL_ENV/bin:$PATH"

WORKDIR /src

# Dependencies in a layer of their own, rebuilt only when pyproject.toml changes.
COPY pyproject.toml scripts/pyproject_deps.py ./
RUN python -m venv "$VIRTUAL_ENV" \
    && python pyproject_deps.py server > requirements.txt \
    && python -m pip install -r requirements.txt

# Then the source, installed without touching the dependencies.
COPY README.md ./
COPY keyshard ./keyshard
COPY coordinator ./coordinator
COPY consumer_client ./consumer_client
COPY api ./api
COPY spark_jobs ./spark_jobs
RUN python -m pip install --no-deps . \
    && python -c "import keyshard.cli, keyshard.api.app, keyshard.consumer_client"

# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it (the chart uses 10001).
RUN useradd --system --uid 10001 --user-group --no-create-home \
    --home-dir /nonexistent --shell /usr/sbin/nologin keyshard
USER 10001:10001
WORKDIR /tmp

# Inside a container the daemon listens on every interface (its own default is loopback).
ENV KEYSHARD_LISTEN=0.0.0.0:7171 \
    KEYSHARD_ADMIN_LISTEN=0.0.0.0:7172
EXPOSE 7171 7172

# Liveness of the admin API; the slim image has no curl, so Python's urllib asks. With
# KEYSHARD_ADMIN_TLS_CERT_FILE over HTTPS, not checking the certificate: this is the
# container asking itself, and the certificate need not name 127.0.0.1.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, ssl, urllib.request; host, _, port = os.environ.get('KEYSHARD_ADMIN_LISTEN', '127.0.0.1:7172').rpartition(':'); host = '127.0.0.1' if host in ('', '0.0.0.0', '::', '[::]') else host; tls = bool(os.environ.get('KEYSHARD_ADMIN_TLS_CERT_FILE')); urllib.request.urlopen(('https' if tls else 'http') + f'://{host}:{port}/healthz', timeout=4, context=ssl._create_unverified_context() if tls else None)"]

ENTRYPOINT ["keyshard"]
CMD ["coordinator"]
