// JSON text of values that may carry outside bytes (model text, plug-in replies): nlohmann's
// dump() throws type_error 316 on invalid UTF-8, which would take down an actor; this replaces
// each invalid byte with U+FFFD instead. Every writer of such JSON uses it.
//
// Reading such JSON goes through ParseUntrustedJson: nlohmann parses iteratively, but copying,
// comparing, dumping and destroying a value recurse once per nesting level, so a 200 KB line of
// '[' (a plug-in reply, a model's tool call) overflowed the stack. Text nested deeper than
// kMaxJsonDepth is treated as invalid JSON.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace orrery {

inline std::string JsonText(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

inline constexpr size_t kMaxJsonDepth = 256;

// Whether the arrays and objects of `text` nest at most `max_depth` deep (strings are skipped,
// so brackets inside them do not count). Linear, no recursion; the text need not be valid JSON.
inline bool JsonDepthWithin(std::string_view text, size_t max_depth = kMaxJsonDepth) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return true;
}

// json::parse without exceptions: a discarded value when `text` is not JSON or nests deeper than
// kMaxJsonDepth.
template <typename Json = nlohmann::json>
Json ParseUntrustedJson(std::string_view text) {
  if (!JsonDepthWithin(text)) return Json(Json::value_t::discarded);
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace orrery
