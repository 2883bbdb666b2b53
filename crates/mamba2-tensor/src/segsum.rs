use burn::prelude::*;

/// Stable segment sums: `out[m, i, j] = x[m, j+1] + ... + x[m, i]` for `i >= j`, `-inf` above
/// the diagonal.
///
/// `exp(segsum(a))` is the decay matrix of a linear recurrence with log-decays `a`: the factor by
/// which a value written at step `j` has shrunk when it is read at step `i`.
///
/// Each entry is a masked cumulative sum that adds exactly the terms between `j` and `i`. The
/// shortcut `cumsum(x)[i] - cumsum(x)[j]` subtracts two long prefix sums and loses precision
/// when they are large (strong decay over long chunks). The upper triangle is filled with `-inf`
/// by selection, before any `exp`, so that no `inf * 0` can arise in the forward or the backward.
///
/// # Shapes
/// - `x`: `[m, t]`
/// - output: `[m, t, t]`
pub fn segsum<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 3> {
    let [m, t] = x.dims();
    let device = x.device();
    // x_rep[m, i, j] = x[m, i]
    let x_rep = x.unsqueeze_dim::<3>(2).expand([m, t, t]);
    // Keep x[i] only where i > j: then a cumulative sum down i adds x[j+1..=i].
    let keep_strict_lower = Tensor::<B, 2, Bool>::tril_mask([t, t], -1, &device).unsqueeze_dim::<3>(0).expand([m, t, t]);
    let summed = x_rep.mask_fill(keep_strict_lower, 0.0).cumsum(1);
    let upper = Tensor::<B, 2, Bool>::tril_mask([t, t], 0, &device).unsqueeze_dim::<3>(0).expand([m, t, t]);
    summed.mask_fill(upper, f64::NEG_INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{to_vec, TestBackend};

    #[test]
    fn segsum_matches_hand_computed_values() {
        let device = Default::default();
        let x = Tensor::<TestBackend, 2>::from_data([[1.0, 2.0, 3.0, 4.0]], &device);
        let out = to_vec(segsum(x));
        let ninf = f64::NEG_INFINITY;
        #[rustfmt::skip]
        let expected = [
            0.0, ninf, ninf, ninf,
            2.0, 0.0, ninf, ninf,
            5.0, 3.0, 0.0, ninf,
            9.0, 7.0, 4.0, 0.0,
        ];
        assert_eq!(out, expected);
    }

    #[test]
    fn segsum_is_exact_where_prefix_differences_are_not() {
        // A large first term makes cumsum differences lose the small later terms in f64 too:
        // (1e17 + 1 + 1) - (1e17 + 1) is 0 in f64, the masked sum keeps the 1.
        let device = Default::default();
        let x = Tensor::<TestBackend, 2>::from_data([[1e17, 1.0, 1.0]], &device);
        let out = to_vec(segsum(x));
        assert_eq!(out[2 * 3 + 1], 1.0, "segsum[2, 1] must be exactly x[2]");
    }
}
