//! A second thread for [`crate::StreamingStack`]'s matrix-vector products.
//!
//! One streaming step reads every weight once, ~1.7 MB at the streaming size, which is
//! about one core's whole L2 cache: from one core the step is bound by memory. Splitting each
//! product's column panels between two threads, always the same way, lets each core keep its half
//! of the weights in its own L2. A step is tens of microseconds, so the helper waits for work by
//! spinning (a thread pool's sleep and wake-up would cost about as much as the work); after
//! [`SPIN`] without work it parks, and the next job wakes it.
//!
//! The caller hands the helper raw pointers into its own buffers and waits for the helper to
//! finish before it returns, so the borrows the pointers come from outlive every use.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::float::HostFloat;

/// How long the helper spins without work before it parks.
const SPIN: Duration = Duration::from_millis(2);

/// One product's share: `out = x W` over the panels given, as raw parts. The panels' element
/// type (`T` or bf16) is erased; `run` is the product for that type.
#[derive(Clone, Copy)]
struct Job<T> {
    x: *const T,
    x_len: usize,
    panels: *const u8,
    panels_len: usize,
    out: *mut T,
    out_len: usize,
    run: unsafe fn(&Job<T>),
}

/// The product a job describes, with panels of `E`.
///
/// # Safety
/// The job's pointers are valid as [`Job`] states, `panels` points at `panels_len` values of `E`,
/// and the CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
unsafe fn run<T: HostFloat, E: crate::avx512::PanelWeight<T>>(job: &Job<T>) {
    // SAFETY: as the caller promises.
    unsafe {
        let x = std::slice::from_raw_parts(job.x, job.x_len);
        let panels = std::slice::from_raw_parts(job.panels.cast::<E>(), job.panels_len);
        let out = std::slice::from_raw_parts_mut(job.out, job.out_len);
        crate::avx512::matvec_panels(x, panels, out);
    }
}

// SAFETY: a job's pointers are only dereferenced while the thread that posted it waits in
// `Helper::matvec` for it to finish; the slices they come from are not touched by anyone else
// meanwhile (the caller works on a disjoint part of `out`).
unsafe impl<T: Send> Send for Job<T> {}

struct Shared<T> {
    job: Mutex<Option<Job<T>>>,
    /// Jobs posted so far, and jobs finished so far.
    posted: AtomicUsize,
    finished: AtomicUsize,
    parked: AtomicBool,
    stop: AtomicBool,
}

/// The helper thread; dropping it stops the thread.
pub(crate) struct Helper<T: HostFloat> {
    shared: Arc<Shared<T>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: HostFloat> std::fmt::Debug for Helper<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Helper").field("jobs", &self.shared.posted.load(Ordering::Relaxed)).finish()
    }
}

impl<T: HostFloat> Helper<T> {
    /// A helper thread, or `None` where the machine has one core or no thread can be started.
    pub(crate) fn start() -> Option<Self> {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return None;
        }
        let shared = Arc::new(Shared {
            job: Mutex::new(None),
            posted: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name("mamba2-stream".into()).spawn(move || work(&theirs)).ok()?;
        Some(Self { shared, thread: Some(thread) })
    }

    /// `out = x W` for `W` packed in `panels` column panels (`avx512::pack_panels`): the helper
    /// takes the panels from `split` on, this thread the ones before.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn matvec<E: crate::avx512::PanelWeight<T>>(&self, x: &[T], panels: &[E], out: &mut [T]) {
        let pw = crate::avx512::panel_width::<T>();
        let np = out.len().div_ceil(pw);
        let split = np / 2;
        let (mine, theirs) = out.split_at_mut((split * pw).min(out.len()));
        let (my_panels, their_panels) = panels.split_at(split * x.len() * pw);
        let job = Job {
            x: x.as_ptr(),
            x_len: x.len(),
            panels: their_panels.as_ptr().cast(),
            panels_len: their_panels.len(),
            out: theirs.as_mut_ptr(),
            out_len: theirs.len(),
            run: run::<T, E>,
        };
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        let n = self.shared.posted.fetch_add(1, Ordering::SeqCst) + 1;
        if self.shared.parked.load(Ordering::SeqCst) {
            if let Some(t) = &self.thread {
                t.thread().unpark();
            }
        }
        // Waits for the helper on the way out, unwinding included: its job points into `out`.
        let finish = Finish { helper: self, job: n };
        // SAFETY: panels are only packed where the CPU has AVX-512 (the caller checked).
        unsafe { crate::avx512::matvec_panels(x, my_panels, mine) };
        drop(finish);
        assert!(self.shared.finished.load(Ordering::Acquire) >= n, "the streaming helper thread has stopped");
    }

    /// Spins until job `n` is finished, or until the helper thread is gone (which a panic on
    /// it would cause; it writes nothing after that).
    fn wait(&self, n: usize) {
        let mut spins = 0u32;
        while self.shared.finished.load(Ordering::Acquire) < n {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) && self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return;
            }
            std::hint::spin_loop();
        }
    }
}

/// Waits for a posted job when dropped.
struct Finish<'a, T: HostFloat> {
    helper: &'a Helper<T>,
    job: usize,
}

impl<T: HostFloat> Drop for Finish<'_, T> {
    fn drop(&mut self) {
        self.helper.wait(self.job);
    }
}

fn work<T: HostFloat>(shared: &Shared<T>) {
    let mut done = 0;
    loop {
        let idle_since = Instant::now();
        let mut spins = 0u32;
        while shared.posted.load(Ordering::Acquire) == done {
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && idle_since.elapsed() > SPIN {
                shared.parked.store(true, Ordering::SeqCst);
                // Posted after the flag was set: the poster saw the flag and unparks us, or we
                // see its job here. The timeout only bounds a wait on `stop`.
                if shared.posted.load(Ordering::SeqCst) == done {
                    std::thread::park_timeout(Duration::from_millis(50));
                }
                shared.parked.store(false, Ordering::SeqCst);
            } else {
                std::hint::spin_loop();
            }
        }
        let job = shared.job.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(job) = job {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: see `Job`: the poster keeps these slices alive and untouched until
            // `finished` says this job is done; the CPU check was made before packing panels.
            unsafe {
                (job.run)(&job)
            }
        }
        done += 1;
        shared.finished.store(done, Ordering::Release);
    }
}

impl<T: HostFloat> Drop for Helper<T> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
