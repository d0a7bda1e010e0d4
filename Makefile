# sandbox-operator — every target does its own set-up on a fresh machine (idempotent, cached
# under ~/.cache/sandbox-operator), so `make demo` and `make test` are all a new user needs.

SHELL := /bin/bash
CARGO ?= cargo
export SANDBOX_BASE_IMAGE ?= sandbox-operator/base:bookworm

.PHONY: all build test test-setup lint unit crds crds-check demo demo-down bench image clean-cache

all: build

build:
	$(CARGO) build

## Start (or reuse) what the integration tests talk to: a Docker engine with the locally
## built base image, a real kube-apiserver + etcd, an S3 server, an image registry and
## real Kubernetes nodes (kubelet + containerd, scheduler, controller-manager), and the
## official E2B Python SDK (pinned) in a virtualenv for the E2B API tests.
test-setup:
	bash tests/setup/docker.sh
	bash tests/setup/gvisor.sh
	bash tests/setup/base-image.sh
	bash tests/cluster/up.sh
	bash tests/setup/s3.sh
	bash tests/setup/registry.sh
	bash tests/setup/tools.sh
	bash tests/setup/e2b-py.sh
	bash tests/setup/node.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## The README's test command: set-up, formatting, lints, then every test.
test: test-setup lint
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --all-targets --no-fail-fast -- --test-threads=4; status=$$?; \
	  bash tests/cluster/gc.sh; exit $$status

## Regenerate the checked-in CRDs (tests/crds.rs fails when they are stale).
crds:
	$(CARGO) run --quiet -- crds --out crds
	rm -f charts/sandbox-operator/crds/*.yaml && cp crds/*.yaml charts/sandbox-operator/crds/

demo:
	bash examples/demo.sh

demo-down:
	bash examples/demo.sh down

## Performance figures of docs/architecture.md (ratios against the raw provider, same run); not run in CI.
bench:
	bash bench/run.sh
	bash bench/runtimes.sh
	bash bench/egress.sh
	bash bench/access.sh
	bash bench/pool.sh
	bash bench/e2b.sh

## The operator image, built locally (no registry needed): the release binary is compiled on
## the host and stripped into target/image/, then the multi-stage Dockerfile (FROM the local
## Debian base image, final stage FROM scratch, user 65532) packs it — see the Dockerfile for
## why the build stage cannot compile Rust itself. Tag: $(SANDBOX_IMAGE).
SANDBOX_IMAGE ?= sandbox-operator:$(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n1)
image:
	bash tests/setup/docker.sh
	bash tests/setup/base-image.sh
	$(CARGO) build --release --bin sandbox-operator
	mkdir -p target/image
	strip -o target/image/sandbox-operator target/release/sandbox-operator
	docker build --build-arg BASE_IMAGE=$(SANDBOX_BASE_IMAGE) -t $(SANDBOX_IMAGE) .
	@docker image inspect --format '$(SANDBOX_IMAGE): {{.Size}} bytes, user {{.Config.User}}' $(SANDBOX_IMAGE)
