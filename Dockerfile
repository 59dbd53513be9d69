# syntax=docker/dockerfile:1
# A small static image of the tollgate binary:
#   docker build -t tollgate:0.1.0 .
#   docker run --rm -p 8080:8080 -p 8081:8081 tollgate:0.1.0
# (then deploy/kubernetes/deployment.yaml runs it; see docs/deploy.md).

# Build: Alpine's Rust targets musl and links statically, so the binary needs
# no libc in the final image. Redis TLS and gRPC TLS use rustls with ring,
# which builds with the C compiler alone.
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev
# A smaller binary: no debug line tables (the workspace's release profile
# keeps them for profiling) and no symbols.
ENV CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_PROFILE_RELEASE_STRIP=symbols
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY examples examples
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tollgate-server --bin tollgate \
    && cp target/release/tollgate /tollgate

# Run: distroless's static base (CA certificates for TLS, /etc/passwd with
# the nonroot user, nothing else: no shell, no package manager).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /tollgate /usr/local/bin/tollgate
# envoyproxy/ratelimit's Deployments run /bin/ratelimit: under that name the
# binary reads its environment (docs/envoy.md, Settings), so they run as written.
COPY --from=build /tollgate /bin/ratelimit
# 65532, the uid the Deployment's securityContext names.
USER 65532:65532
# The HTTP API, /metrics and probes; Envoy's Rate Limit Service over gRPC.
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["serve", "--http", "0.0.0.0:8080", "--grpc", "0.0.0.0:8081"]
