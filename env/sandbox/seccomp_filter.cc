#include "env/sandbox/seccomp_filter.h"

#include <seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

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
                                                   "ioperm"};
  return kDenied;
}

StatusOr<int> MakeSeccompFilterFd() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return InternalError("seccomp_init failed");
  for (const char* name : DeniedSyscalls()) {
    const int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    const int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    if (rc < 0) {
      seccomp_release(ctx);
      return InternalError(std::string("seccomp_rule_add(") + name + ") failed");
    }
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
