#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/chat.h"
#include "core/json_text.h"
#include "env/calc/answer.h"
#include "env/calc/expression.h"
#include "env/calc/one_operation.h"
#include "env/calc/rational.h"
#include "env/calc/task.h"
#include "env/calc/transcripts.h"

namespace orrery::calc {
namespace {

std::string Eval(std::string_view e) {
  StatusOr<Rational> r = EvaluateExpression(e);
  return r.ok() ? r->ToString() : "error: " + r.status().message();
}

TEST(RationalTest, CanonicalText) {
  EXPECT_EQ(Rational::Make(84, 2)->ToString(), "42");
  EXPECT_EQ(Rational::Make(13, 4)->ToString(), "3.25");
  EXPECT_EQ(Rational::Make(-1, 8)->ToString(), "-0.125");
  EXPECT_EQ(Rational::Make(7, 3)->ToString(), "7/3");
  EXPECT_EQ(Rational::Make(1, -6)->ToString(), "-1/6");
  EXPECT_EQ(Rational::Make(0, 5)->ToString(), "0");
  EXPECT_EQ(Rational::Make(1, 1024)->ToString(), "0.0009765625");
  // 2^-60 needs 60 decimals: shown as a fraction rather than overflowing.
  EXPECT_EQ(Rational::Make(1, int64_t{1} << 60)->ToString(), "1/1152921504606846976");
  EXPECT_FALSE(Rational::Make(1, 0).ok());
}

TEST(RationalTest, OverflowIsAnErrorNotAWrap) {
  Rational big(INT64_MAX);
  StatusOr<Rational> r = big.Add(Rational(1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(big.Mul(Rational(2)).ok());
  EXPECT_TRUE(big.Sub(Rational(1)).ok());
}

TEST(RationalTest, ParseLiteral) {
  EXPECT_EQ(ParseRationalLiteral("3.250")->ToString(), "3.25");
  EXPECT_EQ(ParseRationalLiteral(" -13/4 ")->ToString(), "-3.25");
  EXPECT_EQ(ParseRationalLiteral("1,234.5")->ToString(), "1234.5");
  EXPECT_EQ(ParseRationalLiteral(".5")->ToString(), "0.5");
  EXPECT_FALSE(ParseRationalLiteral("").ok());
  EXPECT_FALSE(ParseRationalLiteral("1/0").ok());
  EXPECT_FALSE(ParseRationalLiteral("1.5/2").ok());
  EXPECT_FALSE(ParseRationalLiteral("12abc").ok());
  EXPECT_FALSE(ParseRationalLiteral("1+1").ok());
  EXPECT_FALSE(ParseRationalLiteral("1234567890123456789").ok());
}

TEST(ExpressionTest, PrecedenceAndAssociativity) {
  EXPECT_EQ(Eval("1 + 2 * 3"), "7");
  EXPECT_EQ(Eval("(1 + 2) * 3"), "9");
  EXPECT_EQ(Eval("10 - 4 - 3"), "3");  // left-associative
  EXPECT_EQ(Eval("100 / 10 / 5"), "2");
  EXPECT_EQ(Eval("2 - -3"), "5");
  EXPECT_EQ(Eval("-(2 + 3) * 2"), "-10");
  EXPECT_EQ(Eval("1 / 3 + 1 / 6"), "0.5");
  EXPECT_EQ(Eval("1 / 3"), "1/3");
  EXPECT_EQ(Eval("0.1 + 0.2"), "0.3");  // exact, unlike binary floating point
  EXPECT_EQ(Eval("12 \xC3\x97 (3 + 4) \xC3\xB7 5 \xE2\x88\x92 1"), "15.8");
  EXPECT_EQ(Eval("  7  "), "7");
}

TEST(ExpressionTest, ErrorsAreOneReadableLine) {
  EXPECT_EQ(Eval("1 / 0"), "error: division by zero");
  EXPECT_EQ(Eval("1 / (2 - 2)"), "error: division by zero");
  EXPECT_EQ(Eval("2 +"), "error: unexpected end of expression");
  EXPECT_EQ(Eval("(1 + 2"), "error: missing ')'");
  EXPECT_EQ(Eval("1 + x"),
            "error: unexpected 'x' at position 5 (allowed: numbers, + - * / and parentheses)");
  EXPECT_NE(Eval("__import__('os').system('id')").find("error: unexpected '_'"), std::string::npos);
  EXPECT_NE(Eval("2 ** 3").find("error"), std::string::npos);
  EXPECT_NE(Eval("1e5").find("error"), std::string::npos);
  EXPECT_NE(Eval("").find("error"), std::string::npos);
  EXPECT_NE(Eval("99999999999 * 99999999999").find("too large"), std::string::npos);
}

TEST(ExpressionTest, InputIsBounded) {
  std::string deep(kMaxNestingDepth + 1, '(');
  deep += "1" + std::string(kMaxNestingDepth + 1, ')');
  EXPECT_NE(Eval(deep).find("nested deeper"), std::string::npos);
  std::string ok_depth(kMaxNestingDepth - 1, '(');
  ok_depth += "1" + std::string(kMaxNestingDepth - 1, ')');
  EXPECT_EQ(Eval(ok_depth), "1");
  std::string minus(kMaxNestingDepth + 1, '-');
  EXPECT_NE(Eval(minus + "1").find("nested deeper"), std::string::npos);
  std::string long_sum = "1";
  while (long_sum.size() <= kMaxExpressionBytes) long_sum += "+1";
  EXPECT_NE(Eval(long_sum).find("longer than"), std::string::npos);
}

// Independent oracle: a double-precision evaluation of the same expression through a different
// route (a shunting-yard over doubles) must agree with the exact value to rounding error.
double DoubleEval(const std::string& e) {
  std::vector<double> vals;
  std::vector<char> ops;
  auto prec = [](char op) { return op == '+' || op == '-' ? 1 : 2; };
  auto apply = [&]() {
    double b = vals.back();
    vals.pop_back();
    double a = vals.back();
    vals.pop_back();
    char op = ops.back();
    ops.pop_back();
    vals.push_back(op == '+' ? a + b : op == '-' ? a - b : op == '*' ? a * b : a / b);
  };
  for (size_t i = 0; i < e.size();) {
    char c = e[i];
    if (c == ' ') {
      ++i;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t used;
      vals.push_back(std::stod(e.substr(i), &used));
      i += used;
    } else if (c == '(') {
      ops.push_back(c), ++i;
    } else if (c == ')') {
      while (ops.back() != '(') apply();
      ops.pop_back(), ++i;
    } else {
      while (!ops.empty() && ops.back() != '(' && prec(ops.back()) >= prec(c)) apply();
      ops.push_back(c), ++i;
    }
  }
  while (!ops.empty()) apply();
  return vals.back();
}

TEST(CalcTaskTest, DeterministicValidAndMatchesDoubleOracle) {
  for (int d = kMinDifficulty; d <= kMaxDifficulty; ++d) {
    for (uint64_t i = 0; i < 200; ++i) {
      StatusOr<CalcTask> a = MakeCalcTask(7, Split::kTrain, i, d);
      StatusOr<CalcTask> b = MakeCalcTask(7, Split::kTrain, i, d);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      EXPECT_EQ(a->expression, b->expression);
      EXPECT_EQ(a->question, b->question);
      EXPECT_NE(a->question.find(a->expression), std::string::npos);
      const double exact = static_cast<double>(a->answer.num()) / a->answer.den();
      const double approx = DoubleEval(a->expression);
      EXPECT_NEAR(exact, approx, 1e-9 * std::max(1.0, std::fabs(exact))) << a->expression;
      EXPECT_EQ(a->answer_text, a->answer.ToString());
    }
  }
  EXPECT_FALSE(MakeCalcTask(1, Split::kTrain, 0, 0).ok());
  EXPECT_FALSE(MakeCalcTask(1, Split::kTrain, 0, 5).ok());
}

TEST(CalcTaskTest, SplitsAreDisjoint) {
  std::set<std::string> train, test;
  for (uint64_t i = 0; i < 500; ++i) {
    train.insert(MakeCalcTask(1, Split::kTrain, i, 1)->expression);
    test.insert(MakeCalcTask(1, Split::kTest, i, 1)->expression);
  }
  for (const std::string& e : test) {
    EXPECT_TRUE(IsTestExpression(e));
    EXPECT_EQ(train.count(e), 0u) << e;
  }
  EXPECT_GT(train.size(), 300u);  // difficulty 1 has 2*100*100 questions: few repeats
}

TEST(CalcAnswerTest, RewardContract) {
  const Rational expected = *Rational::Make(13, 4);
  EXPECT_EQ(ScoreCalcAnswer("So it is 3.25.\nAnswer: 3.25", expected), 1.0);
  EXPECT_EQ(ScoreCalcAnswer("answer: 13/4.", expected), 1.0);
  EXPECT_EQ(ScoreCalcAnswer("Answer: 3.250", expected), 1.0);
  EXPECT_EQ(ScoreCalcAnswer("Answer: 3.3", expected), 0.0);
  EXPECT_EQ(ScoreCalcAnswer("The answer is 3.25", expected), 0.0);       // no answer line
  EXPECT_EQ(ScoreCalcAnswer("Answer: 3\nAnswer: 3.25", expected), 1.0);  // the last line counts
  EXPECT_EQ(ScoreCalcAnswer("Answer: 13/4 + 0", expected), 0.0);
  EXPECT_EQ(FormatAnswerLine(expected), "Answer: 3.25");
}

TEST(CalcTranscriptTest, ToolTranscriptsAreCorrectAndWellFormed) {
  TranscriptOptions o;
  o.no_tool_fraction = 0.3;
  o.no_tool_error_rate = 0.6;
  int tool = 0, no_tool = 0, no_tool_wrong = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    StatusOr<CalcTranscript> t = MakeCalcTranscript(3, i, o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const auto& m = t->messages;
    ASSERT_GE(m.size(), 3u);
    EXPECT_EQ(m[0].role, ChatRole::kSystem);
    EXPECT_EQ(m[1].role, ChatRole::kUser);
    EXPECT_EQ(m.back().role, ChatRole::kAssistant);
    EXPECT_EQ(t->correct, ScoreCalcAnswer(m.back().content, t->task.answer) == 1.0);
    if (t->used_tool) {
      ++tool;
      ASSERT_EQ(m.size(), 5u);
      ASSERT_EQ(m[2].tool_calls.size(), 1u);
      EXPECT_EQ(m[2].tool_calls[0].name, "calculate");
      EXPECT_EQ(m[3].role, ChatRole::kTool);
      EXPECT_EQ(m[3].tool_call_id, m[2].tool_calls[0].id);
      EXPECT_EQ(m[3].content, t->task.answer_text);
      EXPECT_TRUE(t->correct);
      // The JSON round trip keeps the arguments an object with the expression.
      StatusOr<std::vector<ChatMessage>> back = ChatMessagesFromJson(ChatMessagesToJson(m));
      ASSERT_TRUE(back.ok());
      EXPECT_EQ((*back)[2].tool_calls[0].arguments_json,
                "{\"expression\":\"" + t->task.expression + "\"}");
    } else {
      ++no_tool;
      EXPECT_EQ(m.size(), 3u);
      no_tool_wrong += !t->correct;
    }
  }
  // 1000 draws at p = 0.3: 300 +- 14.5 (sd); 6 sd bounds keep this test deterministic in practice
  // (and it is deterministic anyway: fixed seed).
  EXPECT_NEAR(no_tool, 300, 90);
  EXPECT_NEAR(static_cast<double>(no_tool_wrong) / no_tool, 0.6, 0.12);
  EXPECT_EQ(tool + no_tool, 1000);
}

TEST(OneOperationTest, EvaluatesExactlyOneOperation) {
  EXPECT_EQ(EvaluateOneOperation("12/7 * 3")->ToString(), "36/7");
  EXPECT_EQ(EvaluateOneOperation(" -7 - 3 ")->ToString(), "-10");
  EXPECT_EQ(EvaluateOneOperation("1.5 + 2")->ToString(), "3.5");
  EXPECT_EQ(EvaluateOneOperation("7 \u00f7 2")->ToString(), "3.5");
  for (const char* bad : {"1 + 2 + 3", "1+2", "12", "(1 + 2)", "a * 2", "1 ^ 2", ""}) {
    StatusOr<Rational> r = EvaluateOneOperation(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("one operation at a time"), std::string::npos) << bad;
  }
  EXPECT_NE(EvaluateOneOperation("1 / 0").status().message().find("division by zero"),
            std::string::npos);
}

// Every task, replayed one operation at a time through the one-operation tool, reaches its
// answer in operands - 1 calls, each call's argument being what the tool accepts.
TEST(OneOperationTest, StepsOfEveryDifficultyReachTheAnswer) {
  for (int d = kMinDifficulty; d <= kMaxDifficulty; ++d) {
    for (uint64_t i = 0; i < 200; ++i) {
      const CalcTask task = *MakeCalcTask(9, Split::kTrain, i, d);
      StatusOr<std::vector<OperationStep>> steps = OneOperationSteps(task.expression);
      ASSERT_TRUE(steps.ok()) << task.expression << ": " << steps.status().ToString();
      ASSERT_EQ(steps->size(), static_cast<size_t>(d)) << task.expression;  // d + 1 operands
      for (const OperationStep& step : *steps) {
        StatusOr<Rational> v = EvaluateOneOperation(step.text);
        ASSERT_TRUE(v.ok()) << step.text << ": " << v.status().ToString();
        EXPECT_EQ(*v, step.value) << step.text;
      }
      EXPECT_EQ(steps->back().value, task.answer) << task.expression;
    }
  }
}

TEST(CalcTranscriptTest, OneOperationTranscriptsCallOncePerOperation) {
  TranscriptOptions o;
  o.tool = CalcTool::kOneOperation;
  o.difficulty = 2;  // three operands: two calls
  o.no_tool_fraction = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    StatusOr<CalcTranscript> t = MakeCalcTranscript(4, i, o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const auto& m = t->messages;
    ASSERT_EQ(m.size(), 7u);  // system, user, (call, result) x 2, answer
    EXPECT_NE(m[0].content.find("one arithmetic operation"), std::string::npos);
    for (int c = 0; c < 2; ++c) {
      const ChatMessage& call = m[2 + 2 * c];
      const ChatMessage& result = m[3 + 2 * c];
      ASSERT_EQ(call.tool_calls.size(), 1u);
      EXPECT_EQ(result.tool_call_id, call.tool_calls[0].id);
      const std::string arg = ParseUntrustedJson(call.tool_calls[0].arguments_json)["expression"];
      EXPECT_EQ(EvaluateOneOperation(arg)->ToString(), result.content) << arg;
    }
    // The second call uses the first call's result.
    const std::string second =
        ParseUntrustedJson(m[4].tool_calls[0].arguments_json)["expression"].get<std::string>();
    EXPECT_NE(second.find(m[3].content), std::string::npos) << second;
    EXPECT_TRUE(t->correct);
    EXPECT_EQ(m[5].content, t->task.answer_text);
  }
}

TEST(CalcTranscriptTest, OptionsAreValidated) {
  TranscriptOptions o;
  o.no_tool_fraction = 1.5;
  EXPECT_FALSE(MakeCalcTranscript(0, 0, o).ok());
  o = TranscriptOptions{};
  o.difficulty = 9;
  EXPECT_FALSE(MakeCalcTranscript(0, 0, o).ok());
  o = TranscriptOptions{};
  o.no_tool_fraction = 0;
  for (uint64_t i = 0; i < 50; ++i) EXPECT_TRUE(MakeCalcTranscript(0, i, o)->used_tool);
}

}  // namespace
}  // namespace orrery::calc
