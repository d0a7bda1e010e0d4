#!/usr/bin/env bash
# Build the local base image for sandbox containers (no image registry is reachable here).
#
#   image:  ${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}, label sandboxes.dev/base=true,
#           CMD ["sleep","infinity"]; contains sh, GNU tar, gzip, GNU findutils, curl,
#           ca-certificates, coreutils.
#   how:    debootstrap --variant=minbase --include=curl,ca-certificates bookworm DIR <mirror>,
#           tarred to ${XDG_CACHE_HOME:-~/.cache}/sandbox-operator/rootfs-*.tar, then `docker import`.
#
# Fast paths: image present -> exit 0 (~0.1 s); image gone but rootfs tarball cached -> re-import
# only (seconds). Delete the tarball (or set SANDBOX_BASE_REBUILD=1) to debootstrap again.
#
# Env:
#   SANDBOX_BASE_IMAGE      image tag to build (default sandbox-operator/base:bookworm)
#   SANDBOX_DEBIAN_MIRROR   Debian mirror for debootstrap (default: the one apt uses here)
#   SANDBOX_BASE_REBUILD=1  ignore the cached rootfs tarball and debootstrap again
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TAG="${SANDBOX_BASE_IMAGE:-sandbox-operator/base:bookworm}"
SUITE=bookworm
VARIANT=minbase
INCLUDE=curl,ca-certificates
LABEL='sandboxes.dev/base=true'
CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-operator"
TARBALL="$CACHE_DIR/rootfs-$SUITE-$VARIANT-${INCLUDE//,/+}.tar"

log() { printf 'base-image.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

"$HERE/docker.sh"

if docker image inspect "$TAG" >/dev/null 2>&1; then
    exit 0
fi

mkdir -p "$CACHE_DIR"
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "debootstrap needs root (and sudo is missing)"
    SUDO=(sudo -n)
fi

# Serialise concurrent builders; re-check after acquiring the lock.
exec 8>"$CACHE_DIR/base-image.lock"
flock -w 900 8 || die "timed out waiting for lock $CACHE_DIR/base-image.lock"
if docker image inspect "$TAG" >/dev/null 2>&1; then
    exit 0
fi

# Print the Debian mirror apt uses for $SUITE (main), from deb822 .sources files or one-line
# sources.list entries. Security/updates/third-party repositories are skipped.
apt_mirrors() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        # deb822: paragraphs separated by blank lines; fields URIs:, Suites:, Components:.
        awk -v suite="$SUITE" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && (" " comps " ") ~ / main /) {
                    n = split(uris, u, " "); for (i = 1; i <= n; i++) print u[i]
                }
                types = ""; uris = ""; suites = ""; comps = ""; enabled = 1
            }
            BEGIN { enabled = 1 }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { if (enabled) flush(); else { types = ""; enabled = 1 }; next }
            { key = tolower($1); sub(/:$/, "", key); $1 = "" ; sub(/^ +/, "") }
            key == "types"      { types = $0 }
            key == "uris"       { uris = $0 }
            key == "suites"     { suites = $0 }
            key == "components" { comps = $0 }
            key == "enabled" && tolower($0) == "no" { enabled = 0 }
            END { if (enabled) flush() }
        ' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        # deb [opts] URI suite comp...
        sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" \
            | awk -v suite="$SUITE" '$1 == "deb" && $3 == suite { for (i = 4; i <= NF; i++) if ($i == "main") { print $2; break } }'
    done
}

