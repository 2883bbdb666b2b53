//! The float types the kernels run in (`f32`, `f64`), the run-time choice of instruction set
//! for the hot loops (`multiversion!`), and the reductions and activations every pass shares.

use num_traits::Float;

/// The float types the CPU paths run in: `f32` and `f64`.
pub trait HostFloat: Float + Send + Sync + std::iter::Sum + std::fmt::Debug + bytemuck::Pod + crate::avx512::Lanes + 'static {}

impl HostFloat for f32 {}

impl HostFloat for f64 {}

// The loops below are where a step spends its time. Each has a plain body and, on x86-64, copies
// compiled for AVX2 and AVX-512, chosen once per call by run-time detection: the default target
// only guarantees SSE2, which would leave three quarters of each vector unit idle.

macro_rules! multiversion {
    ($(#[$doc:meta])* fn $name:ident<$t:ident>($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name<$t: HostFloat>($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body<$t: HostFloat>($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512<$t: HostFloat>($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                fn avx2<$t: HostFloat>($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                if std::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has just been found to support the enabled features.
                    return unsafe { avx512($($arg),*) };
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

pub(crate) use multiversion;

/// Vector lanes for the reductions over `d_state`: partial sums kept per lane, so that the loops
/// vectorise without reassociating a single running sum (which the compiler may not do).
pub(crate) const LANES: usize = 16;

/// The sum of the lanes, as a tree: four vector additions rather than fifteen dependent scalar
/// ones.
#[inline(always)]
pub(crate) fn reduce<T: HostFloat>(mut acc: [T; LANES]) -> T {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] = acc[l] + acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `h = decay h + xdt b` in place, returning `h . c`, in [`LANES`] partial sums.
#[inline(always)]
pub(crate) fn update_dot<T: HostFloat>(h: &mut [T], b: &[T], c: &[T], decay: T, xdt: T) -> T {
    let (hv, hr) = h.as_chunks_mut::<LANES>();
    let (bv, br) = b.as_chunks::<LANES>();
    let (cv, cr) = c.as_chunks::<LANES>();
    let mut acc = [T::zero(); LANES];
    for ((hc, bc), cc) in hv.iter_mut().zip(bv).zip(cv) {
        for l in 0..LANES {
            let v = decay * hc[l] + xdt * bc[l];
            hc[l] = v;
            acc[l] = acc[l] + v * cc[l];
        }
    }
    let mut total = reduce(acc);
    for ((hs, &bs), &cs) in hr.iter_mut().zip(br).zip(cr) {
        *hs = decay * *hs + xdt * bs;
        total = total + *hs * cs;
    }
    total
}

/// `a . b` in [`LANES`] partial sums.
#[inline(always)]
pub(crate) fn dot<T: HostFloat>(a: &[T], b: &[T]) -> T {
    let (av, ar) = a.as_chunks::<LANES>();
    let (bv, br) = b.as_chunks::<LANES>();
    let mut acc = [T::zero(); LANES];
    for (ac, bc) in av.iter().zip(bv) {
        for l in 0..LANES {
            acc[l] = acc[l] + ac[l] * bc[l];
        }
    }
    let mut total = reduce(acc);
    for (&x, &y) in ar.iter().zip(br) {
        total = total + x * y;
    }
    total
}

/// `sum a b c` in [`LANES`] partial sums.
#[inline(always)]
pub(crate) fn dot3<T: HostFloat>(a: &[T], b: &[T], c: &[T]) -> T {
    let (av, ar) = a.as_chunks::<LANES>();
    let (bv, br) = b.as_chunks::<LANES>();
    let (cv, cr) = c.as_chunks::<LANES>();
    let mut acc = [T::zero(); LANES];
    for ((ac, bc), cc) in av.iter().zip(bv).zip(cv) {
        for l in 0..LANES {
            acc[l] = acc[l] + ac[l] * bc[l] * cc[l];
        }
    }
    let mut total = reduce(acc);
    for ((&x, &y), &z) in ar.iter().zip(br).zip(cr) {
        total = total + x * y * z;
    }
    total
}

pub(crate) fn c<T: HostFloat>(v: f64) -> T {
    T::from(v).expect("finite constant")
}

pub(crate) fn sigmoid<T: HostFloat>(v: T) -> T {
    T::one() / (T::one() + (-v).exp())
}

/// `out[i] = sigmoid(x[i])`, with vector instructions where the CPU has them.
pub(crate) fn sigmoid_into<T: HostFloat>(x: &[T], out: &mut [T]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has just been found to support AVX-512F.
        done = unsafe { crate::avx512::sigmoid_slice(x, out) };
    } else if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has just been found to support AVX2 and FMA.
        done = unsafe { crate::avx2::sigmoid_slice(x, out) };
    }
    for (o, &v) in out[done..].iter_mut().zip(&x[done..]) {
        *o = sigmoid(v);
    }
}
