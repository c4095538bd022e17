"""The sandbox's first process: ``python -I -c PRELUDE main.py ARGS``, started by ``unshare`` inside fresh
namespaces. It sets everything up before any program code exists, then runs ``main.py`` as ``__main__`` (with
``sys.argv`` = ``[main.py, ARGS...]``, as ``python main.py`` would; nothing of the prelude is left in its globals;
line numbers and ``from __future__`` imports stay valid because nothing is prepended to ``main.py``).

One interpreter does what a shell, a mount binary per mount, ``cp``, ``setpriv`` and ``prlimit`` used to do (14
programs started per sample, ~1 ms each): in order, as root in the new mount namespace when the level allows it,

1. join the sample's cgroup (``verifiers/cgroups.py``), set the rlimits (CPU s, address space, file size, process
   count, no core dumps);
2. cover the caller's directories with empty read-only-for-others tmpfs, mount the working dir as a tmpfs of
   ``quota`` bytes owned by the sample's uid and copy the sample's files into it, then give ``/tmp``, ``/var/tmp``,
   ``/dev/shm`` and ``/run`` private size-limited tmpfs (nosuid, nodev; the host's ``/run/lock`` disappears);
3. drop to the sample's uid and gid with no supplementary groups (capabilities go with root);
4. set no_new_privs and load the seccomp filter (below), through ``prctl`` via ctypes.

The seccomp filter is built once by the parent with libseccomp (the maintained library behind Docker's, systemd's
and Chromium's filters) and exported as BPF, so the sandbox needs neither libseccomp nor site-packages. It allows
every system call except the ones a test program never needs and a kernel exploit or an escape often does; they
fail with EPERM, an ordinary error. The list follows Docker's default profile (moby/profiles
``seccomp/default.json``: the calls it allows only with CAP_SYS_ADMIN and friends, plus io_uring, blocked there
since 2023), trimmed to what applies to an unprivileged process:

* new namespaces and mounts (``unshare``, ``setns``, ``clone`` with a CLONE_NEW* flag, ``mount`` and the new mount
  API, ``pivot_root``, ``chroot``): unprivileged user namespaces would otherwise make the program root in a
  namespace of its own, the first step of most container escapes. ``clone3`` fails with ENOSYS instead, as in
  Docker's profile: seccomp cannot read its flags (they sit in a struct), and glibc then falls back to ``clone``.
* other processes' memory (``ptrace``, ``process_vm_readv``/``writev``, ``pidfd_getfd``, ``kcmp``);
* kernel and host state (modules, kexec, reboot, swap, accounting, quotas, clocks, host names, keyrings, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, file handles, ``syslog``, I/O ports, ``modify_ldt``).

libseccomp's filter kills a process that makes a system call through another ABI (32-bit ``int 0x80``, x32), so
the list cannot be sidestepped that way. Where libseccomp is missing the sandbox logs it once
(``sandbox.isolation()["seccomp"]``) and runs without a filter.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import tempfile

EPERM, ENOSYS = 1, 38
DENY_EPERM = (
    # namespaces and mounts
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    # other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "process_madvise",
    # kernel and host state
    "init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog",
    "iopl", "ioperm", "modify_ldt", "vm86", "vm86old", "settimeofday", "stime", "clock_settime", "clock_adjtime",
    "adjtimex", "sethostname", "setdomainname", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "name_to_handle_at",
    "open_by_handle_at", "lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "vhangup",
    "fanotify_init",
)
DENY_ENOSYS = ("clone3",)
# CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (linux/sched.h)
CLONE_NEW_FLAGS = (0x80, 0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_CMP_MASKED_EQ = 0x7FFF0000, 0x00050000, 7


class _ArgCmp(ctypes.Structure):  # struct scmp_arg_cmp (seccomp.h)
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


def _libseccomp():
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    lib.seccomp_init.restype, lib.seccomp_init.argtypes = ctypes.c_void_p, [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.c_void_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


@functools.lru_cache(maxsize=1)
def seccomp_bpf() -> bytes | None:
    """The filter as a BPF program for this machine's architecture, or None where libseccomp cannot be loaded."""
    try:
        lib = _libseccomp()
    except OSError:
        return None
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        return None
    try:
        rules = [(n, EPERM, None) for n in DENY_EPERM] + [(n, ENOSYS, None) for n in DENY_ENOSYS]
        rules += [("clone", EPERM, flag) for flag in CLONE_NEW_FLAGS]  # flags are clone's first argument
        for name, err, flag in rules:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not a system call on this architecture
                continue
            cmp = None if flag is None else ctypes.byref(_ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag))
            if lib.seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO | err, nr, 0 if cmp is None else 1, cmp):
                raise RuntimeError(f"libseccomp refused the rule for {name}")
        with tempfile.TemporaryFile() as f:
            if lib.seccomp_export_bpf(ctx, f.fileno()):
                return None
            f.seek(0)
            return f.read()
    finally:
        lib.seccomp_release(ctx)


