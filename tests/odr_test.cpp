// Includes the umbrella header in a second translation unit: a header function that is not
// inline (or a template) is defined twice and the test binary fails to link.
#include "rlock/rlock.hpp"
#if __has_include(<asio.hpp>)
#include "rlock/asio.hpp"  // also in async_test.cpp
#endif

#include <gtest/gtest.h>

namespace {

TEST(odr, umbrella_header_links_from_two_translation_units) {
    rlock::error e(rlock::errc::not_owner, "orders", "127.0.0.1:1", "cause");
    EXPECT_EQ(e.code(), rlock::errc::not_owner);
    EXPECT_EQ(std::string(rlock::version_string),
              std::to_string(RLOCK_VERSION_MAJOR) + "." + std::to_string(RLOCK_VERSION_MINOR) +
                  "." + std::to_string(RLOCK_VERSION_PATCH));
}

}  // namespace
