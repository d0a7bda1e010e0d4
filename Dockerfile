# The sandbox-operator image: the operator binary, the few shared libraries it links, CA
# certificates and a non-root user — nothing else (no shell, no package manager).
#
#   make image                      # cargo build --release, strip, docker build -t sandbox-operator:<version>
#
# Why the binary is built on the host and not in a build stage: this crate needs a current Rust
# toolchain (edition 2024), and on the machines this project is built on no image registry is
# reachable (no rust:* image to start FROM) and rustup's servers are unreachable from a
# container; Debian bookworm's packaged rustc (1.63) is far too old. So `make image` compiles
# with the host toolchain, strips the result into target/image/, and this Dockerfile takes it
# from the build context (.dockerignore sends only that file).
#
# Stage 1 (rootfs) runs on the locally built Debian bookworm base image
# (tests/setup/base-image.sh: debootstrap minbase, `docker import`): it checks that the binary
# really runs on bookworm's glibc, collects exactly the shared libraries `ldd` names, and lays
# out a minimal root filesystem. Stage 2 is FROM scratch with only that tree, running as
# 65532:65532. Works with the classic builder and BuildKit alike (no BuildKit-only syntax).

ARG BASE_IMAGE=sandbox-operator/base:bookworm

FROM ${BASE_IMAGE} AS rootfs
# Path of the stripped binary inside the build context.
ARG BINARY=target/image/sandbox-operator
# A stripped release build is ~25 MB; anything much larger is an unstripped or debug build.
ARG MAX_BINARY_MB=80
COPY ${BINARY} /staging/sandbox-operator
RUN set -eu; \
    bin=/staging/sandbox-operator; \
    size_mb=$(( $(stat -c %s "$bin") / 1048576 )); \
    if [ "$size_mb" -gt "$MAX_BINARY_MB" ]; then \
        echo "Dockerfile: $BINARY is ${size_mb} MB (> ${MAX_BINARY_MB} MB): pass a stripped release build (make image does: strip -o target/image/sandbox-operator target/release/sandbox-operator)" >&2; \
        exit 1; \
    fi; \
    chmod 0755 "$bin"; \
    # It must run here: same architecture, and no newer glibc than bookworm's.
    "$bin" version; \
    if ldd "$bin" | grep -q 'not found'; then \
        ldd "$bin" >&2; echo "Dockerfile: $BINARY needs libraries bookworm does not have" >&2; exit 1; \
    fi; \
    mkdir -p /rootfs/usr/local/bin /rootfs/etc/ssl/certs /rootfs/tmp /rootfs/home/nonroot; \
    cp "$bin" /rootfs/usr/local/bin/sandbox-operator; \
    # The shared libraries the binary links (libc, libm, libgcc_s) and the dynamic loader,
    # at the paths ldd reports, symlinks resolved.
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do \
        cp -L --parents "$lib" /rootfs/; \
    done; \
    cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/; \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > /rootfs/etc/passwd; \
    printf 'root:x:0:\nnonroot:x:65532:\n' > /rootfs/etc/group; \
    printf 'hosts: files dns\n' > /rootfs/etc/nsswitch.conf; \
    chmod 1777 /rootfs/tmp; \
    chown 65532:65532 /rootfs/home/nonroot; \
    # Smoke test of the finished tree: the binary runs from it, with only its own libraries.
    chroot --userspec=65532:65532 /rootfs /usr/local/bin/sandbox-operator version

FROM scratch
COPY --from=rootfs /rootfs/ /
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    HOME=/home/nonroot \
    TMPDIR=/tmp
USER 65532:65532
# /metrics, /healthz, /readyz
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/sandbox-operator"]
CMD ["run"]
LABEL org.opencontainers.image.title="sandbox-operator" \
      org.opencontainers.image.description="Kubernetes operator for isolated code sandboxes" \
      org.opencontainers.image.licenses="Apache-2.0"
