# syntax=docker/dockerfile:1.7
# t1-trainer: PPO on DeepSpeed over CUDA, launched by torchrun (one process per GPU).
#
# The CUDA devel image supplies nvcc, which DeepSpeed needs to build its fused
# Adam op; its CUDA major version must match the one the pinned torch wheel is
# built for (CUDA 13 for the default torch 2.13 wheels).
#
# Build from the repository root:
#   docker build -f deploy/docker/trainer.Dockerfile -t t1-trainer:0.1.0 .
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-dev python3-venv ca-certificates libaio-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /opt/t1/src
COPY pyproject.toml README.md ./
COPY t1 ./t1
# torch first: DeepSpeed's build imports it. Fused Adam is compiled here for
# Ampere and Hopper instead of JIT-compiling on every rank at start-up; there is
# no GPU at build time, so the CUDA accelerator is named explicitly.
RUN pip install "torch==2.13.0"
RUN DS_ACCELERATOR=cuda TORCH_CUDA_ARCH_LIST="8.0;9.0" DS_BUILD_FUSED_ADAM=1 \
    pip install --no-build-isolation "deepspeed>=0.19,<0.20"
RUN pip install .

EXPOSE 50061 9400 29500
ENTRYPOINT ["torchrun", "--no-python", "t1-trainer"]
CMD ["--config", "/etc/t1/prod.yaml"]
