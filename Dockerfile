# The rayshift image: one static binary on distroless/static, as manifests/deploy and the Helm chart run it
# (user 65532, read-only root filesystem, in-cluster configuration, every Linux capability dropped).
#
#   docker build -t rayshift:latest .
#
# distroless/static, not scratch: rayshift's HTTPS clients load the system CA certificates and refuse to start
# without any (tests/manifests_e2e.rs found it). The test runs the binary `scripts/image.sh binary` builds in a
# root holding only what this image and the kubelet give it.
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    bash scripts/image.sh binary --release --out /rayshift

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /rayshift /rayshift
USER 65532:65532
ENTRYPOINT ["/rayshift"]
