#!/usr/bin/env python3
"""Checks the vcpkg port and the Conan recipe as far as is possible without vcpkg or Conan.

    check_recipes.py <rlock source> <project version> <install prefix>

vcpkg: the manifest is valid JSON with the right name, version and dependencies; the portfile
finds the sources, passes only options the CMake project has, and fixes up the config directory
that `cmake --install` really makes; the usage file names the real target.

Conan: both conanfiles compile; the recipe is then loaded with a minimal stand-in for the
`conan` package and its methods are called: set_version() must read the project version from
version.hpp, export_sources() and package() must copy exactly the headers that `cmake --install`
installs, package_info() must name the CMake target the install exports, requirements() must
ask for hiredis with transitive headers, validate() must refuse Windows.

Prints every failed check and exits 1 if there was one.
"""
import json
import os
import py_compile
import re
import shutil
import sys
import tempfile
import types
from fnmatch import fnmatch

src, version, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
failures = []


def check(ok, what):
    print(("ok      " if ok else "FAILED  ") + what)
    if not ok:
        failures.append(what)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def files_under(root):
    out = set()
    for d, _, names in os.walk(root):
        for n in names:
            out.add(os.path.relpath(os.path.join(d, n), root))
    return out


# ---- vcpkg ----------------------------------------------------------------------------------
port = os.path.join(src, "packaging", "vcpkg", "ports", "rlock")
try:
    manifest = json.loads(read(os.path.join(port, "vcpkg.json")))
except ValueError as e:
    manifest = {}
    check(False, "vcpkg.json is valid JSON: %s" % e)
check(manifest.get("name") == "rlock", "vcpkg.json: name is rlock")
check(manifest.get("version-semver") == version,
      "vcpkg.json: version-semver %r is the project version %s"
      % (manifest.get("version-semver"), version))
deps = {}
for d in manifest.get("dependencies", []):
    if isinstance(d, str):
        deps[d] = {}
    else:
        deps[d.get("name")] = d
check("hiredis" in deps, "vcpkg.json: depends on hiredis")
for tool in ("vcpkg-cmake", "vcpkg-cmake-config"):
    check(deps.get(tool, {}).get("host") is True, "vcpkg.json: %s is a host dependency" % tool)

portfile = read(os.path.join(port, "portfile.cmake"))
check(re.search(r"vcpkg_cmake_config_fixup\(\s*CONFIG_PATH\s+share/cmake/rlock\s*\)", portfile)
      is not None, "portfile: vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/rlock)")
check(os.path.isfile(os.path.join(prefix, "share", "cmake", "rlock", "rlockConfig.cmake")),
      "cmake --install makes share/cmake/rlock/rlockConfig.cmake, which the fixup moves")
check(os.path.isfile(os.path.join(prefix, "share", "pkgconfig", "rlock.pc")),
      "cmake --install makes share/pkgconfig/rlock.pc, which vcpkg_fixup_pkgconfig handles")
m = re.search(r'get_filename_component\(SOURCE_PATH "\$\{CMAKE_CURRENT_LIST_DIR\}/([./]+)" ABSOLUTE\)',
              portfile)
check(m is not None and os.path.isfile(
    os.path.join(os.path.normpath(os.path.join(port, m.group(1))), "include", "rlock", "rlock.hpp")),
    "portfile: SOURCE_PATH is this checkout")
root_cmake = read(os.path.join(src, "CMakeLists.txt"))
declared = set(re.findall(r"^option\((RLOCK_\w+)", root_cmake, re.MULTILINE))
passed = set(re.findall(r"-D(RLOCK_\w+)=", portfile))
check(passed and passed <= declared,
      "portfile: passes only options the project declares (%s)" % ", ".join(sorted(passed)))
for off in ("RLOCK_BUILD_TESTS", "RLOCK_BUILD_EXAMPLES", "RLOCK_BUILD_BENCHMARKS", "RLOCK_BUILD_TOOLS"):
    check("-D%s=OFF" % off in portfile, "portfile: %s=OFF" % off)
usage = read(os.path.join(port, "usage"))
check("find_package(rlock CONFIG REQUIRED)" in usage and "rlock::rlock" in usage,
      "usage: find_package(rlock CONFIG REQUIRED) and rlock::rlock")

# ---- Conan ----------------------------------------------------------------------------------
conan_dir = os.path.join(src, "packaging", "conan")
recipe = os.path.join(conan_dir, "conanfile.py")
for f in (recipe, os.path.join(conan_dir, "test_package", "conanfile.py")):
    try:
        py_compile.compile(f, doraise=True, cfile=os.path.join(tempfile.gettempdir(), "rlock_pyc"))
        check(True, "compiles: %s" % os.path.relpath(f, src))
    except py_compile.PyCompileError as e:
        check(False, "compiles: %s: %s" % (os.path.relpath(f, src), e))


