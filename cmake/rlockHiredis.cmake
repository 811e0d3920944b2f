# Finds hiredis as the target hiredis::hiredis, whichever way it is installed:
#  - hiredis >= 1.0 (vcpkg, Conan, source builds) ships hiredisConfig.cmake with hiredis::hiredis;
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
            add_library(hiredis::hiredis INTERFACE IMPORTED)
            set_target_properties(hiredis::hiredis PROPERTIES
                INTERFACE_LINK_LIBRARIES PkgConfig::RLOCK_HIREDIS)
        endif()
    endif()
    if(NOT TARGET hiredis::hiredis)
        message(FATAL_ERROR
            "rlock needs hiredis: install libhiredis-dev (Debian/Ubuntu), or hiredis through "
            "vcpkg or Conan, or point CMAKE_PREFIX_PATH at a hiredis install.")
    endif()
endmacro()
