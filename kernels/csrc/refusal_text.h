// Refusal and error texts for the torch bindings, built without iostreams.
//
// On the H200 image (torch 2.11.0+cu130, session 21) any number written through an std::ostream inside one of
// our JIT-built extensions ended the process with SIGSEGV, thrown or not (bench/refusal_probe.py: c10::str("x", 3)
// alone crashes; the same text through std::to_string raises ValueError; docs/kernel-notes.md section 31).
// TORCH_CHECK and c10::str format every argument through an std::ostringstream, except a single string, which
// they pass through untouched. So every TORCH_CHECK* message here is one string literal or one vc::text(...)
// (tests/test_refusal_text.py enforces it): numbers go through std::to_string, dtypes and devices through c10's
// own string functions, never through a stream. Inside ComfyUI a crash takes the whole server down.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace vc {
namespace text_detail {

inline void append(std::string& s, const char* x) { s += x ? x : "(null)"; }
inline void append(std::string& s, const std::string& x) { s += x; }
inline void append(std::string& s, bool x) { s += x ? "true" : "false"; }
template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
inline void append(std::string& s, T x) {
  s += std::to_string(x);
}
inline void append(std::string& s, c10::ScalarType t) { s += c10::toString(t); }
inline void append(std::string& s, const c10::Device& d) { s += d.str(); }  // c10's own, no stream here
inline void append(std::string& s, c10::IntArrayRef xs) {
  s += '[';
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(xs[i]);
  }
  s += ']';
}

}  // namespace text_detail

// The arguments' text, concatenated: string literals, std::string, integers, bool, c10::ScalarType, c10::Device,
// shapes (c10::IntArrayRef or std::vector<int64_t>). Anything else does not compile.
template <class... A>
std::string text(const A&... parts) {
  std::string s;
  (text_detail::append(s, parts), ...);
  return s;
}

}  // namespace vc
