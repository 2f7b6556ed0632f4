// Minimal extension for bench/refusal_probe.py: which way of raising from a torch binding ends the process
// (docs/kernel-notes.md section 30: integer-formatted refusals of two of our bindings died with SIGSEGV on the H200).
#include <torch/extension.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace {
void value_plain(int64_t) { TORCH_CHECK_VALUE(false, "plain sentence."); }
void value_int(int64_t x) { TORCH_CHECK_VALUE(false, "integer ", x, "."); }
void check_int(int64_t x) { TORCH_CHECK(false, "integer ", x, "."); }
void value_string(int64_t x) { TORCH_CHECK_VALUE(false, "string ", std::to_string(x), "."); }
std::string ostream_int(int64_t x) {
  std::ostringstream os;
  os << "integer " << x;
  return os.str();
}
std::string c10_str_int(int64_t x) { return c10::str("integer ", x); }
void std_throw(int64_t x) { throw std::invalid_argument("integer " + std::to_string(x)); }
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("value_plain", &value_plain);
  m.def("value_int", &value_int);
  m.def("check_int", &check_int);
  m.def("value_string", &value_string);
  m.def("ostream_int", &ostream_int);
  m.def("c10_str_int", &c10_str_int);
  m.def("std_throw", &std_throw);
}
