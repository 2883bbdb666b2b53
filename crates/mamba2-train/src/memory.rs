//! Process-wide allocator settings, for binaries that train or run long forwards.

/// Asks glibc's `malloc` to serve buffers of up to 32 MiB from its heap and to keep freed memory
/// for reuse, instead of mapping fresh pages for every large buffer and unmapping them on free.
///
/// A train step allocates the same large buffers every step (activations, saved values,
/// gradients). With glibc's defaults each buffer above a few MiB is a fresh `mmap`, and each of
/// its 4 KiB pages then faults on first touch: on the medium benchmark config that was about
/// 50,000 faults and 15-20 % of a step (see `docs/benchmarks.md`). The price is that the process
/// keeps its peak heap mapped between steps.
///
/// It changes the whole process, so call it once, early, from a binary (the `mamba2` command
/// and the speed benchmark do); a library should leave the choice to its user. Returns whether
/// the settings were applied: `false` where the C library is not glibc, and nothing changes.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes malloc's tuning parameters; each call is checked.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
                && libc::mallopt(libc::M_TOP_PAD, 64 << 20) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    /// The settings are accepted where glibc is the C library (mallopt returns 0 for a value it
    /// rejects, such as a threshold above its maximum).
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_settings() {
        assert!(super::keep_freed_memory());
        let big = vec![1u8; 20 << 20];
        assert_eq!(big.iter().map(|&v| v as usize).sum::<usize>(), 20 << 20);
    }
}
