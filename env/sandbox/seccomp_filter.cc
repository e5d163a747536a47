#include "env/sandbox/seccomp_filter.h"

#include <linux/sched.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace orrery::env {

const std::vector<const char*>& DeniedSyscalls() {
  static const std::vector<const char*> kDenied = {"ptrace",
                                                   "process_vm_readv",
                                                   "process_vm_writev",
                                                   "mount",
                                                   "umount2",
                                                   "pivot_root",
                                                   "chroot",
                                                   "open_tree",
                                                   "move_mount",
                                                   "fsopen",
                                                   "fsconfig",
                                                   "fsmount",
                                                   "fspick",
                                                   "mount_setattr",
                                                   "unshare",
                                                   "setns",
                                                   "kexec_load",
                                                   "kexec_file_load",
                                                   "bpf",
                                                   "perf_event_open",
                                                   "keyctl",
                                                   "add_key",
                                                   "request_key",
                                                   "init_module",
                                                   "finit_module",
                                                   "delete_module",
                                                   "reboot",
                                                   "swapon",
                                                   "swapoff",
                                                   "syslog",
                                                   "acct",
                                                   "userfaultfd",
                                                   "open_by_handle_at",
                                                   "name_to_handle_at",
                                                   "settimeofday",
                                                   "clock_settime",
                                                   "adjtimex",
                                                   "quotactl",
                                                   "personality",
                                                   "iopl",
                                                   "ioperm",
                                                   "io_uring_setup",
                                                   "io_uring_enter",
                                                   "io_uring_register"};
  return kDenied;
}

uint64_t DeniedCloneFlags() {
  return CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
         CLONE_NEWPID | CLONE_NEWNET;
}

namespace {

// Adds one rule; names the call in the error.
Status AddRule(scmp_filter_ctx ctx, uint32_t action, const char* name, unsigned count,
               const scmp_arg_cmp* cmp) {
  const int nr = seccomp_syscall_resolve_name(name);
  if (nr == __NR_SCMP_ERROR) return Status::OK();  // not on this architecture
  if (seccomp_rule_add_array(ctx, action, nr, count, cmp) < 0) {
    return InternalError(std::string("seccomp_rule_add(") + name + ") failed");
  }
  return Status::OK();
}

Status AddRules(scmp_filter_ctx ctx) {
  for (const char* name : DeniedSyscalls()) {
    ORRERY_RETURN_IF_ERROR(AddRule(ctx, SCMP_ACT_ERRNO(EPERM), name, 0, nullptr));
  }
  // clone3 passes its flags in memory, where a filter cannot look: ENOSYS makes glibc fall back to
  // clone, whose flags are an argument. clone with any namespace flag fails with EPERM (each flag
  // its own rule: a rule's comparisons are ANDed).
  ORRERY_RETURN_IF_ERROR(AddRule(ctx, SCMP_ACT_ERRNO(ENOSYS), "clone3", 0, nullptr));
  for (int bit = 0; bit < 64; ++bit) {
    const uint64_t flag = uint64_t{1} << bit;
    if ((DeniedCloneFlags() & flag) == 0) continue;
    const scmp_arg_cmp cmp = {0, SCMP_CMP_MASKED_EQ, flag, flag};
    ORRERY_RETURN_IF_ERROR(AddRule(ctx, SCMP_ACT_ERRNO(EPERM), "clone", 1, &cmp));
  }
  // socket/socketpair: only AF_UNIX (1), AF_INET (2) and AF_INET6 (10). Every other 64-bit
  // domain value fails with EAFNOSUPPORT: 0 and 3..9 by equality, 11 and above by one range.
  static_assert(AF_UNIX == 1 && AF_INET == 2 && AF_INET6 == 10);
  for (const char* name : {"socket", "socketpair"}) {
    for (uint64_t domain : {0, 3, 4, 5, 6, 7, 8, 9}) {
      const scmp_arg_cmp cmp = {0, SCMP_CMP_EQ, domain, 0};
      ORRERY_RETURN_IF_ERROR(AddRule(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), name, 1, &cmp));
    }
    const scmp_arg_cmp cmp = {0, SCMP_CMP_GE, uint64_t{AF_INET6 + 1}, 0};
    ORRERY_RETURN_IF_ERROR(AddRule(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), name, 1, &cmp));
  }
  return Status::OK();
}

}  // namespace

StatusOr<int> MakeSeccompFilterFd() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return InternalError("seccomp_init failed");
  if (Status s = AddRules(ctx); !s.ok()) {
    seccomp_release(ctx);
    return s;
  }
  const int fd = memfd_create("orrery-seccomp", 0);  // no MFD_CLOEXEC: bwrap inherits it
  if (fd < 0) {
    seccomp_release(ctx);
    return ErrnoError("memfd_create for the seccomp filter", errno);
  }
  const int rc = seccomp_export_bpf(ctx, fd);
  seccomp_release(ctx);
  if (rc < 0 || lseek(fd, 0, SEEK_SET) != 0) {
    close(fd);
    return InternalError("seccomp_export_bpf failed");
  }
  return fd;
}

}  // namespace orrery::env
