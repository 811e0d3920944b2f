#!/usr/bin/env bash
# Consumer tests for rlock's packaging, run by ctest (tests/package/CMakeLists.txt):
#
#   run.sh install          <rlock source> <work dir>   install into <work>/prefix, check the layout
#   run.sh install_tool     <rlock source> <work dir>   build and install the rlock command too
#   run.sh find_package     <rlock source> <work dir>   consumer via find_package(rlock CONFIG)
#   run.sh add_subdirectory <rlock source> <work dir>   consumer via add_subdirectory(rlock)
#   run.sh pkg_config       <rlock source> <work dir>   consumer via `pkg-config --cflags --libs`
#   run.sh recipes          <rlock source> <work dir>   vcpkg/Conan recipe checks, Conan test_package
#   run.sh headers          <rlock source> <work dir>   each public header compiles on its own
#   run.sh with_redis <program> [args...]               run <program> <redis uri> [args...]
#
# Every consumer is linked and then run against a throwaway redis-server on a free loopback
# port (never 6379), which is stopped on the way out whatever happens. find_package and
# pkg_config and recipes use the prefix the install step left in <work>/prefix (a ctest fixture).
# RLOCK_CXX picks the compiler (default: c++).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../../scripts/lib.sh
source "$here/../../scripts/lib.sh"  # say, free_port, generator_args

cxx=${RLOCK_CXX:-c++}
fail() { say "FAILED: $*"; exit 1; }

# start_redis: a redis-server on a free loopback port in a temporary directory; sets redis_uri.
redis_pid=""
redis_dir=""
stop_redis() {
    if [ -n "$redis_pid" ]; then
        kill "$redis_pid" 2>/dev/null || true
        wait "$redis_pid" 2>/dev/null || true
        redis_pid=""
    fi
    if [ -n "$redis_dir" ]; then
        rm -rf "$redis_dir"
        redis_dir=""
    fi
}
trap stop_redis EXIT
start_redis() {
    command -v redis-server >/dev/null || fail "redis-server is not installed"
    redis_dir=$(mktemp -d "${TMPDIR:-/tmp}/rlock-package-XXXXXX")
    local port
    for _ in 1 2 3 4 5; do
        port=$(free_port) || fail "no free loopback port"
        redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
            --dir "$redis_dir" --daemonize no --logfile "$redis_dir/redis.log" &
        redis_pid=$!
        for _ in $(seq 1 200); do
            if ! kill -0 "$redis_pid" 2>/dev/null; then break; fi  # exited: port taken
            if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                redis_uri="redis://127.0.0.1:$port"
                return 0
            fi
            sleep 0.05
        done
        kill "$redis_pid" 2>/dev/null || true
        wait "$redis_pid" 2>/dev/null || true
        redis_pid=""
    done
    cat "$redis_dir/redis.log" >&2 || true
    fail "could not start redis-server"
}

# run_consumer <binary>: runs it against a fresh server and insists on exit 0 and "OK".
run_consumer() {
    start_redis
    local out
    out=$("$1" "$redis_uri") || fail "$1 exited with $?"
    printf '%s\n' "$out"
    case $out in OK*) ;; *) fail "$1 did not print OK" ;; esac
    stop_redis
}

# The version CMake reads from include/rlock/version.hpp, read the same way.
source_version() {
    local h="$1/include/rlock/version.hpp" v=""
    for part in MAJOR MINOR PATCH; do
        v+="${v:+.}$(sed -n "s/^#define RLOCK_VERSION_$part \([0-9][0-9]*\)$/\1/p" "$h")"
    done
    echo "$v"
}

cmake_build() {  # cmake_build <source> <build> [configure args...]
    local src=$1 dir=$2
    shift 2
    # shellcheck disable=SC2046
    cmake -S "$src" -B "$dir" $(generator_args) -DCMAKE_CXX_COMPILER="$cxx" "$@"
    cmake --build "$dir" --parallel 2
}

mode=${1:?usage: run.sh <mode> ...}
shift
case $mode in
install)
    src=$1 work=$2
    rm -rf "$work/rlock-build" "$work/prefix"
    # As a package manager builds it: nothing but the library. The configured prefix is not
    # where it is installed (`cmake --install --prefix`), so nothing may depend on it.
    # shellcheck disable=SC2046
    cmake -S "$src" -B "$work/rlock-build" $(generator_args) -DCMAKE_CXX_COMPILER="$cxx" \
        -DCMAKE_INSTALL_PREFIX=/nonexistent/rlock-configured-prefix \
        -DRLOCK_BUILD_TESTS=OFF -DRLOCK_BUILD_EXAMPLES=OFF -DRLOCK_BUILD_BENCHMARKS=OFF \
        -DRLOCK_BUILD_TOOLS=OFF
    cmake --install "$work/rlock-build" --prefix "$work/prefix"
    prefix=$work/prefix
    for f in share/cmake/rlock/rlockConfig.cmake share/cmake/rlock/rlockConfigVersion.cmake \
             share/cmake/rlock/rlockTargets.cmake share/cmake/rlock/rlockHiredis.cmake \
             share/pkgconfig/rlock.pc; do
        [ -f "$prefix/$f" ] || fail "not installed: $f"
    done
    # Every header, and nothing else anywhere (no binaries, no test files).
    expected=$( (cd "$src" && find include/rlock -type f && printf '%s\n' \
        share/cmake/rlock/rlockConfig.cmake share/cmake/rlock/rlockConfigVersion.cmake \
        share/cmake/rlock/rlockTargets.cmake share/cmake/rlock/rlockHiredis.cmake \
        share/pkgconfig/rlock.pc) | sort)
    actual=$(cd "$prefix" && find . -type f | sed 's|^\./||' | sort)
    if [ "$expected" != "$actual" ]; then
        diff <(echo "$expected") <(echo "$actual") >&2 || true
        fail "the installed files are not the headers plus the package files (diff above)"
    fi
    if grep -rq "nonexistent/rlock-configured-prefix\|$src" "$prefix/share"; then
        grep -rn "nonexistent/rlock-configured-prefix\|$src" "$prefix/share" >&2
        fail "an installed package file names the configure-time prefix or the source tree"
    fi
    say "installed layout is right: $prefix"
    ;;
