//! The `mamba2` command's integration tests, built as one binary with one module per file (each
//! test binary links Burn's backends anew). Run one file's tests by its module name:
//! `cargo test -p mamba2 --test command cli::`.

mod cli;
mod cluster;
#[path = "../../mamba2-train/tests/common.rs"]
mod common;
mod fuzz;

use std::alloc::{GlobalAlloc, Layout, System};

/// No test here asks for a gigabyte in one piece; a request that large is refused (the
/// process aborts with "memory allocation of N bytes failed"), so a size read from a fuzzed
/// file that reaches an allocation unchecked fails the run instead of paging for minutes.
struct Capped;

const CAP: usize = 1 << 30;

// SAFETY: every call is passed on to the system allocator unchanged, or refused with null as
// the trait allows.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Capped = Capped;
