# Shared by scripts/test and scripts/demo: install what is missing, configure and build.
# Sourced, not run.

rlock_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { printf '==> [%s] %s\n' "$(date +%T)" "$*" >&2; }

# Installs the Debian/Ubuntu packages rlock needs to build, test and benchmark, when missing.
ensure_deps() {
    local missing=()
    command -v cmake >/dev/null || missing+=(cmake)
    command -v g++ >/dev/null || missing+=(g++)
    command -v make >/dev/null || command -v ninja >/dev/null || missing+=(make)
    command -v pkg-config >/dev/null || missing+=(pkg-config)
    command -v redis-server >/dev/null || missing+=(redis-server)
    { command -v pkg-config >/dev/null && pkg-config --exists hiredis; } || missing+=(libhiredis-dev)
    [ -e /usr/include/gtest/gtest.h ] || [ -e /usr/local/include/gtest/gtest.h ] || missing+=(googletest libgtest-dev)
    # libfaketime: the clock_jumps test preloads it into the test worker.
    [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || dpkg -s faketime >/dev/null 2>&1 || missing+=(faketime)
    [ -e /usr/include/benchmark/benchmark.h ] || [ -e /usr/local/include/benchmark/benchmark.h ] || missing+=(libbenchmark-dev)
    # Standalone Asio: the tests of rlock/asio.hpp and the coroutine example (examples/11).
    [ -e /usr/include/asio.hpp ] || [ -e /usr/local/include/asio.hpp ] || missing+=(libasio-dev)
    # python3: tests/package checks the vcpkg and Conan recipes with it (check_recipes.py).
    command -v python3 >/dev/null || missing+=(python3)
    # A German locale and libc's translations: a timeout must read as one in any locale
    # (client_errors.a_timeout_is_a_timeout_in_any_locale builds the locale with localedef).
    [ -e /usr/share/i18n/locales/de_DE ] || missing+=(locales)
    [ -e /usr/share/locale/de/LC_MESSAGES/libc.mo ] || missing+=(libc-l10n)
    if [ ${#missing[@]} -eq 0 ]; then
        return 0
    fi
    ensure_packages "${missing[@]}"
}

# ensure_packages <debian package...>: apt-get install them (as root, or through sudo).
ensure_packages() {
    local missing=("$@")
    say "installing: ${missing[*]}"
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { say "need root (or sudo) to apt-get install ${missing[*]}"; return 1; }
        sudo=(sudo)
    fi
    command -v apt-get >/dev/null || { say "no apt-get: install ${missing[*]} by hand"; return 1; }
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

generator_args() {
    if command -v ninja >/dev/null; then echo "-G Ninja"; fi
}

# configure_and_build <build dir> <sanitizers or ""> [extra cmake args...]
configure_and_build() {
    local dir=$1 sanitize=$2
    shift 2
    # shellcheck disable=SC2046
    cmake -S "$rlock_root" -B "$dir" $(generator_args) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DRLOCK_SANITIZE="$sanitize" "$@" >/dev/null
    # RLOCK_BUILD_ONLY: one target instead of all (the demo builds the one example it runs).
    cmake --build "$dir" --parallel "$(nproc 2>/dev/null || echo 2)" \
        ${RLOCK_BUILD_ONLY:+--target "$RLOCK_BUILD_ONLY"}
}

# A loopback TCP port nothing listens on (never 6379), below the kernel's ephemeral range by
# more than 10000: an outgoing connection's local port is drawn from that range and would make
# a server's bind fail (seen: a cluster node of the interop suite), and a Redis Cluster node
# also listens on its port + 10000.
free_port() {
    local port low=32768 span
    if [ -r /proc/sys/net/ipv4/ip_local_port_range ]; then
        read -r low _ </proc/sys/net/ipv4/ip_local_port_range || low=32768
    fi
    span=$((low - 10000 - 10000))
    if [ "$span" -lt 1000 ]; then span=2768; fi
    for _ in $(seq 1 100); do
        port=$(( (RANDOM % span) + 10000 ))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return 0
        fi
    done
    return 1
}
