// JSON text of values that may carry outside bytes (model text, plug-in replies): nlohmann's
// dump() throws type_error 316 on invalid UTF-8, which would take down an actor; this replaces
// each invalid byte with U+FFFD instead. Every writer of such JSON uses it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace orrery {

inline std::string JsonText(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace orrery
