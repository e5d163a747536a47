// Conversions between the environment interface's C++ types (env/env.h, core/chat.h) and their
// Cap'n Proto forms (actors/schema/env.capnp), shared by the server and the client.
//
// Readers come from messages a peer sent: the caller wraps them in CatchAll, since Cap'n Proto
// validates lazily and throws on malformed data. Roles that do not parse are InvalidArgument.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/schema/env.capnp.h"
#include "core/chat.h"
#include "core/status.h"
#include "env/env.h"

namespace orrery::envserver {

void ToWire(const ToolCall& call, schema::EnvToolCall::Builder out);
ToolCall FromWire(schema::EnvToolCall::Reader in);

void ToWire(const env::ToolSpec& spec, schema::EnvToolSpec::Builder out);
env::ToolSpec FromWire(schema::EnvToolSpec::Reader in);

void ToWire(const ChatMessage& message, schema::EnvChatMessage::Builder out);
StatusOr<ChatMessage> FromWire(schema::EnvChatMessage::Reader in);

void MessagesToWire(const std::vector<ChatMessage>& messages,
                    capnp::List<schema::EnvChatMessage>::Builder out);
StatusOr<std::vector<ChatMessage>> MessagesFromWire(capnp::List<schema::EnvChatMessage>::Reader in);

// Episode ids are "<incarnation as 16 lowercase hex digits>-<counter>". The incarnation an id
// names, or 0 when it is not of that form.
uint64_t EpisodeIncarnation(const std::string& episode_id);

}  // namespace orrery::envserver