class ConanException(Exception):
    pass


class ConanInvalidConfiguration(ConanException):
    pass


def stub_copy(conanfile, pattern, src, dst, **_):
    """conan.tools.files.copy: pattern relative to src, keeps relative paths."""
    copied = []
    for rel in sorted(files_under(src)):
        if fnmatch(rel, pattern):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy2(os.path.join(src, rel), os.path.join(dst, rel))
            copied.append(rel)
    return copied


class ConanFile:
    pass


modules = {
    "conan": {"ConanFile": ConanFile},
    "conan.errors": {"ConanException": ConanException,
                     "ConanInvalidConfiguration": ConanInvalidConfiguration},
    "conan.tools": {},
    "conan.tools.build": {"check_min_cppstd": lambda conanfile, v: None,
                          "can_run": lambda conanfile: True},
    "conan.tools.files": {"copy": stub_copy, "load": lambda conanfile, p: read(p)},
    "conan.tools.layout": {"basic_layout": lambda conanfile, src_folder=".": None},
    "conan.tools.cmake": {"CMake": object, "cmake_layout": lambda conanfile: None},
}
for name, attrs in modules.items():
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod

namespace = {"__file__": recipe, "__name__": "rlock_conanfile"}
exec(compile(read(recipe), recipe, "exec"), namespace)
recipe_class = next(v for v in namespace.values()
                    if isinstance(v, type) and issubclass(v, ConanFile) and v is not ConanFile)
check(recipe_class.name == "rlock", "conanfile: name is rlock")
check(recipe_class.package_type == "header-library", "conanfile: package_type header-library")


class Settings(dict):
    def __getattr__(self, k):
        return self.get(k)

    def get_safe(self, k):
        return self.get(k)


class CppInfo:
    def __init__(self):
        self.properties = {}

    def set_property(self, k, v):
        self.properties[k] = v


with tempfile.TemporaryDirectory() as tmp:
    r = recipe_class()
    r.recipe_folder = conan_dir
    r.set_version()
    check(r.version == version,
          "conanfile: set_version() reads %s from version.hpp (got %s)" % (version, r.version))

    r.export_sources_folder = os.path.join(tmp, "export")
    r.export_sources()
    r.source_folder = r.export_sources_folder
    r.package_folder = os.path.join(tmp, "package")
    r.settings = Settings(os="Linux")
    r.package()
    packaged = files_under(os.path.join(r.package_folder, "include"))
    installed = files_under(os.path.join(prefix, "include"))
    check(packaged == installed and packaged,
          "conanfile: package() has the headers cmake --install installs (%d files; missing %s, "
          "extra %s)" % (len(packaged), sorted(installed - packaged), sorted(packaged - installed)))
    check(os.path.isfile(os.path.join(r.package_folder, "licenses", "LICENSE")),
          "conanfile: package() has licenses/LICENSE")

    requested = []
    r.requires = lambda ref, **traits: requested.append((ref, traits))
    r.requirements()
    check(any(ref.startswith("hiredis/") and traits.get("transitive_headers")
              for ref, traits in requested),
          "conanfile: requires hiredis with transitive_headers (%s)" % requested)

    r.cpp_info = CppInfo()
    r.package_info()
    targets = read(os.path.join(prefix, "share", "cmake", "rlock", "rlockTargets.cmake"))
    exported = re.findall(r"add_library\((\S+) INTERFACE IMPORTED\)", targets)
    check(r.cpp_info.properties.get("cmake_target_name") in exported,
          "conanfile: cmake_target_name %r is what the CMake install exports %s"
          % (r.cpp_info.properties.get("cmake_target_name"), exported))
    check(r.cpp_info.properties.get("cmake_file_name") == "rlock", "conanfile: cmake_file_name")
    check(r.cpp_info.properties.get("pkg_config_name") == "rlock", "conanfile: pkg_config_name")
    check(r.cpp_info.libdirs == [] and r.cpp_info.bindirs == [], "conanfile: no lib or bin dirs")

    r.settings = Settings(os="Windows")
    try:
        r.validate()
        check(False, "conanfile: validate() refuses Windows")
    except ConanInvalidConfiguration:
        check(True, "conanfile: validate() refuses Windows")
    r.settings = Settings(os="Linux")
    r.validate()

if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all recipe checks passed")
