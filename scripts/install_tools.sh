#!/usr/bin/env bash
# Install the pinned Go tools into .tools/bin: protoc plugins for the Go
# client, the real grpcurl, grpc_health_probe and ghz binaries that CI runs
# against a live server, and Toxiproxy for the network fault tests. Re-running is cheap: existing binaries are kept
# unless their pinned version changed (the version is part of the stamp name).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GOBIN="$PWD/.tools/bin"
export GOFLAGS="${GOFLAGS:-} -trimpath"
mkdir -p "$GOBIN"

TOOLS=(
  "google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12"
  "google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2"
  "github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4"
  "github.com/grpc-ecosystem/grpc-health-probe@v0.4.62"
  "github.com/bojand/ghz/cmd/ghz@v0.120.0"
  # deploy/kubernetes: tests/polyglot/test_kubernetes.py renders the kustomizations with it.
  "sigs.k8s.io/kustomize/kustomize/v5@v5.7.1"
  # tests/faults: Toxiproxy's server and CLI (installed as `server` and `cli`; renamed below).
  "github.com/Shopify/toxiproxy/v2/cmd/...@v2.5.0"
)

for tool in "${TOOLS[@]}"; do
  stamp="$GOBIN/.$(echo "$tool" | tr '/@' '__')"
  [ -f "$stamp" ] && continue
  echo "go install $tool"
  go install "$tool"
  touch "$stamp"
done

# `go install` names the binary after the module (grpc-health-probe); the upstream
# releases, the docs and Kubernetes' examples call it grpc_health_probe.
if [ -f "$GOBIN/grpc-health-probe" ]; then
  mv -f "$GOBIN/grpc-health-probe" "$GOBIN/grpc_health_probe"
fi
# Toxiproxy's commands are plain `server` and `cli`; its releases name them toxiproxy-*.
for command in server cli; do
  if [ -f "$GOBIN/$command" ]; then
    mv -f "$GOBIN/$command" "$GOBIN/toxiproxy-$command"
  fi
done
