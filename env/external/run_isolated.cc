#include "env/external/run_isolated.h"

#include <nlohmann/json.hpp>

#include "core/json_text.h"

namespace orrery::env {

using nlohmann::json;

StatusOr<RunIsolatedRequest> ReadRunIsolatedParams(const std::string& params_json,
                                                   double max_seconds) {
  const json p = ParseUntrustedJson(params_json);
  if (p.is_discarded() || !p.is_object()) {
    return InvalidArgumentError("run_isolated: params must be a JSON object");
  }
  RunIsolatedRequest r;
  if (p.contains("files")) {
    const json& files = p["files"];
    if (!files.is_object()) {
      return InvalidArgumentError("run_isolated: 'files' must be an object of path -> contents");
    }
    if (files.size() > kRunIsolatedMaxFiles) {
      return InvalidArgumentError("run_isolated: at most " + std::to_string(kRunIsolatedMaxFiles) +
                                  " files, got " + std::to_string(files.size()));
    }
    for (auto it = files.begin(); it != files.end(); ++it) {
      if (!it.value().is_string()) {
        return InvalidArgumentError("run_isolated: files['" + it.key() + "'] must be a string");
      }
      r.program.files.emplace_back(it.key(), it.value().get<std::string>());
    }
  }
  if (!p.contains("argv") || !p["argv"].is_array() || p["argv"].empty()) {
    return InvalidArgumentError("run_isolated: 'argv' must be a non-empty array of strings");
  }
  for (const json& a : p["argv"]) {
    if (!a.is_string()) return InvalidArgumentError("run_isolated: 'argv' must hold strings only");
    r.program.argv.push_back(a.get<std::string>());
  }
  if (p.contains("inputs")) {
    const json& inputs = p["inputs"];
    if (!inputs.is_array()) {
      return InvalidArgumentError("run_isolated: 'inputs' must be an array of strings");
    }
    if (inputs.size() > kRunIsolatedMaxInputs) {
      return InvalidArgumentError("run_isolated: at most " + std::to_string(kRunIsolatedMaxInputs) +
                                  " inputs, got " + std::to_string(inputs.size()));
    }
    for (const json& in : inputs) {
      if (!in.is_string()) {
        return InvalidArgumentError("run_isolated: 'inputs' must hold strings only");
      }
      r.inputs.push_back(in.get<std::string>());
    }
  } else {
    r.inputs = {""};
  }
  r.program.seconds_each = std::min(5.0, max_seconds);
  if (p.contains("seconds_each")) {
    const json& s = p["seconds_each"];
    if (!s.is_number() || !(s.get<double>() > 0)) {
      return InvalidArgumentError("run_isolated: 'seconds_each' must be a positive number");
    }
    r.program.seconds_each = std::min(s.get<double>(), max_seconds);
  }
  return r;
}

std::string RunIsolatedResultJson(const std::vector<RunResult>& runs) {
  json out = json::array();
  for (const RunResult& r : runs) {
    out.push_back({{"exit_code", r.exit_code},
                   {"signal", r.signal},
                   {"timed_out", r.timed_out},
                   {"limit_exceeded", r.limit_exceeded},
                   {"output_truncated", r.output_truncated},
                   {"stdout", r.stdout_text},
                   {"stderr", r.stderr_text},
                   {"wall_seconds", r.wall_seconds},
                   {"status", r.Describe()}});
  }
  return JsonText(json{{"runs", std::move(out)}});
}

}  // namespace orrery::env
