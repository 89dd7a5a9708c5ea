#!/bin/sh
# The Rust client's conformance runner (clients/conformance/README.md):
#   clients/rust/conformance.sh FILE...        run the scenarios
#   clients/rust/conformance.sh --steps JSON   helper mode
# Built offline (no dependencies) into LEASED_RUST_TARGET (default a
# directory under TMPDIR), never into the source tree. cargo is $CARGO,
# else rustup's in ~/.cargo/bin, else Debian's, else the one on PATH.
set -e
here=$(cd "$(dirname "$0")" && pwd)
target=${LEASED_RUST_TARGET:-${TMPDIR:-/tmp}/leased-rust-$(id -u)}
# Not rustup's proxy under another HOME (a package build sets its own,
# where rustup finds no toolchain): then Debian's.
cargo=${CARGO:-$HOME/.cargo/bin/cargo}
if [ ! -x "$cargo" ] && [ -x /usr/bin/cargo ]; then
    # With its own compiler, not rustup's proxies from PATH.
    cargo=/usr/bin/cargo
    RUSTC=${RUSTC:-/usr/bin/rustc}
    RUSTDOC=${RUSTDOC:-/usr/bin/rustdoc}
    export RUSTC RUSTDOC
fi
[ -x "$cargo" ] || cargo=cargo
bin=$target/release/leased-conformance
# A helper process starts while its scenario runs: the binary is there
# and current, built by the run that spawned it.
if [ "$1" != "--steps" ] || [ ! -x "$bin" ]; then
    CARGO_TARGET_DIR=$target "$cargo" build -q --offline --release \
        --manifest-path "$here/Cargo.toml" --bin leased-conformance
fi
exec "$bin" "$@"
