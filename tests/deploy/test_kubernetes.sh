#!/usr/bin/env bash
# test_kubernetes.sh [SOURCE_DIR [REBOUND]]: every overlay in
# deploy/kubernetes/overlays renders with `kubectl kustomize`, and
# k8s-validate/validate.mjs passes each rendered object: its Kubernetes or
# Prometheus Operator schema, no unknown fields, Pod Security "restricted"
# on pod templates, rebound's image tag (the project version), probes,
# security context and shutdown time, and what the overlay is for (sidecar:
# rebound a native sidecar the app points at, with a PodMonitor;
# standalone: replicas behind a Service, a PodDisruptionBudget, a
# ServiceMonitor); with REBOUND, that `REBOUND --check` accepts each rebound
# container's ConfigMap and args. Installs the validator's npm packages
# (package-lock.json) when node_modules is missing.
# Exit 77 (skipped) without kubectl or node.
set -euo pipefail
src=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
rebound=${2:-}
validator=$src/tests/deploy/k8s-validate
for tool in kubectl node; do
  if ! command -v "$tool" >/dev/null; then
    echo "test_kubernetes: $tool not found, skipped"
    exit 77
  fi
done
if [ ! -d "$validator/node_modules/kubernetes-models" ]; then
  echo "test_kubernetes: npm ci in tests/deploy/k8s-validate"
  (cd "$validator" && npm ci --no-audit --no-fund --loglevel=error)
fi
version=$(sed -n 's/^project(rebound VERSION \([0-9][0-9.]*\).*/\1/p' \
  "$src/CMakeLists.txt")
if [ -z "$version" ]; then
  echo "test_kubernetes: no project VERSION in $src/CMakeLists.txt"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "test_kubernetes: $(kubectl version --client 2>/dev/null | tr '\n' ' ')node $(node --version), project version $version"
tree=$src/deploy/kubernetes
# The kustomize in kubectl 1.20 and older (Debian 12's kubernetes-client)
# takes a base only under `bases:`, which newer ones warn is deprecated:
# with such a kubectl, render a copy of the overlays that says `bases:`.
if ! kubectl kustomize "$tree/overlays/sidecar" >/dev/null 2>"$tmp/err" &&
  grep -q 'must be a file' "$tmp/err"; then
  echo "test_kubernetes: this kustomize wants bases: for ../../base, rendering a copy that has it"
  cp -r "$tree" "$tmp/kubernetes"
  tree=$tmp/kubernetes
  for k in "$tree"/overlays/*/kustomization.yaml; do
    sed -i '\#^  - \.\./\.\./base$#d' "$k"
    printf 'bases:\n  - ../../base\n' >>"$k"
  done
fi
args=()
[ -z "$rebound" ] || args+=(--rebound "$rebound")
for dir in "$tree"/overlays/*/; do
  overlay=$(basename "$dir")
  kubectl kustomize "$dir" >"$tmp/$overlay.yaml"
  echo "test_kubernetes: rendered overlays/$overlay ($(grep -c '^kind:' "$tmp/$overlay.yaml") objects)"
  args+=("$overlay=$tmp/$overlay.yaml")
done
node "$validator/validate.mjs" --version "$version" "${args[@]}"
echo "test_kubernetes: ok"
