#!/bin/sh
# The Go client's conformance runner (clients/conformance/README.md):
#   clients/go/conformance.sh FILE...        run the scenarios
#   clients/go/conformance.sh --steps JSON   helper mode
# It is built offline (no dependencies) into LEASED_GO_CACHE (default a
# directory under TMPDIR), never into the source tree.
set -e
here=$(cd "$(dirname "$0")" && pwd)
cache=${LEASED_GO_CACHE:-${TMPDIR:-/tmp}/leased-go-$(id -u)}
GOCACHE=${GOCACHE:-$cache/build}
GOPATH=${GOPATH:-$cache/path}
GOFLAGS=-mod=mod
GOPROXY=off
export GOCACHE GOPATH GOFLAGS GOPROXY
bin=$cache/leased-conformance
# A helper process starts while its scenario runs: the binary is there
# and current, built by the run that spawned it.
if [ "$1" != "--steps" ] || [ ! -x "$bin" ]; then
    mkdir -p "$cache"
    (cd "$here" && go build -o "$bin" ./cmd/leased-conformance)
fi
exec "$bin" "$@"
