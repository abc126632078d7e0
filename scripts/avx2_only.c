/* Loaded with LD_PRELOAD by scripts/avx2_only.sh: every process it starts sees an
 * AVX2-only CPU on an AVX-512 host, so onnxruntime's MLAS, numpy, OpenBLAS, gcc's
 * -march=native and wpk pick their AVX2 code as on a machine without AVX-512.
 *
 * How: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, on CPUs that list
 * `cpuid_fault`) makes each CPUID instruction of this process and its threads raise
 * SIGSEGV; the handler below runs the real CPUID with faulting briefly off, clears the
 * AVX-512, AMX and AVX-VNNI bits of leaf 7 and steps over the instruction. Any other
 * SIGSEGV goes to the handler the program installed (the wrappers of sigaction and
 * signal keep this one first and remember the program's), or kills as SIGSEGV does. A
 * vfork child (Python's subprocess, posix_spawn), which shares this memory until it
 * execs, sets its own handlers: what it resets is not the parent's.
 * /proc/cpuinfo still lists the host's flags: wpk drops those numpy's runtime check
 * (CPUID) does not confirm.
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define ARCH_SET_CPUID 0x1012

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);

static struct sigaction program_handler;  /* the SIGSEGV handler the program asked for */
static int hiding;                        /* CPUID faulting is on */
static pid_t owner;                       /* the process program_handler belongs to */

static sigaction_fn real_sigaction(void) {
    static sigaction_fn real;
    if (!real) real = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    return real;
}

/* CPUID of (leaf, subleaf) with AVX-512 (F, DQ, IFMA, PF, ER, CD, BW, VL, VBMI,
 * VBMI2, VNNI, BITALG, VPOPCNTDQ, 4VNNIW, 4FMAPS, VP2INTERSECT, FP16, BF16), AMX and
 * AVX-VNNI cleared. */
static void masked_cpuid(unsigned leaf, unsigned subleaf, unsigned r[4]) {
    __cpuid_count(leaf, subleaf, r[0], r[1], r[2], r[3]);
    if (leaf == 7 && subleaf == 0) {
        r[1] &= ~(1u << 16 | 1u << 17 | 1u << 21 | 1u << 26 | 1u << 27 | 1u << 28 |
                  1u << 30 | 1u << 31);
        r[2] &= ~(1u << 1 | 1u << 6 | 1u << 11 | 1u << 12 | 1u << 14);
        r[3] &= ~(1u << 2 | 1u << 3 | 1u << 8 | 1u << 22 | 1u << 23 | 1u << 24 | 1u << 25);
    } else if (leaf == 7 && subleaf == 1) {
        r[0] &= ~(1u << 4 | 1u << 5);
    }
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    greg_t *regs = ((ucontext_t *)context)->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)regs[REG_RIP];
    if (info->si_code == SI_KERNEL && ip[0] == 0x0F && ip[1] == 0xA2) {   /* CPUID */
        unsigned r[4];
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
        masked_cpuid((unsigned)regs[REG_RAX], (unsigned)regs[REG_RCX], r);
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
        regs[REG_RAX] = r[0];
        regs[REG_RBX] = r[1];
        regs[REG_RCX] = r[2];
        regs[REG_RDX] = r[3];
        regs[REG_RIP] += 2;
        return;
    }
    if (program_handler.sa_flags & SA_SIGINFO) {
        program_handler.sa_sigaction(sig, info, context);
    } else if (program_handler.sa_handler != SIG_DFL && program_handler.sa_handler != SIG_IGN) {
        program_handler.sa_handler(sig);
    } else if (program_handler.sa_handler == SIG_DFL || info->si_code > 0) {
        /* the default: a fault, run again on return, kills the process; a sent signal is
           sent again */
        struct sigaction fallback;
        memset(&fallback, 0, sizeof fallback);
        fallback.sa_handler = SIG_DFL;
        real_sigaction()(SIGSEGV, &fallback, NULL);
        if (info->si_code <= 0) raise(SIGSEGV);
    }   /* else a sent SIGSEGV the program ignores */
}

/* 1 when the caller is the process whose handler this library keeps (not a vfork child) */
static int own_process(void) { return hiding && getpid() == owner; }

static void after_fork(void) { owner = getpid(); }

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (sig != SIGSEGV || !own_process()) return real_sigaction()(sig, act, old);
    if (old) *old = program_handler;
    if (act) program_handler = *act;
    return 0;
}

/* signal() as glibc's (BSD semantics), through the sigaction wrapper above */
sighandler_t signal(int sig, sighandler_t handler) {
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    sigaddset(&act.sa_mask, sig);
    act.sa_flags = SA_RESTART;
    if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
    return old.sa_flags & SA_SIGINFO ? SIG_DFL : old.sa_handler;
}

__attribute__((constructor)) static void hide_avx512(void) {
    struct sigaction mine;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = on_segv;
    mine.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    if (real_sigaction()(SIGSEGV, &mine, &program_handler) != 0) return;
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {   /* no CPUID faulting here */
        real_sigaction()(SIGSEGV, &program_handler, NULL);
        return;
    }
    owner = getpid();
    pthread_atfork(NULL, NULL, after_fork);
    hiding = 1;
}
