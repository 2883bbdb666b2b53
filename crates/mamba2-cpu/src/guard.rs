//! Third-party decoders (Burn's record loader, the Parquet reader) assert on some malformed
//! input instead of returning an error. Files come from anyone, so their calls run under
//! [`catch_panic`]: a panic becomes an error message and prints nothing.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`; a panic inside it (on this thread) is returned as `Err` with its message instead
/// of unwinding, and its report is not printed. Panics elsewhere are reported as before.
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let out = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    out.map_err(|e| e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    /// A panic is an error carrying its message, the value passes through otherwise, and the
    /// guard can be nested.
    #[test]
    fn a_panic_becomes_its_message() {
        assert_eq!(super::catch_panic(|| 3), Ok(3));
        assert_eq!(super::catch_panic(|| -> u8 { panic!("bad id {}", 7) }), Err("bad id 7".to_string()));
        assert_eq!(super::catch_panic(|| super::catch_panic(|| -> u8 { panic!("inner") })), Ok(Err("inner".to_string())));
    }
}
