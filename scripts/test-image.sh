#!/usr/bin/env bash
# Build the container image from deploy/Dockerfile and run it as the Kubernetes StatefulSet
# runs it: three containers of the image (its user, a read-only root, no capabilities, the
# ConfigMap mounted read-only) form a cluster that becomes ready and keeps the ConfigMap's
# cluster limit; the image's user, entrypoint and flags are checked against this build.
#
#   bash scripts/test-image.sh                 # podman (installed if missing)
#   ENGINE=docker bash scripts/test-image.sh   # an engine that can pull the base images
#
# The base images (a Rust toolchain image and distroless `cc`) come from registries. Where
# they cannot be pulled (a machine that reaches only Debian's and Rust's own servers), the
# script builds local stand-ins, tagged `localhost/sluice-standin/...` and passed as build
# arguments (the Dockerfile's defaults are the real images):
# - the builder: Debian trixie (debootstrap) with rustup's toolchain of the version the
#   Dockerfile names, laid out as the official `rust` image (RUSTUP_HOME, CARGO_HOME);
# - the runtime: the files of the Debian packages distroless `cc` holds (libc6, libgcc-s1,
#   libstdc++6, libgomp1, libssl3t64, tzdata, CA certificates), /etc/passwd with `nonroot`
#   (65532), no shell, user 65532.
# The builder stand-in also trusts the host's local CA certificates
# (/usr/local/share/ca-certificates), so that a TLS-inspecting proxy does not stop cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE="${ENGINE:-podman}"
IMAGE="${IMAGE:-localhost/sluice:test}"
CACHE="${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice-image}"
SUITE="${SUITE:-trixie}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
started=$(date +%s)
mkdir -p "$CACHE"
say() { printf '[test-image +%ss] %s\n' "$(($(date +%s) - started))" "$*" >&2; }

need=()
command -v "$ENGINE" >/dev/null || need+=("$ENGINE")
if [ "$ENGINE" = podman ]; then
    command -v runc >/dev/null || need+=(runc)
    command -v debootstrap >/dev/null || need+=(debootstrap)
fi
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq >/dev/null
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ "$ENGINE" = podman ]; then
    # runc rather than crun: crun refuses hosts whose cgroups are mounted in hybrid mode.
    # Resource limits no higher than this shell's own (podman's defaults can be above a
    # container host's hard limits, which a process without CAP_SYS_RESOURCE cannot raise).
    nofile=$(ulimit -Hn)
    if [ "$nofile" = unlimited ]; then nofile=1048576; fi
    nproc=$(ulimit -Hu)
    if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
    CONTAINERS_CONF="$(mktemp -d)/containers.conf"
    cat >"$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
    export CONTAINERS_CONF
fi

# The Dockerfile's base images (its ARG defaults).
arg_default() { sed -n "s/^ARG $1=//p" deploy/Dockerfile; }
builder=$(arg_default BUILDER_IMAGE)
runtime=$(arg_default RUNTIME_IMAGE)
[ -n "$builder" ] && [ -n "$runtime" ] || { echo "deploy/Dockerfile: no BUILDER_IMAGE/RUNTIME_IMAGE" >&2; exit 1; }

have() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }
# A base image by its full name (podman would match a short name against any local image
# of that name, a stand-in included).
qualify() {
    case "$1" in
    *.*/* | localhost/*) echo "$1" ;;
    */*) echo "docker.io/$1" ;;
    *) echo "docker.io/library/$1" ;;
    esac
}
pullable() {
    local q
    q=$(qualify "$1")
    have "$q" || timeout 60 "$ENGINE" pull -q "$q" >/dev/null 2>&1
}

rootfs() { # a Debian $SUITE root file system, cached as a tarball
    local tar="$CACHE/$SUITE-rootfs.tar"
    if [ ! -s "$tar" ]; then
        say "debootstrap $SUITE (minbase + gcc, libc6-dev, curl, ca-certificates, libssl3t64, libstdc++6, libgomp1, tzdata)"
        local dir
        dir=$(mktemp -d)
        debootstrap --variant=minbase \
            --include=ca-certificates,gcc,libc6-dev,curl,libssl3t64,libstdc++6,libgomp1,tzdata \
            "$SUITE" "$dir" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
            || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
        tar -C "$dir" -cf "$tar.part" . && mv "$tar.part" "$tar"
        rm -rf "$dir"
    fi
    echo "$tar"
}

