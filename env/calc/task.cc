#include "env/calc/task.h"

#include <memory>

#include "core/philox.h"
#include "env/calc/expression.h"

namespace orrery::calc {
namespace {

// A random expression tree, rendered with the fewest parentheses that keep its structure.
struct Node {
  char op = 0;  // 0 for a leaf
  std::string leaf;
  std::unique_ptr<Node> left, right;
};

int Precedence(char op) { return (op == '+' || op == '-') ? 1 : (op == 0 ? 3 : 2); }

std::string Render(const Node& n) {
  if (n.op == 0) return n.leaf;
  std::string l = Render(*n.left), r = Render(*n.right);
  if (Precedence(n.left->op) < Precedence(n.op)) l = "(" + l + ")";
  // The right operand also needs parentheses at equal precedence under - and /: a - (b + c).
  const int rp = Precedence(n.right->op), p = Precedence(n.op);
  if (rp < p || (rp == p && (n.op == '-' || n.op == '/'))) r = "(" + r + ")";
  return l + " " + n.op + " " + r;
}

struct Shape {
  int operands;
  const char* ops;
  int64_t lo, hi;  // integer operand range
  int decimals;    // maximum decimal places
};

Shape ShapeOf(int difficulty) {
  switch (difficulty) {
    case 1:
      return {2, "+-", 0, 99, 0};
    case 2:
      return {3, "+-*", 0, 999, 0};
    case 3:
      return {4, "+-*/", 1, 999, 0};
    default:
      return {5, "+-*/", 1, 99, 2};
  }
}

std::string DrawOperand(PhiloxGenerator& rng, const Shape& s) {
  const int64_t whole = s.lo + static_cast<int64_t>(rng.UniformInt(s.hi - s.lo + 1));
  if (s.decimals == 0) return std::to_string(whole);
  const int places = static_cast<int>(rng.UniformInt(s.decimals + 1));
  if (places == 0) return std::to_string(whole);
  int64_t scale = 1;
  for (int i = 0; i < places; ++i) scale *= 10;
  std::string frac = std::to_string(1 + rng.UniformInt(scale - 1));
  frac.insert(frac.begin(), places - frac.size(), '0');
  return std::to_string(whole) + "." + frac;
}

// Builds a random binary tree over `operands` leaves by splitting the leaf count.
std::unique_ptr<Node> DrawTree(PhiloxGenerator& rng, const Shape& s, int operands) {
  auto node = std::make_unique<Node>();
  if (operands == 1) {
    node->leaf = DrawOperand(rng, s);
    return node;
  }
  const std::string_view ops(s.ops);
  node->op = ops[rng.UniformInt(ops.size())];
  const int left = 1 + static_cast<int>(rng.UniformInt(operands - 1));
  node->left = DrawTree(rng, s, left);
  node->right = DrawTree(rng, s, operands - left);
  return node;
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

constexpr const char* kTemplates[] = {"What is %s?", "Compute %s.", "Calculate %s.",
                                      "Evaluate %s exactly.", "What does %s equal?"};

}  // namespace

bool IsTestExpression(std::string_view expression) { return Fnv1a(expression) % 8 == 0; }

StatusOr<CalcTask> MakeCalcTask(uint64_t seed, Split split, uint64_t index, int difficulty) {
  if (difficulty < kMinDifficulty || difficulty > kMaxDifficulty) {
    return InvalidArgumentError("calc difficulty " + std::to_string(difficulty) +
                                " is outside [1, 4]");
  }
  // One Philox stream per (index, difficulty): tasks are independent of each other's draws.
  PhiloxGenerator rng(seed, (index << 3) | static_cast<uint64_t>(difficulty));
  const Shape shape = ShapeOf(difficulty);
  for (int attempt = 0; attempt < 10000; ++attempt) {
    std::unique_ptr<Node> tree = DrawTree(rng, shape, shape.operands);
    std::string expression = Render(*tree);
    if (IsTestExpression(expression) != (split == Split::kTest)) continue;
    StatusOr<Rational> value = EvaluateExpression(expression);
    if (!value.ok()) continue;  // division by zero: draw again
    CalcTask task;
    task.id = "calc/" + std::string(SplitName(split)) + "/d" + std::to_string(difficulty) + "/" +
              std::to_string(seed) + "/" + std::to_string(index);
    task.split = split;
    task.difficulty = difficulty;
    const char* tmpl = kTemplates[rng.UniformInt(std::size(kTemplates))];
    const std::string_view t(tmpl);
    const size_t at = t.find("%s");
    task.question = std::string(t.substr(0, at)) + expression + std::string(t.substr(at + 2));
    task.expression = std::move(expression);
    task.answer = *value;
    task.answer_text = value->ToString();
    return task;
  }
  return InternalError("calc task generation found no valid expression in 10000 draws");
}

}  // namespace orrery::calc
