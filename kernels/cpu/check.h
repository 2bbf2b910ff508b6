// How the CPU kernels refuse bad input: PAGODA_CHECK(condition, printf format,
// args...) raises a Python RuntimeError carrying the formatted message.
//
// Not TORCH_CHECK: its message is built by c10::str, a std::ostringstream
// compiled into this extension, and on the H100 test machine (Ubuntu 24.04,
// its GCC 13.3, torch 2.11.0+cu130) any extension that builds a string that
// way and throws dies with SIGSEGV instead of raising, so a refused input
// killed the engine. There, throwing std::runtime_error built from a plain C
// string raised, and so did torch's own checks. The likely cause: torch's
// libc10 exports its own copies of ostringstream members (from the
// devtoolset's static part of libstdc++), which the extension binds to
// beside the system's libstdc++. So the message is formatted into a buffer
// with vsnprintf and thrown as a C string; no iostream is involved.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <stdexcept>

namespace pagoda_cpu {

[[noreturn]] inline void fail(const char* format, ...) __attribute__((format(printf, 1, 2)));

inline void fail(const char* format, ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof message, format, args);
  va_end(args);
  throw std::runtime_error(message);
}

}  // namespace pagoda_cpu

#define PAGODA_CHECK(condition, ...)          \
  do {                                        \
    if (__builtin_expect(!(condition), 0)) {  \
      ::pagoda_cpu::fail(__VA_ARGS__);        \
    }                                         \
  } while (false)
