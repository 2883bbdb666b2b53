//! The AVX-512 loops against the plain ones, directly: the scan's three steps, the sigmoid and
//! the packed matrix-vector product, in f32 and f64, over the `d_state` and width sizes the
//! vector loops take (whole vectors, several register blocks, a ragged last panel). The plain
//! loops are what every other CPU runs; the whole layer is checked against the model's tensor
//! path in `mamba2-model`'s tests.
//!
//! On a CPU without AVX-512 the vector loops never run, and these tests say so and pass.

use crate::avx512;
use crate::float::{sigmoid, HostFloat};
use crate::scan::{head_forward_plain, head_reverse_plain, head_state_gc_plain};
use crate::streaming::matvec_rows;

/// Deterministic values in about `[-1, 1]`.
fn values<T: HostFloat>(n: usize, seed: u64) -> Vec<T> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            T::from((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0).unwrap()
        })
        .collect()
}

/// The largest `|a - b| / max(1, |b|)`.
fn worst<T: HostFloat>(a: &[T], b: &[T]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(&x, &y)| ((x - y).abs() / y.abs().max(T::one())).to_f64().unwrap()).fold(0.0, f64::max)
}

fn has_avx512() -> bool {
    let yes = std::is_x86_feature_detected!("avx512f");
    if !yes {
        eprintln!("no AVX-512 on this CPU: the vector loops are not used here");
    }
    yes
}

/// `d_state` values the vector scan takes for `T`: one vector, a register block, more than one.
fn state_sizes<T: HostFloat>() -> Vec<usize> {
    [1, 2, 4, 8].iter().map(|k| k * T::W).collect()
}

fn scan_steps_agree<T: HostFloat>(tol: f64) {
    for n in state_sizes::<T>() {
        for p in [1, 3, 16] {
            let (x, b, c, gy) = (values::<T>(p, 1), values::<T>(n, 2), values::<T>(n, 3), values::<T>(p, 4));
            let (decay, dt) = (T::from(0.93).unwrap(), T::from(0.21).unwrap());
            let start = values::<T>(p * n, 5);

            // Forward: several steps from the same state, so that rounding has room to grow.
            let (mut hv, mut hp) = (start.clone(), start.clone());
            let (mut yv, mut yp) = (vec![T::zero(); p], vec![T::zero(); p]);
            for _ in 0..8 {
                // SAFETY: AVX-512 was found on this CPU (the caller checks) and n is a multiple of W.
                unsafe { avx512::head_forward(&mut hv, &x, &b, &c, decay, dt, &mut yv) };
                head_forward_plain(&mut hp, &x, &b, &c, decay, dt, &mut yp);
            }
            assert!(worst(&hv, &hp) < tol && worst(&yv, &yp) < tol, "head_forward, d_state {n}, headdim {p}");

            // The backward's forward sweep.
            let (mut hv, mut hp) = (start.clone(), start.clone());
            let (mut gcv, mut gcp) = (vec![T::zero(); n], vec![T::zero(); n]);
            // SAFETY: as above.
            let qv = unsafe { avx512::head_state_gc(&mut hv, &x, &b, &c, decay, dt, &gy, &mut gcv) };
            let qp = head_state_gc_plain(&mut hp, &x, &b, &c, decay, dt, &gy, &mut gcp);
            assert!(
                worst(&hv, &hp) < tol && worst(&gcv, &gcp) < tol && worst(&[qv], &[qp]) < tol,
                "head_state_gc, d_state {n}, headdim {p}"
            );

            // The reverse step.
            let (mut ghv, mut ghp) = (start.clone(), start.clone());
            let (mut gbv, mut gbp) = (values::<T>(n, 6), values::<T>(n, 6));
            let (mut sbv, mut sbp) = (vec![T::zero(); p], vec![T::zero(); p]);
            // SAFETY: as above.
            unsafe { avx512::head_reverse(&mut ghv, &gy, &x, &b, &c, decay, dt, &mut gbv, &mut sbv) };
            head_reverse_plain(&mut ghp, &gy, &x, &b, &c, decay, dt, &mut gbp, &mut sbp);
            assert!(
                worst(&ghv, &ghp) < tol && worst(&gbv, &gbp) < tol && worst(&sbv, &sbp) < tol,
                "head_reverse, d_state {n}, headdim {p}"
            );
        }
    }
}

