# syntax=docker/dockerfile:1.7
# t1-inference on the vLLM backend. The base image already holds vllm and its
# torch at the versions pyproject.toml pins (its `vllm` extra), so installing
# `.[vllm]` adds T1 and its remaining dependencies without replacing them.
#
# Build from the repository root:
#   docker build -f deploy/docker/inference.Dockerfile -t t1-inference:0.1.0 .
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1

WORKDIR /opt/t1/src
COPY pyproject.toml README.md ./
COPY t1 ./t1
# Versions come from pyproject.toml, which the tests keep in step with this file.
# hadolint ignore=DL3013
RUN python3 -m pip install ".[vllm]"

EXPOSE 50052 9400
# The base image's entrypoint starts vLLM's own HTTP server; T1 serves gRPC.
ENTRYPOINT ["t1-inference"]
CMD ["--config", "/etc/t1/prod.yaml", "--backend", "vllm", "--model", "/shared/models/policy"]
