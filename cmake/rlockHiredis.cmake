# Finds hiredis as the target hiredis::hiredis, whichever way it is installed:
#  - hiredis >= 1.0 (vcpkg, Conan, source builds) ships hiredis-config.cmake with hiredis::hiredis;
#  - Debian/Ubuntu's libhiredis-dev (0.14) ships hiredis.pc, and a HiredisConfig.cmake that
#    defines no target (and that find_package(hiredis) does not find): pkg-config it is.
# Used by rlock's own build (not found: a fatal error) and by the installed rlockConfig.cmake,
# which passes OPTIONAL and then reports rlock as not found, so that find_package(rlock QUIET)
# can fall back to something else.
include_guard(GLOBAL)

# A macro runs under the caller's policies: nothing here may need a newer one (IN_LIST needs
# CMP0057, which a consumer's cmake_minimum_required below 3.3 leaves OLD).
macro(rlock_find_hiredis)
    set(_rlock_find_hiredis_args ${ARGN})
    list(FIND _rlock_find_hiredis_args OPTIONAL _rlock_hiredis_optional)
    unset(_rlock_find_hiredis_args)
    if(NOT TARGET hiredis::hiredis)
        find_package(hiredis CONFIG QUIET)
    endif()
    if(NOT TARGET hiredis::hiredis)
        find_package(PkgConfig QUIET)
        if(PKG_CONFIG_FOUND)
            pkg_check_modules(RLOCK_HIREDIS QUIET IMPORTED_TARGET hiredis)
        endif()
        if(TARGET PkgConfig::RLOCK_HIREDIS)
            # hiredis.pc names <prefix>/include/hiredis, and rlock includes <hiredis/hiredis.h>:
            # the parent has to be on the path too (by default it is only for /usr).
            set(_rlock_hiredis_parents "")
            foreach(_rlock_dir IN LISTS RLOCK_HIREDIS_INCLUDE_DIRS)
                get_filename_component(_rlock_parent "${_rlock_dir}" DIRECTORY)
                list(FIND CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES "${_rlock_parent}" _rlock_implicit)
                if(EXISTS "${_rlock_parent}/hiredis/hiredis.h"
                   AND _rlock_implicit EQUAL -1
                   AND NOT _rlock_parent STREQUAL "/usr/include")
                    list(APPEND _rlock_hiredis_parents "${_rlock_parent}")
                endif()
            endforeach()
            add_library(hiredis::hiredis INTERFACE IMPORTED)
            set_target_properties(hiredis::hiredis PROPERTIES
                INTERFACE_LINK_LIBRARIES PkgConfig::RLOCK_HIREDIS
                INTERFACE_INCLUDE_DIRECTORIES "${_rlock_hiredis_parents}")
        endif()
    endif()
    unset(RLOCK_HIREDIS_MISSING)
    if(NOT TARGET hiredis::hiredis)
        set(RLOCK_HIREDIS_MISSING
            "rlock needs hiredis: install libhiredis-dev (Debian/Ubuntu), or hiredis through vcpkg or Conan, or point CMAKE_PREFIX_PATH at a hiredis install.")
        if(_rlock_hiredis_optional EQUAL -1)
            message(FATAL_ERROR "${RLOCK_HIREDIS_MISSING}")
        endif()
    endif()
    unset(_rlock_hiredis_optional)
endmacro()
