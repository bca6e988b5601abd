// A minimal unit-test runner for the C++ tests of tests/cpp (no gtest
// dependency): TEST(name) { ... } registers a case; EXPECT_* record a failure
// and go on, ASSERT_* end the case.  The binary runs every case (or those
// whose name contains argv[1]), prints one line per failure and
// "unit: N passed, M failed", and exits non-zero when anything failed.
#ifndef TF_TPU_EMB_TESTS_CPP_UNIT_H_
#define TF_TPU_EMB_TESTS_CPP_UNIT_H_

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace unit {

struct Case {
  const char* name;
  std::function<void()> fn;
};

inline std::vector<Case>& Cases() {
  static std::vector<Case> cases;
  return cases;
}

inline int& Failures() {
  static int failures = 0;
  return failures;
}

struct Register {
  Register(const char* name, std::function<void()> fn) { Cases().push_back({name, fn}); }
};

struct AssertionFailed {};

inline void Fail(const char* file, int line, const std::string& what) {
  ++Failures();
  std::fprintf(stderr, "%s:%d: FAILED %s\n", file, line, what.c_str());
}

template <typename A, typename B>
std::string Pair(const char* a_text, const char* b_text, const A& a, const B& b) {
  std::ostringstream s;
  s << a_text << " vs " << b_text << " (" << a << " vs " << b << ")";
  return s.str();
}

inline int RunAll(int argc, char** argv) {
  int passed = 0, failed = 0;
  for (const Case& c : Cases()) {
    if (argc > 1 && std::strstr(c.name, argv[1]) == nullptr) continue;
    const int before = Failures();
    try {
      c.fn();
    } catch (const AssertionFailed&) {
    } catch (const std::exception& e) {
      Fail(c.name, 0, std::string("exception: ") + e.what());
    }
    if (Failures() == before) {
      ++passed;
    } else {
      ++failed;
      std::fprintf(stderr, "case %s failed\n", c.name);
    }
  }
  std::printf("unit: %d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}

}  // namespace unit

#define UNIT_CONCAT2(a, b) a##b
#define UNIT_CONCAT(a, b) UNIT_CONCAT2(a, b)
#define TEST(name)                                                                            \
  static void UNIT_CONCAT(unit_case_, name)();                                                \
  static ::unit::Register UNIT_CONCAT(unit_reg_, name)(#name, UNIT_CONCAT(unit_case_, name)); \
  static void UNIT_CONCAT(unit_case_, name)()

#define UNIT_CHECK(cond, what, fatal)             \
  do {                                            \
    if (!(cond)) {                                \
      ::unit::Fail(__FILE__, __LINE__, what);     \
      if (fatal) throw ::unit::AssertionFailed(); \
    }                                             \
  } while (0)

#define EXPECT_TRUE(c) UNIT_CHECK((c), #c, false)
#define ASSERT_TRUE(c) UNIT_CHECK((c), #c, true)
#define EXPECT_EQ(a, b) UNIT_CHECK((a) == (b), ::unit::Pair(#a, #b, (a), (b)), false)
#define ASSERT_EQ(a, b) UNIT_CHECK((a) == (b), ::unit::Pair(#a, #b, (a), (b)), true)
#define EXPECT_NEAR(a, b, tol) \
  UNIT_CHECK(std::fabs((a) - (b)) <= (tol), ::unit::Pair(#a, #b, (a), (b)), false)
// A status-like value (ok(), message()) is OK / has the given code and
// contains `text` in its message.
#define EXPECT_OK(s) UNIT_CHECK((s).ok(), std::string(#s " : ") + std::string((s).message()), false)
#define ASSERT_OK(s) UNIT_CHECK((s).ok(), std::string(#s " : ") + std::string((s).message()), true)
#define EXPECT_ERROR(s, want_code, text)                                     \
  UNIT_CHECK((s).code() == (want_code) &&                                    \
                 std::string((s).message()).find(text) != std::string::npos, \
             std::string(#s " : ") + std::string((s).message()), false)

#endif  // TF_TPU_EMB_TESTS_CPP_UNIT_H_
