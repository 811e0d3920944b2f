"""Conan 2 recipe for rlock, a header-only C++17 library of Redis distributed locks on hiredis.

From a checkout:  conan create packaging/conan --build=missing
The version is read from include/rlock/version.hpp, as the CMake build reads it.
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanException, ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"


class RlockConan(ConanFile):
    name = "rlock"
    description = "Redis distributed locks for C++17 (Redisson-compatible), header-only, on hiredis"
    license = "MIT"
    topics = ("redis", "distributed-lock", "redisson", "hiredis", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    no_copy_source = True

    # The recipe lives in packaging/conan/; the sources are two levels up.
    @property
    def _source_root(self):
        return os.path.join(self.recipe_folder, "..", "..")

    def set_version(self):
        header = load(self, os.path.join(self._source_root, "include", "rlock", "version.hpp"))
        parts = []
        for part in ("MAJOR", "MINOR", "PATCH"):
            m = re.search(r"^#define RLOCK_VERSION_%s (\d+)$" % part, header, re.MULTILINE)
            if not m:
                raise ConanException("RLOCK_VERSION_%s not found in version.hpp" % part)
            parts.append(m.group(1))
        self.version = ".".join(parts)

    def export_sources(self):
        copy(self, "include/*", src=self._source_root, dst=self.export_sources_folder)
        copy(self, "LICENSE", src=self._source_root, dst=self.export_sources_folder)

    def layout(self):
        basic_layout(self, src_folder=".")

    def requirements(self):
        # The headers call hiredis directly: consumers compile and link against it too.
        self.requires("hiredis/[>=1.0.0 <2]", transitive_headers=True, transitive_libs=True)

    def package_id(self):
        self.info.clear()

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 17)
        if self.settings.os == "Windows":
            raise ConanInvalidConfiguration("rlock uses POSIX poll() and pipe(); Windows is not supported")

    def package(self):
        copy(self, "LICENSE", src=self.source_folder, dst=os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", src=os.path.join(self.source_folder, "include"),
             dst=os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "rlock")
        self.cpp_info.set_property("cmake_target_name", "rlock::rlock")
        self.cpp_info.set_property("pkg_config_name", "rlock")
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
