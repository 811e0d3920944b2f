# Finds hiredis as the target hiredis::hiredis, whichever way it is installed:
#  - hiredis >= 1.0 (vcpkg, Conan, source builds) ships hiredis-config.cmake with hiredis::hiredis;
#  - Debian/Ubuntu's libhiredis-dev (0.14) ships only hiredis.pc, so pkg-config it is.
# Used by rlock's own build and by the installed rlockConfig.cmake.
include_guard(GLOBAL)

macro(rlock_find_hiredis)
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
                if(EXISTS "${_rlock_parent}/hiredis/hiredis.h"
                   AND NOT _rlock_parent IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES
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
    if(NOT TARGET hiredis::hiredis)
        message(FATAL_ERROR
            "rlock needs hiredis: install libhiredis-dev (Debian/Ubuntu), or hiredis through "
            "vcpkg or Conan, or point CMAKE_PREFIX_PATH at a hiredis install.")
    endif()
endmacro()
