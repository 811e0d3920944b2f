// A bench program's command line: `--name value` pairs and flags, read in order. A bad one ends
// the program through the program's usage(), which prints why and exits.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace bench {

/// Prints "<program>: <why>" and the usage line, and exits with status 2.
[[noreturn]] inline void usage_exit(const char* program, const char* synopsis, const char* why) {
    std::fprintf(stderr, "%s: %s\nusage: %s %s\n", program, why, program, synopsis);
    std::exit(2);
}

class arguments {
public:
    using usage_fn = void (*)(const char* why);  // exits

    arguments(int argc, char** argv, usage_fn usage) : argc_(argc), argv_(argv), usage_(usage) {}

    /// Moves to the next argument; false after the last.
    bool next() {
        if (++at_ >= argc_) return false;
        name_ = argv_[at_];
        return true;
    }
    /// The argument moved to.
    std::string_view name() const { return name_; }
    /// The value after it.
    const char* value() {
        if (at_ + 1 >= argc_) fail("missing value after " + std::string(name_));
        return argv_[++at_];
    }
    /// The value after it as a number, at least `lo`.
    double number(double lo) {
        const char* v = value();
        char* end = nullptr;
        const double d = std::strtod(v, &end);
        if (end == v || *end != '\0' || !(d >= lo)) fail("bad value for " + std::string(name_) + ": " + v);
        return d;
    }
    [[noreturn]] void unknown() { fail("unknown argument " + std::string(name_)); }

private:
    [[noreturn]] void fail(const std::string& why) {
        usage_(why.c_str());
        std::exit(2);
    }

    int argc_;
    char** argv_;
    usage_fn usage_;
    int at_ = 0;
    std::string_view name_;
};

}  // namespace bench