#[test]
fn vector_scan_steps_equal_the_plain_loops() {
    if !has_avx512() {
        return;
    }
    scan_steps_agree::<f32>(1e-5);
    scan_steps_agree::<f64>(1e-13);
}

fn sigmoids_agree<T: HostFloat>(tol: f64) {
    let x: Vec<T> = values::<T>(1000, 7).into_iter().map(|v| v * T::from(30.0).unwrap()).collect();
    let mut out = vec![T::zero(); x.len()];
    // SAFETY: AVX-512 was found on this CPU (the caller checks).
    let done = unsafe { avx512::sigmoid_slice(&x, &mut out) };
    assert_eq!(done, x.len() / T::W * T::W);
    let plain: Vec<T> = x[..done].iter().map(|&v| sigmoid(v)).collect();
    assert!(worst(&out[..done], &plain) < tol, "sigmoid");
}

#[test]
fn vector_sigmoid_equals_the_plain_one() {
    if !has_avx512() {
        return;
    }
    sigmoids_agree::<f32>(1e-6);
    sigmoids_agree::<f64>(1e-14);
}

fn products_agree<T: HostFloat>(tol: f64) {
    let pw = avx512::panel_width::<T>();
    for (d_in, d_out) in [(1, 1), (7, pw), (64, pw + 3), (33, 5 * pw - 1), (256, 1160)] {
        let (w, x) = (values::<T>(d_in * d_out, 8), values::<T>(d_in, 9));
        let panels = avx512::pack_panels(&w, d_in, d_out);
        let (mut vector, mut plain) = (vec![T::zero(); d_out], vec![T::zero(); d_out]);
        // SAFETY: AVX-512 was found on this CPU (the caller checks); packed for these sizes.
        unsafe { avx512::matvec_panels(&x, &panels, &mut vector) };
        matvec_rows(&x, &w, &mut plain);
        assert!(worst(&vector, &plain) < tol * d_in as f64, "matvec [{d_in}, {d_out}]");
    }
}

#[test]
fn vector_product_equals_the_plain_one() {
    if !has_avx512() {
        return;
    }
    products_agree::<f32>(1e-6);
    products_agree::<f64>(1e-15);
}

/// The AVX2 sigmoid (`avx2.rs`) against the plain one.
#[cfg(target_arch = "x86_64")]
mod avx2_sigmoid {
    use crate::avx2::*;
    use crate::float::{sigmoid, HostFloat};

    /// Every lane against `1 / (1 + exp(-x))` in f64, over the whole range and past both ends
    /// (relative error from the square root of `T`'s smallest normal number up, absolute below,
    /// where the plain sigmoid in `T` gives 0 too), and the plain `T` sigmoid agrees as closely.
    fn worst<T: HostFloat>(tolerance: f64) {
        let mut x: Vec<f64> = (-4000..4000).map(|i| i as f64 * 0.0371).collect();
        x.extend([-800.0, -750.0, -709.0, -120.0, -103.9, -88.0, -87.5, 0.0, 87.5, 88.0, 103.9, 120.0, 709.0, 750.0, 800.0, 1e30, -1e30]);
        while !x.len().is_multiple_of(8) {
            x.push(0.5);
        }
        let xt: Vec<T> = x.iter().map(|&v| T::from(v).unwrap()).collect();
        let mut out = vec![T::zero(); xt.len()];
        // SAFETY: only called after the CPU check below.
        let done = unsafe { sigmoid_slice(&xt, &mut out) };
        assert_eq!(done, xt.len());
        let floor = T::min_positive_value().sqrt().to_f64().unwrap();
        for (i, (&xv, &got)) in xt.iter().zip(&out).enumerate() {
            let want = 1.0 / (1.0 + (-xv.to_f64().unwrap()).exp());
            let err = |v: T| (v.to_f64().unwrap() - want).abs() / want.max(floor);
            assert!(err(got) <= tolerance, "x[{i}] = {}: sigmoid {:?}, want {want}", x[i], got.to_f64());
            assert!(err(sigmoid(xv)) <= tolerance, "x[{i}] = {}: the plain sigmoid is off too", x[i]);
        }
    }

    #[test]
    fn avx2_sigmoid_is_accurate_over_the_whole_range() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            eprintln!("no AVX2 and FMA on this CPU: the AVX2 sigmoid is not used here");
            return;
        }
        worst::<f32>(5e-7);
        worst::<f64>(1e-14);
    }
}
