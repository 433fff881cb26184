//! How a gaffer process runs: its allocator tuning and its async runtime. `gaffer serve` and
//! the in-process benches take both from here, so a bench measures what a server does.

/// Keeps glibc from handing memory back to the kernel after every large reply (its defaults trim
/// the heap once 128 KiB at its top are free, so a 160 KiB reply cost three `brk` calls and
/// ~40 page faults on each request): free memory up to 1 MiB stays for the next reply.
/// Allocations above 1 MiB are still mapped and unmapped on their own. Call it first thing in
/// `main`, before any other thread runs.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers; the caller runs it before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP_FREE_BYTES);
        libc::mallopt(libc::M_MMAP_THRESHOLD, KEEP_FREE_BYTES);
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
const KEEP_FREE_BYTES: libc::c_int = 1 << 20;

/// The runtime a server runs on: one thread for every task (the store's writer and tailer
/// have their own), with I/O and timers, writing the commits its tasks queue itself whenever
/// it would park (see [`crate::workspace::write_queued_commits`]).
pub fn builder() -> tokio::runtime::Builder {
    let mut b = tokio::runtime::Builder::new_current_thread();
    b.enable_all()
        .on_thread_park(crate::workspace::write_queued_commits);
    b
}
