#!/bin/sh
# Build the Java client with the JDK alone (no Maven, nothing fetched):
#   sh build.sh OUTDIR
# leaves OUTDIR/leased-client.jar (the library), OUTDIR/test-classes (the
# test main, io.leased.TestLeased) and OUTDIR/conformance-classes (the
# conformance runner, io.leased.Conformance). Nothing is written into the
# source tree.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUTDIR}
mkdir -p "$out/classes" "$out/test-classes" "$out/conformance-classes"
# -try: `try (var held = ld.lock(...))` is how a hold is meant to be used,
# body referring to it or not.
flags="-Xlint:all,-try -Werror -encoding UTF-8 --release 17"
javac $flags -d "$out/classes" $(find "$here/src/main/java" -name '*.java')
jar --create --file "$out/leased-client.jar" -C "$out/classes" .
javac $flags -cp "$out/leased-client.jar" -d "$out/test-classes" \
    "$here/src/test/java/io/leased/TestLeased.java"
if [ -f "$here/src/test/java/io/leased/Conformance.java" ]; then
    javac $flags -cp "$out/leased-client.jar" -d "$out/conformance-classes" \
        "$here/src/test/java/io/leased/Conformance.java"
fi
