# rlock as a vcpkg overlay port, built from the checkout this file sits in:
#
#     vcpkg install rlock --overlay-ports=<rlock>/packaging/vcpkg/ports
#
# vcpkg's package hash covers the port files, not this checkout: after changing the sources,
# `vcpkg remove rlock` (and disable binary caching for it) before installing again.
# For a registry, replace SOURCE_PATH with vcpkg_from_github(OUT_SOURCE_PATH SOURCE_PATH
# REPO <owner>/rlock REF <commit> SHA512 <sha512 of the tarball>): no release is tagged yet.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/rlock/rlock.hpp")
    message(FATAL_ERROR "rlock sources not found at ${SOURCE_PATH}")
endif()

# Header-only: one configuration is enough, and nothing is built.
set(VCPKG_BUILD_TYPE release)

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DRLOCK_BUILD_TESTS=OFF
        -DRLOCK_BUILD_EXAMPLES=OFF
        -DRLOCK_BUILD_BENCHMARKS=OFF
        -DRLOCK_BUILD_TOOLS=OFF
        -DRLOCK_INSTALL=ON
)
vcpkg_cmake_install()
# share/cmake/rlock -> share/rlock, where vcpkg's find_package looks.
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/rlock)
vcpkg_fixup_pkgconfig()

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
