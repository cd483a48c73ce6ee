# syntax=docker/dockerfile:1
# The one Lifeguard image: `lifeguard operator`, `lifeguard webhook` and the injected
# `lifeguard sidecar` are subcommands of the same binary.
#
#   docker build -t ghcr.io/lifeguard-dev/lifeguard:0.1.0 .
#   docker cp "$(docker create ghcr.io/lifeguard-dev/lifeguard:0.1.0)":/lifeguard ~/bin/kubectl-lifeguard
#                                        # the kubectl plugin, for a workstation of the same platform
#
# Static musl binary on distroless/static rather than a glibc binary on distroless/cc:
# - nothing to match at run time (no libc, libgcc or loader in the image), so the final stage
#   is the smallest distroless base, with CA certificates, tzdata and the nonroot user;
# - musl's allocator is slow under contention, but Lifeguard installs mimalloc as its global
#   allocator, so that cost does not apply;
# - the C dependencies (aws-lc for rustls, bundled SQLite, mimalloc) build with musl-gcc.
# The Kubernetes client reaches the API server by IP; Service names resolve through musl's
# resolver, which honours the search domains and ndots of the pod's resolv.conf.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
# One image per platform (docker buildx --platform linux/amd64,linux/arm64), each built natively.
ARG TARGETARCH
RUN case "${TARGETARCH:-amd64}" in \
      amd64) echo x86_64-unknown-linux-musl ;; \
      arm64) echo aarch64-unknown-linux-musl ;; \
      *) echo "unsupported architecture ${TARGETARCH}" >&2; exit 1 ;; \
    esac > /rust-target \
 && rustup target add "$(cat /rust-target)"
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The binary acts as the kubectl plugin when invoked as kubectl-lifeguard. distroless has no shell
# to make that link later, so it is made here, and copying the /out directory keeps it a symlink.
# CC is set for the musl target only, so build scripts still compile for the host with gcc.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(cat /rust-target)" \
 && export "CC_$(echo "$target" | tr - _)=musl-gcc" \
 && cargo build --locked --release --bin lifeguard --target "$target" \
 && mkdir /out \
 && cp "target/$target/release/lifeguard" /out/lifeguard \
 && ln -s lifeguard /out/kubectl-lifeguard \
 && /out/lifeguard --version

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /
# 65532 is distroless's `nonroot`; the chart's securityContext asks for the same UID.
USER 65532:65532
ENTRYPOINT ["/lifeguard"]
