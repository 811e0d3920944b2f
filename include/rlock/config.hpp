// How rlock's own functions are compiled.
//
// By default rlock is header-only: every function is defined in its header, inline, and
// compiled in each unit that uses it. A program that defines RLOCK_SEPARATE_COMPILATION in every
// unit gets the client's runtime (its pool, watchdog, subscriber, registry, the scripts'
// plumbing) declared only, and compiled once, in the one unit that includes <rlock/src.hpp>: a
// unit that takes a lock then compiles little more than the lock's own templates
// (docs/benchmarks.md, "Compile cost"). Every unit of a program must agree.
//
// What the headers use: RLOCK_DECL on each function defined out of its class (`inline`, or
// nothing with RLOCK_SEPARATE_COMPILATION), and RLOCK_DEFINE_RUNTIME around those definitions
// (1 where they are compiled). A virtual function defined out of its class is declared
// RLOCK_DECL in the class too: declared inline there, it is not its class's key function, so a
// header-only unit emits the class's vtable (and with it every virtual function) only where the
// class is used, not in every unit that includes the header. Includes nothing.
#pragma once

#define RLOCK_CONFIG_SEEN

#if defined(RLOCK_SEPARATE_COMPILATION)
#define RLOCK_DECL
#if defined(RLOCK_COMPILING_SOURCE)
#define RLOCK_DEFINE_RUNTIME 1
#else
#define RLOCK_DEFINE_RUNTIME 0
#endif
#else
#define RLOCK_DECL inline
#define RLOCK_DEFINE_RUNTIME 1
#endif
