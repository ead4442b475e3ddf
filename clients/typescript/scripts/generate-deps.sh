#!/usr/bin/env bash
# Regenerate src/gen for the standard protos the TypeScript client uses besides
# inferwire.v1: grpc.health.v1 and google.rpc.Status/BadRequest. Their .proto
# files come from the npm packages pinned in package.json (grpc-health-check,
# google-proto-files); buf and ts-proto are the repository root's pinned tools.
# scripts/generate.sh calls this; it can also be run on its own.
set -euo pipefail
client="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$(cd "$client/../.." && pwd)"
# Install the proto sources when missing or not at the pinned versions.
if ! (cd "$client" && npm ls --depth=0 google-proto-files grpc-health-check >/dev/null 2>&1); then
  (cd "$client" && npm ci --no-audit --no-fund --prefer-offline)
fi
cd "$root"
node_modules/.bin/buf generate --template clients/typescript/buf.gen.deps.yaml
