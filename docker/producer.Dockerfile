# The control-plane image: `regen db|submit|status|requeue|retry`, and Flower (`celery flower`).
# No vLLM, no torch: the producer never imports them, and pyproject.toml keeps them in
# the cpu/gpu extras, which this image does not install.
#
#   docker build -f docker/producer.Dockerfile -t regen-producer .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/regen/src

# Dependencies first, from pyproject.toml alone, so a source edit does not reinstall them.
COPY pyproject.toml ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

COPY README.md ./
COPY ledger ./ledger
COPY targets ./targets
COPY local ./local
COPY producer ./producer
COPY worker ./worker
COPY migrations ./migrations
RUN pip install --no-deps . \
 && cd / && rm -rf /opt/regen/src \
 && python -c 'import importlib.util as u, sys; bad = [m for m in ("torch", "vllm") if u.find_spec(m)]; sys.exit(f"the producer image must not contain {bad}") if bad else None' \
 && regen --help >/dev/null

RUN useradd --system --uid 10001 --create-home --home-dir /home/regen regen
USER regen
WORKDIR /data

ENTRYPOINT ["regen"]
CMD ["--help"]