install_tool)
    # The project as a user installs it from source: the library and the rlock command, built
    # and installed to bin/ (RLOCK_BUILD_TOOLS is on by default when rlock is the top level).
    src=$1 work=$2
    rm -rf "$work/tool-build" "$work/tool-prefix"
    # shellcheck disable=SC2046
    cmake -S "$src" -B "$work/tool-build" $(generator_args) -DCMAKE_CXX_COMPILER="$cxx" \
        -DRLOCK_BUILD_TESTS=OFF -DRLOCK_BUILD_EXAMPLES=OFF -DRLOCK_BUILD_BENCHMARKS=OFF
    cmake --build "$work/tool-build"  # README's command: the build step, then the install
    cmake --install "$work/tool-build" --prefix "$work/tool-prefix"
    [ -x "$work/tool-prefix/bin/rlock" ] || fail "not installed: bin/rlock"
    out=$("$work/tool-prefix/bin/rlock" --help) || fail "bin/rlock --help did not exit 0"
    case $out in *"rlock inspect"*|*"inspect NAME"*) ;; *) fail "bin/rlock --help: $out" ;; esac
    # Nothing else besides the library's files: the headers, the package files and bin/rlock.
    extra=$(cd "$work/tool-prefix" && find . -type f ! -path './include/rlock/*' ! -path './share/*' \
        ! -path './bin/rlock' | sed 's|^\./||')
    [ -z "$extra" ] || fail "installed besides the package and bin/rlock: $extra"
    say "bin/rlock installed: $work/tool-prefix/bin/rlock"
    ;;
