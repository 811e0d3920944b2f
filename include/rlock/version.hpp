// rlock — version of the library. CMake reads the three numbers below; keep their form.
#pragma once

#define RLOCK_VERSION_MAJOR 0
#define RLOCK_VERSION_MINOR 1
#define RLOCK_VERSION_PATCH 0

// One number for preprocessor comparisons: 10203 is 1.2.3.
#define RLOCK_VERSION (RLOCK_VERSION_MAJOR * 10000 + RLOCK_VERSION_MINOR * 100 + RLOCK_VERSION_PATCH)

namespace rlock {

/// The library version as "major.minor.patch".
inline constexpr const char* version_string = "0.1.0";

}  // namespace rlock
