//! The calling thread's CPU time, shared by the benchmarks that time a call in CPU
//! nanoseconds (a busy, shared machine's wall time says little about one call).

/// CPU nanoseconds this thread has run.
pub fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `now` is.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}
