@0xd4a1c0f3e5b27a91;
# The environment service (actors/envserver/): rollout actors drive tool-use episodes of
# environments hosted by `orrery env serve` or the "env" actor role, over the actor runtime's
# two-frame format (actor.capnp Envelope + one of these bodies).
#
# Methods ("env.<Name>": request -> reply):
#   env.Describe  DescribeRequest -> DescribeReply   what is served, and this incarnation
#   env.Task      TaskRequest     -> TaskReply       the id and seed of task (split, index)
#   env.Reset     ResetRequest    -> ResetReply      a new episode of task (split, index)
#   env.Step      StepRequest     -> StepReply       one tool call of an open episode
#   env.Score     ScoreRequest    -> ScoreReply      reward of a finished trajectory
#   env.Close     CloseRequest    -> CloseReply      frees the episode (idempotent)
#
# Errors are the envelope's status code and one line (orrery::StatusCode): NotFound for an
# unknown environment or episode; a message starting "episode lost:" when the episode belonged
# to an earlier incarnation of the server (it was restarted: re-issue the task); InvalidArgument
# for malformed requests; DeadlineExceeded when the caller's deadline passed; ResourceExhausted
# when the server holds its maximum number of episodes. Model mistakes (a bad tool call) are not
# errors: they are a StepReply with isError set, which the model reads.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("orrery::schema");

struct EnvToolSpec {
  name @0 :Text;
  description @1 :Text;
  parametersJson @2 :Text;   # a JSON Schema object for the arguments
}

struct EnvToolCall {
  id @0 :Text;
  name @1 :Text;
  argumentsJson @2 :Text;    # a JSON object, as text (may be malformed: the model wrote it)
}

struct EnvChatMessage {
  role @0 :Text;             # "system", "user", "assistant", "tool"
  content @1 :Text;
  toolCalls @2 :List(EnvToolCall);
  toolCallId @3 :Text;
  name @4 :Text;
}

struct EnvInfo {
  name @0 :Text;
}

struct DescribeRequest {}

struct DescribeReply {
  incarnation @0 :UInt64;    # random per server start: a change means episodes were lost
  envs @1 :List(EnvInfo);
  openEpisodes @2 :UInt32;
  servedBy @3 :Text;         # the serving actor's name ("env:0")
}

struct TaskRequest {
  env @0 :Text;              # one of DescribeReply.envs
  split @1 :Text;            # "train" or "test"
  index @2 :UInt64;
}

struct TaskReply {
  taskId @0 :Text;
  taskSeed @1 :UInt64;
}

struct ResetRequest {
  env @0 :Text;              # one of DescribeReply.envs
  split @1 :Text;            # "train" or "test"
  index @2 :UInt64;          # the task index within the split
}

struct ResetReply {
  episodeId @0 :Text;        # "<incarnation hex>-<counter>"
  taskId @1 :Text;
  taskSeed @2 :UInt64;
  messages @3 :List(EnvChatMessage);  # the initial messages
  tools @4 :List(EnvToolSpec);
}

struct StepRequest {
  episodeId @0 :Text;
  call @1 :EnvToolCall;
}

struct StepReply {
  content @0 :Text;
  isError @1 :Bool;
  latencyS @2 :Float64;      # the environment's own measure of the call
}

struct ScoreRequest {
  episodeId @0 :Text;
  trajectory @1 :List(EnvChatMessage);  # initial messages included, as the model saw them
}

struct ScoreComponent {
  name @0 :Text;
  value @1 :Float64;
}

struct ScoreReply {
  reward @0 :Float64;
  components @1 :List(ScoreComponent);
}

struct CloseRequest {
  episodeId @0 :Text;
}

struct CloseReply {
  closed @0 :Bool;           # false: it was not open (already closed, or idle-expired)
}