build_args=()
if ! pullable "$builder"; then
    version=${builder#*:}
    version=${version%%-*}
    stand=localhost/sluice-standin/rust:$version-$SUITE
    if ! have "$stand"; then
        base=localhost/sluice-standin/debian:$SUITE
        have "$base" || "$ENGINE" import -q "$(rootfs)" "$base" >/dev/null
        say "$builder cannot be pulled: building $stand (rustup, Rust $version)"
        ctx=$(mktemp -d)
        mkdir "$ctx/ca"
        cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/" 2>/dev/null || true
        cat >"$ctx/Containerfile" <<EOF
FROM $base
COPY ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null 2>&1
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUST_VERSION=$version
RUN curl -sSf -o /tmp/rustup-init https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init \
 && chmod +x /tmp/rustup-init \
 && /tmp/rustup-init -y -q --no-modify-path --profile minimal --default-toolchain \$RUST_VERSION \
 && rm /tmp/rustup-init && chmod -R a+w \$RUSTUP_HOME \$CARGO_HOME && rustc --version
EOF
        "$ENGINE" build -q --network host --pull=never -t "$stand" "$ctx" >/dev/null
        rm -rf "$ctx"
    fi
    build_args+=(--build-arg "BUILDER_IMAGE=$stand")
fi
if ! pullable "$runtime"; then
    stand=localhost/sluice-standin/cc:$SUITE-nonroot
    if ! have "$stand"; then
        say "$runtime cannot be pulled: building $stand"
        dir=$(mktemp -d)
        out=$(mktemp -d)
        tar -C "$dir" -xf "$(rootfs)"
        # The packages' files (and symlinks), the CA bundle, os-release, the merged-/usr links.
        {
            for p in libc6 libgcc-s1 libstdc++6 libgomp1 libssl3t64 tzdata; do
                chroot "$dir" dpkg -L "$p"
            done
            printf '%s\n' /etc/ssl/certs/ca-certificates.crt /etc/os-release /usr/lib/os-release \
                /bin /sbin /lib /lib64
        } | sort -u | while read -r f; do
            if [ -L "$dir$f" ] || [ -f "$dir$f" ]; then echo ".$f"; fi
        done >"$out.list"
        (cd "$dir" && tar -c --no-recursion -T "$out.list") | tar -C "$out" -x
        mkdir -p "$out/tmp" "$out/home/nonroot" "$out/root" "$out/etc"
        chmod 1777 "$out/tmp"
        chmod 700 "$out/root"
        chown 65532:65532 "$out/home/nonroot"
        printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
            'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
            'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$out/etc/passwd"
        printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$out/etc/group"
        if [ -e "$out/bin/sh" ] || [ -e "$out/usr/bin/sh" ]; then
            echo "the runtime stand-in has a shell" >&2
            exit 1
        fi
        tar -C "$out" -c . | "$ENGINE" import -q \
            --change 'USER 65532' --change 'WORKDIR /home/nonroot' \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
            - "$stand" >/dev/null
        rm -rf "$dir" "$out" "$out.list"
    fi
    build_args+=(--build-arg "RUNTIME_IMAGE=$stand")
fi

say "building $IMAGE from deploy/Dockerfile ${build_args[*]}"
build_flags=(--pull=never)
[ "$ENGINE" = podman ] && build_flags+=(--network host --ignorefile deploy/Dockerfile.dockerignore)
t0=$(date +%s)
"$ENGINE" build "${build_flags[@]}" "${build_args[@]}" -f deploy/Dockerfile -t "$IMAGE" . \
    >"$CACHE/build.log" 2>&1 || { tail -40 "$CACHE/build.log" >&2; exit 1; }
size=$("$ENGINE" image inspect "$IMAGE" --format '{{.Size}}')
say "built $IMAGE in $(($(date +%s) - t0)) s: $((size / 1000000)) MB"

say "running the image's tests"
# Whatever happens to the tests, no container of theirs outlives this script.
cleanup() {
    for c in $("$ENGINE" ps -a --format '{{.Names}}' 2>/dev/null | grep '^sluice-deploy-'); do
        "$ENGINE" rm --force "$c" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT
SLUICE_TEST_IMAGE="$IMAGE" SLUICE_TEST_ENGINE="$ENGINE" \
    cargo test -p sluice --all-features --locked --test deploy -- --ignored --test-threads 1
say "done"
