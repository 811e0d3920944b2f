// rlock's runtime, compiled once for the suite when it is built with RLOCK_SEPARATE_COMPILATION
// (tests/CMakeLists.txt, RLOCK_TEST_SEPARATE_COMPILATION).
#include "rlock/src.hpp"
