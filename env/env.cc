#include "env/env.h"

#include <nlohmann/json.hpp>

#include "core/json_text.h"

namespace orrery::env {

Deadline DeadlineIn(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double SecondsLeft(Deadline deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

std::string_view SplitName(Split split) { return split == Split::kTest ? "test" : "train"; }

StatusOr<Split> ParseSplit(std::string_view name) {
  if (name == "train") return Split::kTrain;
  if (name == "test") return Split::kTest;
  return InvalidArgumentError("unknown split '" + std::string(name) + "' (expected train or test)");
}

namespace {
nlohmann::json SpecJson(const ToolSpec& t) {
  nlohmann::json params = nlohmann::json::parse(t.parameters_json, nullptr, false);
  if (params.is_discarded()) params = nlohmann::json::object();
  return {{"type", "function"},
          {"function", {{"name", t.name}, {"description", t.description}, {"parameters", params}}}};
}
}  // namespace

std::string ToolSpec::ToJson() const { return JsonText(SpecJson(*this)); }

std::string ToolSpecsToJson(const std::vector<ToolSpec>& tools) {
  nlohmann::json arr = nlohmann::json::array();
  for (const ToolSpec& t : tools) arr.push_back(SpecJson(t));
  return JsonText(arr);
}

}  // namespace orrery::env
