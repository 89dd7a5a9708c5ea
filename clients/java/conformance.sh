#!/bin/sh
# The Java runner of the conformance suite (clients/conformance/README.md):
#   sh clients/java/conformance.sh FILE...        run scenarios
#   sh clients/java/conformance.sh --steps JSON   a helper process
# The client and the runner are built with javac into a directory under
# $TMPDIR named after a checksum of their sources, once: the helper
# processes of a run, started the same way, reuse it.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
sum=$(cat "$here/build.sh" $(find "$here/src" -name '*.java' | LC_ALL=C sort) |
    cksum | cut -d' ' -f1)
base=${TMPDIR:-/tmp}
out="$base/leased-java-$(id -u)-$sum"
if [ ! -f "$out/done" ]; then
    tmp=$(mktemp -d "$base/leased-java-build.XXXXXX")
    sh "$here/build.sh" "$tmp" >&2
    : >"$tmp/done"
    # Another run may have built it meanwhile: either copy will do.
    mv -T "$tmp" "$out" 2>/dev/null || rm -rf "$tmp"
    [ -f "$out/done" ] || { rm -rf "$out"; exit 1; }
fi
exec java -cp "$out/leased-client.jar:$out/conformance-classes" \
    io.leased.Conformance "$@"
