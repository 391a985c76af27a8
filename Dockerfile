# syntax=docker/dockerfile:1
# Images for gpuval, one build, two targets:
#
#   docker build --target operator -t gpuval-operator .
#   docker build --target agent    -t gpuval-agent .
#
# Both binaries come from one `make release sbom` (the same command CI runs, so what CI builds
# is what ships): stripped of debug info, each with a CycloneDX SBOM of the crates compiled into
# it (from Cargo.lock) at /usr/local/share/gpuval/sbom/, named by the io.gpuval.sbom label.
# Versions are build arguments; labels follow the OCI image annotations. The binaries, their
# .debug files (to symbolize crash reports) and the SBOMs, as files:
#
#   docker build --target artifacts --output type=local,dest=dist .
#
# CI builds these same targets from this same file (tests/scripts/build-images.sh, with
# buildah), and then runs them on a real kubelet (tests/tests/real_node.rs). Two things differ,
# both build arguments, and nothing else:
#   - where the binaries come from: BINARIES=source (the default) compiles them in the `build`
#     stage below; CI passes BINARIES=dist and a build context holding the target/dist that
#     its own `make release sbom` made, the same command, so Rust is compiled once;
#   - the base images: CI has no registry, so OPERATOR_BASE and AGENT_BASE name local stand-ins
#     made from Debian packages (glibc, CA certificates, user 65532) and, for the agent, from
#     NVIDIA's published CUDA library wheels (cuBLAS, NVRTC, NCCL) at the CUDA image's paths.
# Every line below FROM is the same in both builds, so what the real-node test proves (the
# images start under the chart's security context, find their libraries, use their tokens)
# is proven of these lines; what it cannot prove is the public bases' own contents.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm
ARG CUDA_VERSION=13.0.2
ARG UBUNTU_VERSION=24.04
ARG OPERATOR_BASE=gcr.io/distroless/cc-debian12:nonroot
ARG AGENT_BASE=nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}
# `source`: compile the binaries here; `dist`: take them from target/dist of the build context.
ARG BINARIES=source
# The SBOM generator, pinned like the Makefile's CARGO_CYCLONEDX_VERSION.
ARG CARGO_CYCLONEDX_VERSION=0.5.9

# ---- build-source: both binaries, release profile, locked dependencies ----------------------
FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build-source
ARG CARGO_CYCLONEDX_VERSION
# Installed before the sources are copied, so this layer outlives source changes.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo install --locked "cargo-cyclonedx@${CARGO_CYCLONEDX_VERSION}"
WORKDIR /src
COPY . .
# The agent loads CUDA (driver, NVRTC, cuBLAS) and NVML at run time, so the build needs no
# CUDA toolkit; the operator uses rustls with ring, so no OpenSSL either. objcopy (binutils,
# in the Rust image) splits the debug info off.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    make release sbom DIST=/out \
    && ls -l /out

# ---- build-dist: the same files, made by `make release sbom` outside (BINARIES=dist) --------
# The repository's .dockerignore leaves target/ out, so this needs a build context that holds
# target/dist (tests/scripts/build-images.sh stages one with the binaries and their SBOMs).
FROM scratch AS build-dist
COPY target/dist/ /out/

# ---- build: /out from one or the other ------------------------------------------------------
# (A stage of this file, not an image: there is no tag to pin.)
# hadolint ignore=DL3006
FROM build-${BINARIES} AS build

# ---- artifacts: binaries, .debug files and SBOMs, for `--output` ----------------------------
FROM scratch AS artifacts
COPY --from=build /out/ /

# ---- operator: glibc + libgcc only (distroless), non-root -----------------------------------
FROM ${OPERATOR_BASE} AS operator
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="gpuval-operator" \
      org.opencontainers.image.description="gpuval operator: GpuValidation to agent pods to verdicts" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://example.invalid/gpuval" \
      io.gpuval.sbom="/usr/local/share/gpuval/sbom/gpuval-operator.cdx.json"
COPY --from=build /out/gpuval-operator /usr/local/bin/gpuval-operator
COPY --from=build /out/gpuval-operator.cdx.json /usr/local/share/gpuval/sbom/gpuval-operator.cdx.json
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gpuval-operator"]

# ---- agent: NVIDIA CUDA runtime (cuBLAS, cuBLASLt, NVRTC); the driver comes from the node ---
FROM ${AGENT_BASE} AS agent
ARG CUDA_VERSION
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="gpuval-agent" \
      org.opencontainers.image.description="gpuval node agent: GPU memory, compute, interconnect, NCCL, host-link and I/O checks" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://example.invalid/gpuval" \
      io.gpuval.cuda.version="${CUDA_VERSION}" \
      io.gpuval.sbom="/usr/local/share/gpuval/sbom/gpuval-agent.cdx.json"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The runtime image carries cuBLAS; NVRTC comes with its CUDA libraries. Install NVRTC from
# NVIDIA's repository (configured in the base image) only if a base lacks it, then fail the
# build unless both are there: the agent compiles its kernels with NVRTC at start.
# hadolint ignore=DL3008
RUN cuda_pkg="$(cut -d. -f1,2 <<<"${CUDA_VERSION}" | tr . -)" \
    && if ! ls /usr/local/cuda/lib64/libnvrtc.so.* >/dev/null 2>&1; then \
         apt-get update \
         && apt-get install -y --no-install-recommends "cuda-nvrtc-${cuda_pkg}" \
         && rm -rf /var/lib/apt/lists/*; \
       fi \
    && ls /usr/local/cuda/lib64/libnvrtc.so.* /usr/local/cuda/lib64/libcublasLt.so.* /usr/local/cuda/lib64/libcublas.so.* \
    && ldconfig
# NCCL (the nccl check): the libnccl2 package from NVIDIA's CUDA repository, the one the CUDA
# runtime base image installs and holds (its NCCL_VERSION variable names the version; 2.28.x
# for CUDA 13.0). Installed here only if a base lacks it. The package ships only the runtime
# name libnccl.so.2; the agent loads libnccl.so, so a link to it goes on LD_LIBRARY_PATH. The
# version (the base's NCCL_VERSION, else the package's) is printed and kept in
# /usr/local/share/gpuval/nccl-version.
# hadolint ignore=DL3008
RUN if ! ldconfig -p | grep 'libnccl.so.2 ' >/dev/null; then \
         apt-get update \
         && apt-get install -y --no-install-recommends libnccl2 \
         && rm -rf /var/lib/apt/lists/*; \
       fi \
    && nccl="$(ldconfig -p | awk '/libnccl.so.2 / {p = $NF} END {print p}')" \
    && test -n "$nccl" \
    && install -d /usr/local/lib/gpuval-nccl /usr/local/share/gpuval \
    && ln -sf "$nccl" /usr/local/lib/gpuval-nccl/libnccl.so \
    && nccl_version="${NCCL_VERSION:-$(dpkg-query -W -f='${Version}' libnccl2)}" \
    && test -n "$nccl_version" \
    && echo "$nccl_version" | tee /usr/local/share/gpuval/nccl-version
ENV LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/lib/gpuval-nccl:/usr/local/nvidia/lib:/usr/local/nvidia/lib64 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=build /out/gpuval-agent /usr/local/bin/gpuval-agent
COPY --from=build /out/gpuval-agent.cdx.json /usr/local/share/gpuval/sbom/gpuval-agent.cdx.json
# Non-root: the device plugin's GPU device nodes and NVML work for an unprivileged user. The
# I/O check's host directory must be writable by this UID.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpuval-agent"]
CMD ["--help"]