_PRELUDE = r'''def _rlr_prelude(cfg):
    import ctypes
    import os
    import resource
    import sys

    def fail(msg):
        os.write(2, ("rlrecipes sandbox prelude: %s\n" % msg).encode())
        os._exit(125)

    libc = ctypes.CDLL(None, use_errno=True)

    def mount(target, size, mode, uid=0):
        # nr_inodes: a size limit alone lets millions of empty files pin kernel memory
        opts = "size=%d,nr_inodes=%d,mode=%o,uid=%d,gid=%d" % (size, max(64, size >> 12), mode, uid, uid)
        if libc.mount(b"none", target.encode(), b"tmpfs", 6, opts.encode()):  # MS_NOSUID | MS_NODEV
            fail("mount %s: %s" % (target, os.strerror(ctypes.get_errno())))

    for path in cfg["cgroup_procs"]:
        with open(path, "w") as f:
            f.write("0")
    for name, value in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    uid = cfg["uid"]
    if uid is not None:
        for d in cfg["hidden"]:
            mount(d, 1 << 20, 0o755)
        os.mkdir("/mnt/sbx")
        mount("/mnt/sbx", cfg["quota"], 0o700, uid)
        for name in os.listdir(cfg["files"]):
            with open(os.path.join(cfg["files"], name), "rb") as src, open("/mnt/sbx/" + name, "wb") as dst:
                dst.write(src.read())
        for d in cfg["private"]:
            mount(d, cfg["private_size"], 0o1777)
        os.chdir("/mnt/sbx")
        os.environ["HOME"] = "/mnt/sbx"
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if libc.prctl(38, 1, 0, 0, 0):  # PR_SET_NO_NEW_PRIVS
        fail("no_new_privs: %s" % os.strerror(ctypes.get_errno()))
    if cfg["bpf"] is not None:
        class Prog(ctypes.Structure):  # struct sock_fprog
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
        buf = ctypes.create_string_buffer(cfg["bpf"], len(cfg["bpf"]))
        prog = Prog(len(cfg["bpf"]) // 8, ctypes.cast(buf, ctypes.c_void_p))
        if libc.prctl(22, 2, ctypes.byref(prog), 0, 0):  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            fail("seccomp: %s" % os.strerror(ctypes.get_errno()))
    # GUARD
    path = os.path.abspath(sys.argv[1])
    del sys.argv[0]
    globals()["__file__"] = path
    with open(path, "rb") as f:
        return compile(f.read(), path, "exec", dont_inherit=True)


exec((lambda code: (globals().pop("_rlr_prelude"), code)[1])(_rlr_prelude(CONFIG)))
'''

_GUARD = '''
    import socket as s

    def no_net(*a, **k):
        raise OSError("network access is disabled in the rlrecipes sandbox")

    class NoNetSocket(s.socket):
        connect = connect_ex = sendto = bind = no_net
    s.socket, s.create_connection, s.getaddrinfo = NoNetSocket, no_net, no_net
'''


def source(cfg: dict, guard: bool) -> str:
    """The ``-c`` program for one run. ``cfg``: ``uid`` (None: stay the caller, no mounts), ``hidden``, ``private``
    (dirs to cover), ``private_size``, ``quota`` (bytes), ``files`` (host dir whose files go to the working dir),
    ``cgroup_procs`` (files to join), ``rlimits`` ({"RLIMIT_CPU": n, ...}), ``bpf`` (bytes or None). ``guard``
    adds the in-process network guard of the weakest level (no network namespace)."""
    return _PRELUDE.replace("    # GUARD\n", _GUARD if guard else "").replace("CONFIG", repr(cfg))
