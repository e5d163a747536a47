#include "actors/runtime/echo_role.h"

#include <unistd.h>

#include <mutex>

#include "actors/runtime/actor.h"
#include "actors/runtime/role.h"
#include "actors/schema/actor.capnp.h"

namespace orrery {
namespace {

Status EchoMain(ActorContext& ctx) {
  Actor actor(ctx.zmq(), ctx.name());
  ORRERY_RETURN_IF_ERROR(actor.Bind(ctx.endpoint()));
  actor.HandleWithInfo<schema::EchoRequest, schema::EchoReply>(
      kEchoMethod, [&actor](schema::EchoRequest::Reader req, const RequestInfo& info,
                            schema::EchoReply::Builder rep) {
        if (req.getSleepMs() > 0 &&
            info.stop->WaitFor(std::chrono::milliseconds(req.getSleepMs()))) {
          return CancelledError("echo: stopping");
        }
        rep.setText(req.getText());
        rep.setServedBy(actor.name());
        rep.setPid(getpid());
        rep.setServed(actor.served() + 1);
        return Status::OK();
      });
  ctx.SetReady();
  // A timer on the loop thread: it stops firing when a handler never returns.
  actor.Every(std::chrono::milliseconds(100), [&ctx] { ctx.Progress(); });
  return actor.Run(ctx.stop());
}

}  // namespace

void RegisterEchoRole() {
  static std::once_flag once;
  std::call_once(once, [] {
    RegisterActorRole({"echo", "answers echo.Echo; for smoke tests of a fleet", EchoMain});
  });
}

}  // namespace orrery
