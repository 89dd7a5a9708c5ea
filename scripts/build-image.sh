#!/bin/sh
# An OCI image of leased, built without a container daemon (umoci, Debian
# package umoci): `make image`, or scripts/build-image.sh BUILDDIR OUT.
#
# The root file system holds only leased and leasectl (make install into
# it), the shared libraries ldd names for them with the dynamic loader,
# passwd/group entries for the user it runs as (leased, 65532, not root),
# the empty mount points /run/leased (the socket, shared with the app) and
# /var/lib/leased (the journal), and contrib/kubernetes/leased.yml as
# /etc/leased/leased.yml, which a ConfigMap replaces. Nothing is written
# outside those volumes, so the root can be mounted read-only.
#
# OUT/oci is the OCI image layout (tag leased:VERSION), OUT/leased.oci.tar
# the same as one archive for `podman load`, `skopeo copy oci-archive:` or
# a registry push.
set -eu

TOP=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$TOP}
OUT=${2:-$BUILD/build-image}
UID_GID=65532
ROOT=$OUT/rootfs

command -v umoci >/dev/null 2>&1 ||
    { echo "build-image: umoci not found (Debian package umoci)" >&2; exit 1; }
VERSION=$(sed -n 's/^PACKAGE_VERSION = //p' "$BUILD/Makefile")
TAG=${IMAGE_TAG:-$VERSION}

rm -rf "$OUT"
mkdir -p "$ROOT"
make -s -C "$BUILD" install-sbinPROGRAMS install-binPROGRAMS \
    DESTDIR="$ROOT" prefix=/usr/local >/dev/null
find "$ROOT" -type f -perm -u+x -exec strip --strip-unneeded {} +

# The libraries and the loader the binaries load, at the paths ldd shows.
for bin in "$ROOT"/usr/local/sbin/leased "$ROOT"/usr/local/bin/leasectl; do
    ldd "$bin" | awk '/=> \// { print $3 } /^\t\// { print $1 }'
done | sort -u | while read -r lib; do
    cp -L --parents "$lib" "$ROOT"
done

mkdir -p "$ROOT/etc/leased" "$ROOT/run/leased" "$ROOT/var/lib/leased" \
    "$ROOT/tmp"
chmod 1777 "$ROOT/tmp"
cp "$TOP/contrib/kubernetes/leased.yml" "$ROOT/etc/leased/leased.yml"
chmod 0644 "$ROOT/etc/leased/leased.yml"
chown "$UID_GID:$UID_GID" "$ROOT/run/leased" "$ROOT/var/lib/leased"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nleased:x:%s:%s:leased:/nonexistent:/usr/sbin/nologin\n' \
    "$UID_GID" "$UID_GID" > "$ROOT/etc/passwd"
printf 'root:x:0:\nleased:x:%s:\n' "$UID_GID" > "$ROOT/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' \
    > "$ROOT/etc/nsswitch.conf"

IMG=$OUT/oci:$TAG
umoci init --layout "$OUT/oci"
umoci new --image "$IMG"
umoci insert --image "$IMG" --history.created_by "scripts/build-image.sh" \
    "$ROOT" /
umoci config --image "$IMG" \
    --config.user "$UID_GID:$UID_GID" \
    --config.entrypoint /usr/local/sbin/leased \
    --config.cmd -f --config.cmd -c --config.cmd /etc/leased/leased.yml \
    --config.volume /run/leased --config.volume /var/lib/leased \
    --config.exposedports 9379/tcp \
    --config.env LEASED_SOCKET=/run/leased/leased.sock \
    --config.label org.opencontainers.image.title=leased \
    --config.label "org.opencontainers.image.version=$VERSION"
umoci gc --layout "$OUT/oci"
tar -C "$OUT/oci" -cf "$OUT/leased.oci.tar" .
echo "build-image: $IMG ($(du -sh "$OUT/leased.oci.tar" | cut -f1))"
