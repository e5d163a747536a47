// Any-language environments: a process speaking orrery-env/1 (JSON-RPC 2.0 over JSON lines on
// stdio, docs/env-protocol.md), started inside the bubblewrap sandbox.
//
// At creation Orrery starts the program once and calls `describe` (so a wrong command or protocol
// version fails at start-up with one clear line). Each episode then gets its own process in a
// pooled sandbox: `reset` at Reset(), `step` per tool call (arguments validated against the
// tool's schema first, so the program only sees well-formed calls), `score`, and `close` when the
// episode ends. The program's directory is mounted read-only at /env. While a call waits, the
// program may ask Orrery to run code in a sandbox without /env (`run_isolated`,
// env/external/run_isolated.h): the way to run the model's code where the program's secrets are
// out of its reach.
//
// Options ([env.external]):
//   dir = "env/examples"                               host directory mounted at /env
//   command = ["/usr/bin/python3", "/env/guess_env.py"]
//   seed = 0, wall_seconds = 30 (per call), memory_mb = 1024
//   pool_size = the episodes in flight (EnvDemand; 16 when unknown), at most 2048
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "env/env.h"
#include "env/sandbox/sandbox.h"

namespace orrery::env {

inline constexpr const char* kEnvProtocolVersion = "orrery-env/1";

struct ExternalEnvOptions {
  std::string dir;                   // mounted at /env (read-only)
  std::vector<std::string> command;  // argv inside the sandbox
  uint64_t seed = 0;
  double call_seconds = 30;  // deadline of describe/reset/step/score when the caller's is later
  int pool_size = 16;
  SandboxOptions sandbox;
};

ExternalEnvOptions ReadExternalEnvOptions(ConfigTable& table, const EnvDemand& demand);
// The readers of the program's replies (a JSON-RPC result as JSON text, ReadJsonRpcResponse's
// output), each a value or a FailedPrecondition error naming `peer`; none throws, whatever the
// text. Exposed for the fuzz tests.
struct ExternalResetResult {
  std::vector<ChatMessage> messages;
  std::vector<ToolSpec> tools;
};
StatusOr<std::string> ReadDescribeResult(const std::string& result, const std::string& peer);
StatusOr<ExternalResetResult> ReadResetResult(const std::string& result, const std::string& peer);
StatusOr<ToolResult> ReadStepResult(const std::string& result);
StatusOr<EpisodeScore> ReadScoreResult(const std::string& result);

// Starts the program once for `describe`; fails with a clear message when it does not answer.
StatusOr<std::unique_ptr<Env>> MakeExternalEnv(const ExternalEnvOptions& options);

}  // namespace orrery::env
