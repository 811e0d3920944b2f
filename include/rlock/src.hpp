// Compiles rlock's own functions, once, for a program built with RLOCK_SEPARATE_COMPILATION.
//
// rlock is header-only: by default every unit that includes an rlock header compiles the
// functions it uses, the client's runtime among them (its pool, watchdog, subscriber,
// registry), which is most of the cost of a unit that takes a lock. A program that would
// rather compile that once defines RLOCK_SEPARATE_COMPILATION in every unit (with CMake:
// target_compile_definitions(app PRIVATE RLOCK_SEPARATE_COMPILATION)) and includes this header
// in exactly one of its units, first:
//
//     // rlock.cpp
//     #include <rlock/src.hpp>
//
// Every unit must agree: mixing units built with and without the macro in one program is an
// ODR violation. docs/benchmarks.md, "Compile cost", has the figures.
#pragma once

#if !defined(RLOCK_SEPARATE_COMPILATION)
#error "<rlock/src.hpp> is for programs built with RLOCK_SEPARATE_COMPILATION (rlock/config.hpp)"
#endif
#if defined(RLOCK_CONFIG_SEEN)
#error "<rlock/src.hpp> must come before any other rlock header in its unit"
#endif

#define RLOCK_COMPILING_SOURCE
#include "rlock/rlock.hpp"
