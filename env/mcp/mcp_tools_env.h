// Attaching MCP servers' tools to any environment.
//
// WithMcpTools wraps an Env: every episode also gets each configured MCP server running in its
// own pooled sandbox (the server's /work is that sandbox's private directory, empty when the
// episode starts), with its tools offered beside the environment's own. Calls to an MCP tool go
// to its server; the rest go to the inner episode; scoring is the inner episode's. Tool names
// must be unique across the environment and the servers (Reset fails with the clashing name
// otherwise). Tools a server offers that cannot be called (McpClient::skipped_tools) are logged
// once per server.
//
// By default a server is started for each episode and stopped at its end. With reuse_server,
// for servers that keep no state of their own between calls (their state is the files in
// /work): at an episode's end the server keeps running, its /work is emptied, and the next
// episode takes it after a `ping` (a server that does not answer, or whose call was cancelled,
// is replaced by a fresh one). Its process-private /tmp is not emptied.
//
// Config: one [[env.mcp]] table per server:
//   [[env.mcp]]
//   name = "fs"
//   dir = "../.cache/npm"            # host directory mounted read-only at /mcp
//   command = ["/usr/bin/node",
//   "/mcp/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js", "/work"]
//   wall_seconds = 30                # deadline of each request
//   memory_mb = 16384                # RLIMIT_AS: V8 reserves large virtual ranges up front
//   open_files = 1024                # node opens every module file at start-up
//   pool_size = 32                   # sandboxes; default: the episodes in flight (EnvDemand)
//   reuse_server = false             # keep the server running across episodes (see above)
//   roots = ["/work"]                # answered to roots/list; [] declares no roots capability
// Episodes must end before the Env is destroyed (they give their sandboxes and servers back).
#pragma once

#include <memory>
#include <vector>

#include "core/config.h"
#include "env/env.h"
#include "env/mcp/mcp_client.h"
#include "env/sandbox/sandbox.h"

namespace orrery::env {

struct McpAttachment {
  McpServerOptions server;
  std::string dir;  // mounted at /mcp when set
  SandboxOptions sandbox;
  int pool_size = 16;
  bool reuse_server = false;
};

// [[env.mcp]] of `env_table`; each server's pool_size defaults to the demand (ReadPoolSize).
std::vector<McpAttachment> ReadMcpAttachments(ConfigTable& env_table, const EnvDemand& demand);
std::unique_ptr<Env> WithMcpTools(std::unique_ptr<Env> inner, std::vector<McpAttachment> servers);

}  // namespace orrery::env
