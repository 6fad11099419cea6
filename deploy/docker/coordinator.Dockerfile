# syntax=docker/dockerfile:1.7
# t1-coordinator: the control plane. CPU only; carries the gcloud CLI that the
# sandbox scripts (deploy/sandbox/) call to create and destroy sandbox VMs.
#
# Build from the repository root:
#   docker build -f deploy/docker/coordinator.Dockerfile -t t1-coordinator:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# tini reaps the grandchildren that gcloud leaves behind; openssh-client gives
# operators ssh/ssh-keyscan inside the pod for debugging sandboxes.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gnupg openssh-client tini \
 && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg \
      | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg \
 && echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt cloud-sdk main" \
      > /etc/apt/sources.list.d/google-cloud-sdk.list \
 && apt-get update \
 && apt-get install -y --no-install-recommends google-cloud-cli \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/t1/src
COPY pyproject.toml README.md ./
COPY t1 ./t1
# The CPU wheel of the pinned torch: the coordinator never uses a GPU, and the
# default wheel would add gigabytes of CUDA libraries.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu .

COPY deploy/sandbox /opt/t1/deploy/sandbox

RUN useradd --uid 1000 --user-group --create-home t1 \
 && mkdir -p /var/lib/t1 \
 && chown t1:t1 /var/lib/t1
USER 1000
WORKDIR /var/lib/t1

EXPOSE 50051 9400
ENTRYPOINT ["tini", "--", "t1-coordinator"]
CMD ["--config", "/etc/t1/prod.yaml"]
