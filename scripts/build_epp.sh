#!/usr/bin/env bash
# Build llm-d's endpoint picker (EPP), the picker deploy/gateway names
# (ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0), from the source archive in
# ../shared/vendor (its README: provenance, checksum, build command), for tests/gateway.
#
# The binary is cached as .cache/epp/<archive sha256>/epp: once built, a run only checks
# the archive's sha256 and prints the path. The first build downloads about 300 MB of
# modules through the Go module proxy (the versions go.mod pins) and compiles for several
# minutes on 2 cores; Go's own caches make a rebuild on the same machine quick.
# .ci/run starts it early, in the background; the tier calls it again and waits (flock).
# Prints the binary's path as its last line of output.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENDOR="${INFERWIRE_VENDOR_DIR:-$PWD/../shared/vendor}"
ARCHIVE="$VENDOR/llm-d-router-v0.10.0.tar.gz"
# The vendor README's checksum, pinned here too: a changed archive (or README) is refused.
SHA256=7ce27f7cb5f4935d08a76ed6b726fa0f6f0b01c0f90d2377e3263d0c19a38f80

fail() { echo "build_epp: $*" >&2; exit 1; }

[ -f "$ARCHIVE" ] || fail "$ARCHIVE: missing (../shared/vendor beside the clone)"
grep -qF "sha256 of the archive: \`$SHA256\`" "$VENDOR/README.md" ||
  fail "$VENDOR/README.md does not state the pinned sha256 $SHA256"
actual="$(sha256sum "$ARCHIVE" | cut -d' ' -f1)"
[ "$actual" = "$SHA256" ] || fail "$ARCHIVE: sha256 $actual, expected $SHA256"

CACHE="$PWD/.cache/epp/$SHA256"
BIN="$CACHE/epp"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9  # one build at a time: the early one from .ci/run and the tier's own call

if [ ! -x "$BIN" ]; then
  command -v go >/dev/null || fail "go is not on PATH: the picker is built from source with Go"
  rm -rf "$CACHE/src"
  mkdir -p "$CACHE/src"
  tar -xzf "$ARCHIVE" -C "$CACHE/src"
  started=$SECONDS
  echo "build_epp: building the endpoint picker (first time: modules and several minutes)" >&2
  # No VCS stamp (the source sits inside this repository's work tree, not its own), no
  # toolchain download, no cgo: the archive README's command.
  (cd "$CACHE/src/llm-d-router-v0.10.0" &&
    CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-buildvcs=false" \
      go build -trimpath -o "$BIN.partial" ./cmd/epp)
  mv -f "$BIN.partial" "$BIN"
  rm -rf "$CACHE/src"
  echo "build_epp: built in $((SECONDS - started)) s" >&2
fi
echo "$BIN"
