#!/usr/bin/env bash
# Builds the control-plane binaries the integration tests start (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kubelet, kwok, helm) from their published Go
# modules with the local Go toolchain, into a cache directory OUTSIDE the repository.
# Anything already built at the pinned version is skipped, so a warm run takes a second.
#
#   tests/scripts/build-control-plane.sh          # build what is missing, print the bin dir
#   GPUVAL_TOOLS_DIR=/some/dir tests/scripts/...  # choose the cache directory
#
# The test-support library finds the binaries through the same default (or GPUVAL_TOOLS_DIR).
set -euo pipefail

K8S_VERSION=1.36.3      # kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet
ETCD_VERSION=3.6.16
KWOK_VERSION=0.8.0
HELM_VERSION=3.22.0

# Keep in sync with tests/src/tools.rs (default_tools_dir).
TOOLS_DIR="${GPUVAL_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuval/tools-k8s${K8S_VERSION}}"
BIN="$TOOLS_DIR/bin"
mkdir -p "$BIN"

if ! command -v go >/dev/null 2>&1; then
  echo "error: the Go toolchain is needed to build the control plane; install Go >= 1.25" >&2
  exit 1
fi

export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
LDF_STRIP="-s -w"
log() { printf '[build-control-plane] %s\n' "$*" >&2; }

# have NAME VERSION: true when $BIN/NAME was built at VERSION (stamp file beside it).
have() { [ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" > "$BIN/.$1.version"; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- etcd: server/v3 has local replace directives, so `go install pkg@v` refuses it; build it
#     as a dependency of a throwaway module, where a dependency's replaces are ignored.
if ! have etcd "$ETCD_VERSION"; then
  log "building etcd v$ETCD_VERSION"
  mkdir -p "$work/etcd" && (
    cd "$work/etcd"
    go mod init gpuval.local/etcdbuild >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >/dev/null
    go build -trimpath -ldflags "$LDF_STRIP" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
  )
  stamp etcd "$ETCD_VERSION"
fi

# --- Kubernetes: k8s.io/kubernetes requires every staging module at v0.0.0 with local replaces;
#     point each at its published v0.X.Y in a throwaway module.
k8s_bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)
need_k8s=()
for b in "${k8s_bins[@]}"; do have "$b" "$K8S_VERSION" || need_k8s+=("$b"); done
if [ ${#need_k8s[@]} -gt 0 ]; then
  log "building ${need_k8s[*]} v$K8S_VERSION (the slow part: several minutes per binary on 2 cores)"
  mkdir -p "$work/k8s" && (
    cd "$work/k8s"
    go mod init gpuval.local/k8sbuild >/dev/null 2>&1
    gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    staging_ver="v0.${K8S_VERSION#1.}"
    for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => \./staging/.*#\1#p' "$gomod"); do
      go mod edit -replace="$m=$m@$staging_ver"
    done
    go get "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null
    minor="${K8S_VERSION#1.}"; minor="${minor%%.*}"
    ver_ldflags="$LDF_STRIP"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ver_ldflags+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    for b in "${need_k8s[@]}"; do
      log "  go build $b"
      go build -trimpath -ldflags "$ver_ldflags" -o "$BIN/$b" "k8s.io/kubernetes/cmd/$b"
      stamp "$b" "$K8S_VERSION"
    done
  )
fi

# --- kwok and helm: plain modules without replace directives.
if ! have kwok "$KWOK_VERSION"; then
  log "building kwok v$KWOK_VERSION"
  GOBIN="$BIN" go install -trimpath -ldflags "$LDF_STRIP" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
  stamp kwok "$KWOK_VERSION"
fi
# helm with the version settings of its release builds (its Makefile's ldflags): its own version,
# and the Kubernetes version `helm template` assumes offline, the minor of the client-go it is
# built with (without them it assumes 1.20 and refuses the chart's kubeVersion >= 1.30).
HELM_STAMP="$HELM_VERSION+release-ldflags"
if ! have helm "$HELM_STAMP"; then
  log "building helm v$HELM_VERSION"
  helm_mod=$(go mod download -json "helm.sh/helm/v3@v$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  client_minor=$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$helm_mod" | head -1)
  helm_ldflags="$LDF_STRIP -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${client_minor:?no client-go version in the go.mod of helm}"
  done
  GOBIN="$BIN" go install -trimpath -ldflags "$helm_ldflags" "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  stamp helm "$HELM_STAMP"
fi

log "control plane binaries ready in $BIN"
echo "$BIN"
