#include "env/python/problems.h"

#include <nlohmann/json.hpp>

#include "core/philox.h"

namespace orrery::env {
namespace {

using nlohmann::json;

struct Family {
  const char* name;
  const char* function;
  // Builds statement, tests and reference from the generator.
  void (*make)(PhiloxGenerator& rng, CodingTask* task, std::string* reference);
};

int64_t Draw(PhiloxGenerator& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(hi - lo + 1)));
}

std::string DrawWord(PhiloxGenerator& rng, int min_len, int max_len) {
  static const char* kLetters = "abcdeioustrnlm";
  std::string s;
  const int len = static_cast<int>(Draw(rng, min_len, max_len));
  for (int i = 0; i < len; ++i) s += kLetters[rng.UniformInt(14)];
  return s;
}

void SumOfMultiples(PhiloxGenerator& rng, CodingTask* t, std::string* ref) {
  const int64_t a = Draw(rng, 2, 9), b = Draw(rng, 2, 9);
  t->statement =
      "Write a Python function sum_of_multiples(n) that returns the sum of all "
      "non-negative integers below n that are divisible by " +
      std::to_string(a) + " or by " + std::to_string(b) + ".";
  json tests = json::array();
  for (int i = 0; i < 6; ++i) {
    const int64_t n = i == 0 ? 0 : Draw(rng, 1, 2000);
    int64_t s = 0;
    for (int64_t k = 0; k < n; ++k) s += (k % a == 0 || k % b == 0) ? k : 0;
    tests.push_back({json::array({n}), s});
  }
  t->tests_json = tests.dump();
  *ref = "def sum_of_multiples(n):\n    return sum(k for k in range(n) if k % " +
         std::to_string(a) + " == 0 or k % " + std::to_string(b) + " == 0)\n";
}

void CountChar(PhiloxGenerator& rng, CodingTask* t, std::string* ref) {
  const std::string vowels = "aeiou";
  const char c = vowels[rng.UniformInt(5)];
  t->statement = std::string(
                     "Write a Python function count_char(s) that returns how many times "
                     "the letter '") +
                 c + "' occurs in the string s, ignoring case.";
  json tests = json::array();
  for (int i = 0; i < 6; ++i) {
    std::string s = DrawWord(rng, 0, 30);
    if (i % 2 == 1 && !s.empty()) s[0] = static_cast<char>(std::toupper(s[0]));
    int64_t n = 0;
    for (char ch : s) n += std::tolower(ch) == c;
    tests.push_back({json::array({s}), n});
  }
  t->tests_json = tests.dump();
  *ref = std::string("def count_char(s):\n    return s.lower().count('") + c + "')\n";
}

void Fibonacci(PhiloxGenerator& rng, CodingTask* t, std::string* ref) {
  const int64_t f0 = Draw(rng, 0, 3), f1 = Draw(rng, 1, 4);
  t->statement =
      "Write a Python function seq(n) for the sequence with seq(0) = " + std::to_string(f0) +
      ", seq(1) = " + std::to_string(f1) +
      " and seq(n) = seq(n-1) + seq(n-2); n is between 0 and 80.";
  json tests = json::array();
  for (int i = 0; i < 6; ++i) {
    const int64_t n = i == 0 ? 0 : Draw(rng, 1, 80);
    uint64_t a = static_cast<uint64_t>(f0), b = static_cast<uint64_t>(f1);
    for (int64_t k = 0; k < n; ++k) {
      const uint64_t c = a + b;
      a = b;
      b = c;
    }
    tests.push_back({json::array({n}), a});
  }
  t->tests_json = tests.dump();
  *ref = "def seq(n):\n    a, b = " + std::to_string(f0) + ", " + std::to_string(f1) +
         "\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n";
}

void Rotate(PhiloxGenerator& rng, CodingTask* t, std::string* ref) {
  const int64_t k = Draw(rng, 1, 5);
  t->statement = "Write a Python function rotate(xs) that returns a new list: xs rotated left by " +
                 std::to_string(k) + " positions (wrapping around; an empty list stays empty).";
  json tests = json::array();
  for (int i = 0; i < 6; ++i) {
    const int64_t n = i == 0 ? 0 : Draw(rng, 1, 12);
    json xs = json::array(), out = json::array();
    std::vector<int64_t> v;
    for (int64_t j = 0; j < n; ++j) v.push_back(Draw(rng, -50, 50));
    for (int64_t j = 0; j < n; ++j) xs.push_back(v[j]);
    for (int64_t j = 0; j < n; ++j) out.push_back(v[(j + k) % n]);
    tests.push_back({json::array({xs}), out});
  }
  t->tests_json = tests.dump();
  *ref = "def rotate(xs):\n    if not xs:\n        return []\n    k = " + std::to_string(k) +
         " % len(xs)\n    return xs[k:] + xs[:k]\n";
}

constexpr Family kFamilies[] = {
    {"sum_of_multiples", "sum_of_multiples", SumOfMultiples},
    {"count_char", "count_char", CountChar},
    {"seq", "seq", Fibonacci},
    {"rotate", "rotate", Rotate},
};

StatusOr<std::pair<CodingTask, std::string>> Make(uint64_t seed, Split split, uint64_t index) {
  const Family& f = kFamilies[index % std::size(kFamilies)];
  PhiloxGenerator rng(seed, (index << 1) | (split == Split::kTest ? 1 : 0));
  CodingTask t;
  t.id = "python/" + std::string(SplitName(split)) + "/" + f.name + "/" + std::to_string(seed) +
         "/" + std::to_string(index);
  t.function = f.function;
  std::string reference;
  f.make(rng, &t, &reference);
  t.statement +=
      " Use the run_python tool to test your code. When done, reply with the complete "
      "solution in one ```python code block (the last such block is graded against "
      "hidden tests).";
  t.num_tests = static_cast<int>(json::parse(t.tests_json).size());
  return std::make_pair(std::move(t), std::move(reference));
}

}  // namespace

int NumCodingFamilies() { return static_cast<int>(std::size(kFamilies)); }

StatusOr<CodingTask> MakeCodingTask(uint64_t seed, Split split, uint64_t index) {
  ORRERY_ASSIGN_OR_RETURN(auto made, Make(seed, split, index));
  return std::move(made.first);
}

std::string ReferenceSolution(const CodingTask& task) {
  // The id ends with /<seed>/<index> and names the split: rebuild from them.
  const size_t last = task.id.rfind('/');
  const size_t prev = task.id.rfind('/', last - 1);
  const uint64_t seed = std::stoull(task.id.substr(prev + 1, last - prev - 1));
  const uint64_t index = std::stoull(task.id.substr(last + 1));
  const Split split = task.id.rfind("python/test/", 0) == 0 ? Split::kTest : Split::kTrain;
  StatusOr<std::pair<CodingTask, std::string>> made = Make(seed, split, index);
  return made.ok() ? made->second : "";
}

}  // namespace orrery::env
