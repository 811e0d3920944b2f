// The one unit of consumer_separate that compiles rlock's runtime (RLOCK_SEPARATE_COMPILATION).
#include <rlock/src.hpp>