pick_mirror() {
    local m candidates=()
    if [ -n "${SANDBOX_DEBIAN_MIRROR:-}" ]; then
        candidates=("$SANDBOX_DEBIAN_MIRROR")
    else
        mapfile -t candidates < <(apt_mirrors | awk '!seen[$0]++')
        candidates+=(http://deb.debian.org/debian)   # last resort
    fi
    for m in "${candidates[@]}"; do
        m="${m%/}"
        case "$m" in http://*|https://*) ;; *) continue ;; esac
        if curl -fsS -o /dev/null --max-time 15 "$m/dists/$SUITE/Release"; then
            printf '%s\n' "$m"
            return 0
        fi
        log "mirror $m not reachable, trying next"
    done
    return 1
}

build_rootfs() {
    if ! command -v debootstrap >/dev/null 2>&1; then
        log "installing debootstrap with apt-get..."
        local deadline=$((SECONDS + 600))
        while pgrep -x apt-get >/dev/null 2>&1 || pgrep -x dpkg >/dev/null 2>&1; do
            [ "$SECONDS" -lt "$deadline" ] || die "apt-get/dpkg still busy after 600 s"
            sleep 2
        done
        if ! command -v debootstrap >/dev/null 2>&1; then
            export DEBIAN_FRONTEND=noninteractive
            "${SUDO[@]}" apt-get install -y --no-install-recommends debootstrap >>"$CACHE_DIR/apt.log" 2>&1 \
                || { "${SUDO[@]}" apt-get update >>"$CACHE_DIR/apt.log" 2>&1 \
                     && "${SUDO[@]}" apt-get install -y --no-install-recommends debootstrap >>"$CACHE_DIR/apt.log" 2>&1; } \
                || die "could not install debootstrap (see $CACHE_DIR/apt.log)"
        fi
    fi

    local mirror
    mirror="$(pick_mirror)" || die "no reachable Debian mirror for $SUITE (set SANDBOX_DEBIAN_MIRROR)"
    log "debootstrap $SUITE ($VARIANT, +$INCLUDE) from $mirror ..."

    WORK="$(mktemp -d "$CACHE_DIR/rootfs-build.XXXXXX")"
    trap cleanup EXIT
    local rootfs="$WORK/rootfs" dlog="$CACHE_DIR/debootstrap.log"
    if ! "${SUDO[@]}" debootstrap --variant="$VARIANT" --include="$INCLUDE" \
            "$SUITE" "$rootfs" "$mirror" >"$dlog" 2>&1; then
        tail -n 20 "$dlog" >&2
        [ -f "$rootfs/debootstrap/debootstrap.log" ] && tail -n 20 "$rootfs/debootstrap/debootstrap.log" >&2
        die "debootstrap failed (full log: $dlog)"
    fi
    # Trim: downloaded .debs and apt lists are not needed in the image.
    "${SUDO[@]}" find "$rootfs/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -delete
    "${SUDO[@]}" find "$rootfs/var/lib/apt/lists" -mindepth 1 -maxdepth 1 -type f -delete
    "${SUDO[@]}" rm -rf "$rootfs/debootstrap"
    # Same apt source inside the image, in case a test wants apt-get.
    printf 'deb %s %s main\n' "$mirror" "$SUITE" | "${SUDO[@]}" tee "$rootfs/etc/apt/sources.list" >/dev/null

    "${SUDO[@]}" tar --numeric-owner --xattrs -C "$rootfs" -cf "$WORK/rootfs.tar" .
    "${SUDO[@]}" chown "$(id -u):$(id -g)" "$WORK/rootfs.tar"
    mv -f "$WORK/rootfs.tar" "$TARBALL"     # atomic: a half-written tarball is never cached
    log "cached rootfs tarball $TARBALL ($(du -h "$TARBALL" | cut -f1))"
}

WORK=""
cleanup() {
    [ -n "$WORK" ] && [ -d "$WORK" ] || return 0
    # debootstrap normally unmounts proc/sys itself; make sure nothing stays mounted under
    # WORK before deleting it (rm -rf through a bind-mounted /dev or /proc would be bad).
    local mp
    while read -r mp; do
        "${SUDO[@]}" umount -l "$mp" 2>/dev/null || true
    done < <(findmnt -rn -o TARGET | grep -F "$WORK/" | sort -r)
    "${SUDO[@]}" rm -rf --one-file-system "$WORK"
}

if [ "${SANDBOX_BASE_REBUILD:-0}" = 1 ] || [ ! -s "$TARBALL" ]; then
    build_rootfs
else
    log "re-importing cached rootfs $TARBALL"
fi

docker import \
    --change 'CMD ["sleep","infinity"]' \
    --change "LABEL $LABEL" \
    --message "debootstrap --variant=$VARIANT --include=$INCLUDE $SUITE" \
    "$TARBALL" "$TAG" >/dev/null \
    || die "docker import of $TARBALL as $TAG failed"

# Smoke test: the tools the operator relies on are there and are the GNU ones.
if ! out="$(docker run --rm --entrypoint sh "$TAG" -c '
        set -e
        tar --version | head -n1 | grep -q "GNU tar"
        find --version | head -n1 | grep -q "GNU findutils"
        gzip --version >/dev/null
        curl --version >/dev/null
        mktemp -d >/dev/null
        command -v sleep >/dev/null
        test -s /etc/ssl/certs/ca-certificates.crt
        echo ok' 2>&1)" || [ "$out" != ok ]; then
    docker rmi "$TAG" >/dev/null 2>&1 || true
    die "image $TAG failed its smoke test: $out"
fi
log "built $TAG ($(docker image inspect --format '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