headers)
    # Every public header compiles on its own, header-only and with RLOCK_SEPARATE_COMPILATION
    # (a user may include any one of them first), the umbrella header also with -fno-rtti, and
    # <rlock/src.hpp> refuses, with its own message, a unit it cannot serve.
    src=$1 work=$2
    mkdir -p "$work/headers"
    flags=$(pkg-config --cflags hiredis 2>/dev/null || true)
    one=$work/headers/one.cpp
    asio=0
    printf '#include <asio.hpp>\n' >"$one"
    # shellcheck disable=SC2086
    if "$cxx" -std=c++17 -fsyntax-only $flags "$one" 2>/dev/null; then asio=1; fi
    for h in "$src"/include/rlock/*.hpp; do
        name=rlock/$(basename "$h")
        case $name in
            rlock/src.hpp) continue ;;
            rlock/asio.hpp) [ "$asio" = 1 ] || continue ;;
        esac
        printf '#include <%s>\n' "$name" >"$one"
        for mode in "" -DRLOCK_SEPARATE_COMPILATION; do
            # shellcheck disable=SC2086
            "$cxx" -std=c++17 -fsyntax-only $mode -I"$src/include" $flags "$one" ||
                fail "<$name> does not compile on its own (${mode:-header-only})"
        done
    done
    # Nor does rlock need RTTI (a program built with -fno-rtti).
    printf '#include <rlock/rlock.hpp>\n' >"$one"
    for mode in "" -DRLOCK_SEPARATE_COMPILATION; do
        # shellcheck disable=SC2086
        "$cxx" -std=c++17 -fsyntax-only -fno-rtti $mode -I"$src/include" $flags "$one" ||
            fail "<rlock/rlock.hpp> does not compile with -fno-rtti (${mode:-header-only})"
    done
    printf '#include <rlock/src.hpp>\n' >"$one"
    # shellcheck disable=SC2086
    if out=$("$cxx" -std=c++17 -fsyntax-only -I"$src/include" $flags "$one" 2>&1); then
        fail "<rlock/src.hpp> compiled without RLOCK_SEPARATE_COMPILATION"
    fi
    case $out in *"is for programs built with RLOCK_SEPARATE_COMPILATION"*) ;;
        *) fail "<rlock/src.hpp> without RLOCK_SEPARATE_COMPILATION: $out" ;; esac
    printf '#include <rlock/mutex.hpp>\n#include <rlock/src.hpp>\n' >"$one"
    # shellcheck disable=SC2086
    if out=$("$cxx" -std=c++17 -fsyntax-only -DRLOCK_SEPARATE_COMPILATION -I"$src/include" $flags \
            "$one" 2>&1); then
        fail "<rlock/src.hpp> compiled after another rlock header"
    fi
    case $out in *"must come before any other rlock header"*) ;;
        *) fail "<rlock/src.hpp> after another rlock header: $out" ;; esac
    say "every public header compiles on its own, both ways; <rlock/src.hpp> refuses misuse"
    ;;
find_package)
    src=$1 work=$2
    [ -f "$work/prefix/share/cmake/rlock/rlockConfig.cmake" ] || fail "run the install step first"
    rm -rf "$work/find_package"
    cmake_build "$here/consumer" "$work/find_package" -DCMAKE_PREFIX_PATH="$work/prefix"
    run_consumer "$work/find_package/consumer"
    run_consumer "$work/find_package/consumer_separate"
    # Without hiredis (hidden from CMake here), find_package(rlock QUIET) reports rlock not
    # found, for the project to fall back on, and REQUIRED fails naming hiredis.
    mkdir -p "$work/no_hiredis/src"
    cat > "$work/no_hiredis/src/CMakeLists.txt" <<'CMAKE'
# As old as CMake allows: the config runs under the consumer's policies.
cmake_minimum_required(VERSION 3.2)
project(no_hiredis CXX)
find_package(rlock CONFIG ${HOW})
if(rlock_FOUND)
    message(FATAL_ERROR "rlock found although hiredis is not")
endif()
message(STATUS "fallback: rlock not found")
CMAKE
    hide=(-DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_DISABLE_FIND_PACKAGE_hiredis=ON
          -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON)
    out=$(cmake -S "$work/no_hiredis/src" -B "$work/no_hiredis/quiet" "${hide[@]}" -DHOW=QUIET 2>&1) ||
        fail "find_package(rlock QUIET) without hiredis stopped the configure: $out"
    case $out in *"fallback: rlock not found"*) ;; *) fail "no fallback: $out" ;; esac
    if out=$(cmake -S "$work/no_hiredis/src" -B "$work/no_hiredis/required" "${hide[@]}" \
             -DHOW=REQUIRED 2>&1); then
        fail "find_package(rlock REQUIRED) without hiredis configured: $out"
    fi
    case $out in *"rlock needs hiredis"*) ;; *) fail "REQUIRED did not name hiredis: $out" ;; esac
    ;;
add_subdirectory)
    src=$1 work=$2
    rm -rf "$work/add_subdirectory"
    cmake_build "$here/consumer" "$work/add_subdirectory" -DRLOCK_SOURCE_DIR="$src"
    [ ! -e "$work/add_subdirectory/rlock/tests" ] || fail "the subproject generated its tests"
    run_consumer "$work/add_subdirectory/consumer"
    run_consumer "$work/add_subdirectory/consumer_separate"
    ;;
pkg_config)
    src=$1 work=$2
    [ -f "$work/prefix/share/pkgconfig/rlock.pc" ] || fail "run the install step first"
    command -v pkg-config >/dev/null || fail "pkg-config is not installed"
    # A copy elsewhere: the .pc file must follow its tree, not name where it was installed.
    rm -rf "$work/pkg_config"
    mkdir -p "$work/pkg_config"
    cp -a "$work/prefix" "$work/pkg_config/moved-prefix"
    export PKG_CONFIG_PATH="$work/pkg_config/moved-prefix/share/pkgconfig"
    got=$(pkg-config --modversion rlock)
    want=$(source_version "$src")
    [ "$got" = "$want" ] || fail "pkg-config says rlock $got, version.hpp says $want"
    flags=$(pkg-config --cflags --libs rlock)
    say "pkg-config --cflags --libs rlock: $flags"
    case $flags in
        *"$work/pkg_config/moved-prefix/"*) ;;
        *) fail "the -I flag does not point into the moved prefix" ;;
    esac
    # shellcheck disable=SC2086
    "$cxx" -std=c++17 -o "$work/pkg_config/consumer" "$here/consumer/main.cpp" $flags
    run_consumer "$work/pkg_config/consumer"
    ;;
recipes)
    src=$1 work=$2
    [ -f "$work/prefix/share/cmake/rlock/rlockConfig.cmake" ] || fail "run the install step first"
    python3 "$here/check_recipes.py" "$src" "$(source_version "$src")" "$work/prefix"
    # Conan's CMakeDeps names the package and target as the CMake install does (rlock,
    # rlock::rlock), so the test_package builds unchanged against the installed prefix.
    rm -rf "$work/conan_test_package"
    cmake_build "$src/packaging/conan/test_package" "$work/conan_test_package" \
        -DCMAKE_PREFIX_PATH="$work/prefix"
    "$work/conan_test_package/test_package" || fail "the Conan test_package exited with $?"
    ;;
with_redis)
    program=$1
    shift
    start_redis
    "$program" "$redis_uri" "$@" || fail "$program exited with $?"
    ;;
*)
    fail "unknown mode $mode"
    ;;
esac
