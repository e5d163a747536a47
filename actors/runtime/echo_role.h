// The built-in "echo" role: answers echo.Echo (EchoRequest -> EchoReply, actors/schema/actor.capnp)
// with the text, its name, its pid and how many requests this incarnation served. It is a real
// actor (its own mailbox and loop), used to smoke-test a fleet and to test supervision and
// reconnection without depending on the heavier roles.
#pragma once

namespace orrery {

inline constexpr char kEchoMethod[] = "echo.Echo";

// Registers "echo" with RegisterActorRole (idempotent).
void RegisterEchoRole();

}  // namespace orrery
