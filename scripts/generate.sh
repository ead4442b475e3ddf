#!/usr/bin/env bash
# Regenerate everything derived from proto/: the Python, Go and TypeScript stubs
# (Java and Rust generate at build time from proto/), and the
# descriptor set (with comments) that server reflection serves to grpcurl.
# CI runs this and fails if the committed files differ.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
buf=node_modules/.bin/buf
[ -x "$buf" ] || { echo "buf not found: run 'npm ci' first" >&2; exit 1; }
"$buf" generate
clients/typescript/scripts/generate-deps.sh
"$buf" build --output server/inferwire/v1/inference.binpb
