//! The integration tests of this crate, built as one binary with one module per file: each
//! test binary compiles and links Burn's backends anew, and one binary per file made the
//! workspace's tests take most of CI's time to build. Run one file's tests by its module
//! name: `cargo test -p mamba2-train --test integration parallel::`.

mod common;
#[cfg(feature = "wgpu")]
mod devices;
mod forecast;
mod parallel;
