// Synthetic calc transcripts for supervised pretraining data.
//
// Each transcript is a full episode as std::vector<ChatMessage>: the initial messages of the calc
// environment (prompt.h), then either
//   - with the tool: an assistant message calling calculate({"expression": ...}), the tool result
//     (the evaluator's exact output) and a final assistant message ending "Answer: <value>",
//     always correct — with the one-operation tool, one call and result per operation, each
//     using the earlier results (one_operation.h), then the final message; or
//   - without the tool (a `no_tool_fraction` of transcripts): one assistant message answering
//     directly, wrong with probability `no_tool_error_rate` (an off-by-some value, or a rounded
//     one for fractions), so RL later has something to improve: calling the tool pays.
// Transcripts are a pure function of (seed, index) and the options.
#pragma once

#include <cstdint>
#include <vector>

#include "core/chat.h"
#include "core/status.h"
#include "env/calc/prompt.h"
#include "env/calc/task.h"

namespace orrery::calc {

struct TranscriptOptions {
  Split split = Split::kTrain;
  int difficulty = 0;               // 1..4, or 0 for a uniform mix of all levels
  double no_tool_fraction = 0.25;   // in [0, 1]
  double no_tool_error_rate = 0.6;  // in [0, 1]
  CalcTool tool = CalcTool::kExpression;
};

struct CalcTranscript {
  CalcTask task;
  std::vector<ChatMessage> messages;
  bool used_tool = false;
  bool correct = false;  // ScoreCalcAnswer of the final message
};

Status ValidateTranscriptOptions(const TranscriptOptions& options);
StatusOr<CalcTranscript> MakeCalcTranscript(uint64_t seed, uint64_t index,
                                            const TranscriptOptions& options);

}  // namespace orrery::calc
