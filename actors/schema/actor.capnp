@0xc9f46a3a48e4bd95;
# The actor runtime's wire format: the envelope every message travels in, and the coordinator
# protocol (registration, heartbeats, lookup, run state, fleet status).
#
# A message is two ZeroMQ frames: an Envelope (this file) and a body, the Cap'n Proto message of
# the method's request or reply type. Envelopes carry the method name, a request id that matches
# the reply to its request, and the caller's deadline, so a server never works on a request whose
# caller has already given up.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("orrery::schema");

struct Envelope {
  method @0 :Text;          # "coordinator.Heartbeat", "echo.Echo", ...
  requestId @1 :UInt64;     # chosen by the caller; the reply carries the same id
  deadlineUnixMs @2 :Int64; # 0: none. Servers answer DeadlineExceeded past it without running
  sender @3 :Text;          # the calling actor's name (for logs)
  isReply @4 :Bool;
  statusCode @5 :UInt16;    # replies: orrery::StatusCode (0 = OK; then the body is the reply)
  statusMessage @6 :Text;
}

struct Empty {}

# The run's shared state, owned by the coordinator and returned with every heartbeat, so every
# actor sees it within one heartbeat period.
struct RunState {
  phase @0 :Text;           # "starting", "pretrain", "rl", "stopping", ...
  stage @1 :UInt32;
  policyVersion @2 :UInt64;
  stopping @3 :Bool;        # the fleet is shutting down
}

struct RegisterRequest {
  name @0 :Text;            # "replay:0"
  role @1 :Text;
  index @2 :UInt32;
  endpoint @3 :Text;        # where its mailbox listens
  pid @4 :Int64;
  host @5 :Text;
  ready @6 :Bool;           # serving requests (false: still starting)
  progress @7 :UInt64;      # the role's progress counter (see HeartbeatRequest.progress)
  authRefused @8 :UInt64;   # see HeartbeatRequest.authRefused
}

struct HeartbeatRequest {
  name @0 :Text;
  pid @1 :Int64;
  ready @2 :Bool;
  progress @3 :UInt64;      # advanced by the role's main loop (ActorContext::Progress); 0: the
                            # role has not reported progress (it is then not watched for stalls)
  authRefused @4 :UInt64;   # peers this process's CURVE sockets refused since it started
}

struct HeartbeatReply {
  known @0 :Bool;           # false: the coordinator does not know this actor; register again
  runState @1 :RunState;
}

struct LookupRequest {
  name @0 :Text;            # an actor name ("replay:0") or a role ("env": any ready instance)
}

struct LookupReply {
  name @0 :Text;
  endpoint @1 :Text;
}

struct SetRunStateRequest {
  phase @0 :Text;           # "" keeps the current phase
  stage @1 :Int64;          # -1 keeps the current stage
  policyVersion @2 :Int64;  # -1 keeps the current version
}

struct ActorStatus {
  name @0 :Text;
  role @1 :Text;
  index @2 :UInt32;
  endpoint @3 :Text;
  state @4 :Text;           # "starting", "running", "backoff", "exited", "failed", "stopped"
  pid @5 :Int64;
  host @6 :Text;
  restarts @7 :UInt32;
  lastHeartbeatUnixMs @8 :Int64;  # 0: never
  lastExit @9 :Text;        # how the last incarnation ended ("killed by signal 9", "exit 1")
  progress @10 :UInt64;     # the role's progress counter (0: never reported)
  lastProgressUnixMs @11 :Int64;  # when the coordinator last saw it advance; 0: never
}

struct FleetStatus {
  runState @0 :RunState;
  actors @1 :List(ActorStatus);
  startedUnixMs @2 :Int64;
}

# The built-in "echo" role (runtime tests, supervision tests, smoke tests of a fleet).
struct EchoRequest {
  text @0 :Text;
  sleepMs @1 :UInt32;       # the server waits this long first (deadline and cancellation tests)
}

struct EchoReply {
  text @0 :Text;
  servedBy @1 :Text;        # the serving actor's name
  pid @2 :Int64;
  served @3 :UInt64;        # requests this incarnation has served
}
