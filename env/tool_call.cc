#include "env/tool_call.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/json_text.h"

namespace orrery::env {
namespace {

using nlohmann::json;

std::string TypeName(const json& v) {
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

bool HasType(const json& v, const std::string& type) {
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() || v.is_number_unsigned() ||
           (v.is_number_float() && std::isfinite(v.get<double>()) &&
            std::trunc(v.get<double>()) == v.get<double>());
  }
  return TypeName(v) == type;
}

Status CheckValue(const std::string& name, const json& value, const json& schema) {
  const std::string where = "argument '" + name + "'";
  if (schema.contains("type") && schema["type"].is_string()) {
    const std::string type = schema["type"].get<std::string>();
    if (!HasType(value, type)) {
      return InvalidArgumentError(where + ": expected " + (type == "integer" ? "an " : "a ") +
                                  type + ", got " + TypeName(value));
    }
  }
  // The schema comes from a plug-in: a keyword of the wrong type is reported, never thrown.
  if (schema.contains("maxLength") && !schema["maxLength"].is_number_unsigned()) {
    return InvalidArgumentError(where + ": the tool's schema is invalid: 'maxLength' must be a " +
                                "non-negative integer, got " + TypeName(schema["maxLength"]));
  }
  for (const char* bound : {"minimum", "maximum"}) {
    if (schema.contains(bound) && !schema[bound].is_number()) {
      return InvalidArgumentError(where + ": the tool's schema is invalid: '" + bound +
                                  "' must be a number, got " + TypeName(schema[bound]));
    }
  }
  if (schema.contains("maxLength") && value.is_string() &&
      value.get<std::string>().size() > schema["maxLength"].get<size_t>()) {
    return InvalidArgumentError(where + ": longer than " + schema["maxLength"].dump() +
                                " characters");
  }
  if (value.is_number()) {
    const double v = value.get<double>();
    if (schema.contains("minimum") && v < schema["minimum"].get<double>()) {
      return InvalidArgumentError(where + ": below the minimum " + schema["minimum"].dump());
    }
    if (schema.contains("maximum") && v > schema["maximum"].get<double>()) {
      return InvalidArgumentError(where + ": above the maximum " + schema["maximum"].dump());
    }
  }
  if (schema.contains("enum") && schema["enum"].is_array()) {
    bool found = false;
    for (const json& e : schema["enum"]) found = found || e == value;
    if (!found) return InvalidArgumentError(where + ": must be one of " + schema["enum"].dump());
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::string> ValidateToolCall(const ToolCall& call, const std::vector<ToolSpec>& tools) {
  const ToolSpec* spec = nullptr;
  std::string names;
  for (const ToolSpec& t : tools) {
    if (t.name == call.name) spec = &t;
    names += (names.empty() ? "" : ", ") + t.name;
  }
  if (spec == nullptr) {
    return InvalidArgumentError("unknown tool '" + call.name.substr(0, 64) +
                                "' (available: " + names + ")");
  }
  json args = ParseUntrustedJson(call.arguments_json.empty() ? "{}" : call.arguments_json);
  if (args.is_discarded()) {
    return InvalidArgumentError(
        "arguments are not valid JSON (expected an object such as "
        "{\"name\": value})");
  }
  if (!args.is_object()) {
    return InvalidArgumentError("arguments must be a JSON object, got " + TypeName(args));
  }
  json schema = ParseUntrustedJson(spec->parameters_json);
  if (schema.is_discarded() || !schema.is_object()) {
    return JsonText(args);  // nothing to check
  }
  const json props = schema.contains("properties") && schema["properties"].is_object()
                         ? schema["properties"]
                         : json::object();
  if (schema.contains("required") && schema["required"].is_array()) {
    for (const json& r : schema["required"]) {
      if (r.is_string() && !args.contains(r.get<std::string>())) {
        return InvalidArgumentError("missing required argument '" + r.get<std::string>() + "'");
      }
    }
  }
  const bool closed = schema.contains("additionalProperties") &&
                      schema["additionalProperties"].is_boolean() &&
                      !schema["additionalProperties"].get<bool>();
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (props.contains(it.key())) {
      ORRERY_RETURN_IF_ERROR(CheckValue(it.key(), it.value(), props[it.key()]));
    } else if (closed) {
      std::string allowed;
      for (auto p = props.begin(); p != props.end(); ++p) {
        allowed += (allowed.empty() ? "" : ", ") + p.key();
      }
      return InvalidArgumentError("unexpected argument '" + it.key().substr(0, 64) +
                                  "' (allowed: " + allowed + ")");
    }
  }
  return JsonText(args);
}

ToolResult ToolError(const std::string& message) {
  ToolResult r;
  r.content = "error: " + message;
  r.is_error = true;
  return r;
}

}  // namespace orrery::env
